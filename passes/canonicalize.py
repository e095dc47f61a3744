"""fold-slices, and the canonicalization patterns the passes share: local folds of slices,
concatenates and reshapes, run by MLIR's greedy pattern driver (`_mlir_compat.apply_patterns`), so
that no pass writes its own.

Patterns (each replaces an op by a value of the op's own type):

* `join_slices`: in a ``concatenate`` along dimension 0, consecutive operands that are slices of
  consecutive whole rows of one tensor ``x`` (``x[a:b]``, ``x[b:c]``, each possibly reshaped; the
  rows of a 1-D ``x`` are its elements) become one operand, ``reshape(x[a:c])`` (``x`` itself where
  that is all of it); each other run of such slices, one slice long, is rebuilt alike (a chain of
  reshapes collapses). What a state packed into buffers is made of after a pass cut it into pieces
  (pack-state's split buffers, roll-layers' rolled leaves). Exact: a concatenate along dimension 0
  appends its operands' elements in row-major order, whole rows of ``x`` are a contiguous range of
  its row-major elements, and a reshape keeps that order: the run's elements are ``x[a:c]``'s, in order.
* `same_type` (on ``slice``): a slice whose result has its operand's type is all of it, the operand:
  an axis of n >= 2 elements with n in range has start 0 and stride 1; with one element, start 0.
* `single_concatenate`: a ``concatenate`` of one operand -> the operand.
* `reshape_of_reshape`: ``reshape(reshape(x))`` -> ``reshape(x)``; `same_type` (on ``reshape``): a
  reshape to its operand's type -> the operand. A reshape keeps the row-major element order, so
  only the final shape matters. (The simplify pass runs these; the slice patterns leave reshapes alone.)

Where they stop: statically shaped tensors only; a concatenate along another dimension and strided
slices are left as they are; a value is only replaced by one of the same type.

`fold_slices` runs the slice patterns under an op without folding anything else (no op folder, no
constant moved: the IR around them stays as it is), and erases the ops they leave dead; the
``fold-slices`` pass runs it on the module.
"""
from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import rewriter as rw
from ._mlir_compat import apply_patterns
from .matchers import producer, sliced_rows
from .module_pass import ModulePass

NO_MATCH = True  # pattern callbacks return a falsy value iff they rewrote


def static(op) -> bool:
    """Whether every operand and result of `op` is a statically shaped ranked tensor."""
    return all(isinstance(v.type, ir.RankedTensorType) and v.type.has_static_shape
               for v in [*op.operands, *op.results])


def forward(rewriter, op, value: ir.Value):
    """Replace `op` by `value` if that keeps the result type."""
    if value.type != op.result.type:
        return NO_MATCH
    rewriter.replace_op(op, [value])
    return None


def same_type(op, rewriter):
    """An op of one operand whose result has the operand's type -> the operand (reshape, slice;
    simplify's convert)."""
    if not static(op):
        return NO_MATCH
    return forward(rewriter, op, op.operands[0])


def fold_into_producer(op, rewriter, build):
    """op(producer(x)) -> build(producer): one op of the same kind straight on x."""
    inner = producer(op.operands[0], type(op))
    if inner is None or not static(op) or not static(inner):
        return NO_MATCH
    with ir.InsertionPoint(op), op.location:
        new = build(inner.opview)
    rewriter.replace_op(op, [new.result])
    return None


def reshape_of_reshape(op, rewriter):
    """reshape(reshape(x)) -> reshape(x)."""
    return fold_into_producer(op, rewriter, lambda inner: stablehlo.ReshapeOp(op.result.type, inner.operand))


def single_concatenate(op, rewriter):
    """concatenate(x) -> x."""
    if len(op.operands) != 1:
        return NO_MATCH
    return forward(rewriter, op, op.operands[0])


@dataclass
class _Run:
    """Consecutive operands of a concatenate: slices of rows first .. last - 1 of `source`, or one other operand."""

    source: ir.Value | None
    first: int = 0
    last: int = 0
    operands: list = field(default_factory=list)


def join_slices(op: stablehlo.ConcatenateOp, rewriter) -> bool | None:
    """concatenate(.., x[a:b], x[b:c], ..) along dimension 0 (whole rows, reshaped or not) ->
    concatenate(.., reshape(x[a:c]), ..)."""
    if ir.IntegerAttr(op.attributes["dimension"]).value != 0 or not static(op):
        return NO_MATCH
    runs: list[_Run] = []
    for v in op.operands:
        s = sliced_rows(v)
        if s is not None and runs and runs[-1].source is not None and (runs[-1].source, runs[-1].last) == s[:2]:
            runs[-1].last = s[2]
        elif s is not None:
            runs.append(_Run(*s))
        else:
            runs.append(_Run(None))
        runs[-1].operands.append(v)
    if len(runs) == len(op.operands):
        return NO_MATCH
    rest = list(ir.RankedTensorType(op.result.type).shape[1:])
    with ir.InsertionPoint(op), op.location:
        parts = [run.operands[0] if run.source is None else
                 rw.reshape(rw.static_rows(run.source, run.first, run.last),
                            [sum(ir.RankedTensorType(v.type).shape[0] for v in run.operands), *rest])
                 for run in runs]
        joined = rw.concat(parts)
    rewriter.replace_op(op, [joined])
    return None


SLICE_PATTERNS = [
    (stablehlo.ConcatenateOp, join_slices),
    (stablehlo.ConcatenateOp, single_concatenate),
    (stablehlo.SliceOp, same_type),
]
RESHAPE_PATTERNS = [
    (stablehlo.ReshapeOp, reshape_of_reshape),
    (stablehlo.ReshapeOp, same_type),
]


def fold_slices(op: ir.Operation) -> None:
    """Apply the slice patterns (`SLICE_PATTERNS`) to the ops nested in `op` until none applies,
    erasing the ops left dead; nothing else is folded or moved.

    Examples:
        >>> from loopfuse.compile.mlir_context import parse_module
        >>> m = parse_module('''
        ... func.func @main(%x: tensor<4x3xf32>) -> tensor<12xf32> {
        ...   %0 = stablehlo.slice %x [0:1, 0:3] : (tensor<4x3xf32>) -> tensor<1x3xf32>
        ...   %1 = stablehlo.reshape %0 : (tensor<1x3xf32>) -> tensor<3xf32>
        ...   %2 = stablehlo.slice %x [1:4, 0:3] : (tensor<4x3xf32>) -> tensor<3x3xf32>
        ...   %3 = stablehlo.reshape %2 : (tensor<3x3xf32>) -> tensor<9xf32>
        ...   %4 = stablehlo.concatenate %1, %3, dim = 0 : (tensor<3xf32>, tensor<9xf32>) -> tensor<12xf32>
        ...   return %4 : tensor<12xf32>
        ... }''')
        >>> fold_slices(m.operation)
        >>> print(m.body.operations[0].regions[0].blocks[0].operations[0])
        %0 = stablehlo.reshape %arg0 : (tensor<4x3xf32>) -> tensor<12xf32>
    """
    apply_patterns(op, SLICE_PATTERNS, folding=False)


@dataclass(frozen=True)
class FoldSlices(ModulePass):
    name = "fold-slices"
    summary = "Join concatenated slices of consecutive rows of one tensor; fold whole slices and one-operand concatenates"

    def apply(self, module_op: ir.Operation) -> None:
        fold_slices(module_op)
