"""pack-state{max-leaf-elements=4096 min-group=2 flatten=false}: carry the small state leaves of
wrap-loop's loop as flat buffers, one per element type (with ``flatten=true``, and per role).

Rewrites: wrap-loop's ``stablehlo.while`` in ``@main`` carries every state leaf (the arguments
tagged ``loopfuse.state``) as its own value into ``@loopfuse_step``. The statically shaped tensor
leaves of at most ``max-leaf-elements`` elements without a sharding attribute are grouped by element
type; a group of at least ``min-group`` leaves is carried as one 1-D buffer instead: the leaves are
reshaped to 1-D and concatenated once before the loop, ``@loopfuse_step`` takes the buffer and reads
each leaf as a slice of it (reshaped back), and returns the concatenation of the leaves' new values,
and the loop's results are sliced out once after it. The buffers come after the other values in the
loop's carry and in the step's arguments and results, in the order their element types first occur;
inside a buffer the leaves keep their argument order. With ``flatten=true`` flatten-update's grouping
then runs on the step (`flatten_update.Flattener`), knowing the leaves as slices of the buffers, on
the update chains into the step's return only (`flatten_update.feeding`), and only of at most
``max-leaf-elements`` elements (a large leaf's update stays its own, reading and writing the leaf
in place: concatenating the alike updates of a model's attention weights copied them all every
step): an elementwise update alike over many packed leaves (the moments, the parameter step) is
computed once over the buffer, and the buffer the step returns is built from those flat results,
while the forward pass (whose elementwise ops feed reductions and products) stays per leaf,
reading slices of the buffer. And a
leaf read only by such chains (an optimizer's moment) goes into a buffer of its own per chain
(`_update_only`), apart from the parameters. This is the structure of a hand-written
``ravel_pytree`` step: per-leaf forward and gradient kernels, the gradient concatenated once, one
flat kernel per moment written in place, one for the parameters. Where a leaf's gradient is
elementwise in the leaf (a per-leaf loss such as ``mean((p - t) ** 2)``, a penalty), the update
chain gets its own copy of what it reads from the forward pass (`Flattener.recompute`), so that the
gradient too is computed once over the buffer and no per-leaf gradient kernel is left. The step's
expression trees are found once, before packing, which only replaces their leaves by slices.

A state the caller keeps packed (``loopfuse.pack``), with ``flatten=true``: a carried 1-D state
buffer that the step reads only through slices of the pieces of the concatenation it returns for
it is first carried as those pieces (`_split`: each shaped as the value the step returns for it, the slices and their
reshapes replaced by the piece), so the grouping above applies to them as to leaves; before the
loop the groups are slices of the buffer, after it the buffer is their concatenation, consecutive
slices merged (`canonicalize.fold_slices`): a group that is a whole buffer (`pack` gives the parameters and
each moment buffers of their own) enters the loop as it is. Without ``flatten``, whose groups are
per element type only, a packed buffer is carried as it is. A concatenate of more than 16 pieces is
built as a tree of concatenates of at most 16 (`_concat.split_wide_concatenates`, as
``jnp.concatenate`` builds it), which XLA compiles faster.

Why it is safe: reshape (row major), concatenate and slice only move elements, and every slice
reads back exactly the elements the concatenation put there, so the step sees the same values as
before, iteration for iteration, and the loop returns the same state. A split buffer's pieces are
the exact ranges its slices read and its concatenation writes, and consecutive slices of one
value, concatenated, are the slice of their union. No arithmetic is added or
changed; flatten-update says why its rewrite computes the same bits. Larger leaves (matmul weights)
stay separate so that the step reads them in place.

Runs after wrap-loop (pipeline.build places it there: ``after_wrap_loop``); without wrap-loop's loop
(a single step) it changes nothing.

Opt-in: exact on StableHLO (the reference interpreter), but XLA fuses the packed loop to other last
bits in some programs (clipped Adam, an RNN; with jaxlib 0.11+ also Lion and RMSProp; with
``flatten=true`` also Adam, ``inject_hyperparams`` and the corpus transformer), within 1e-5 relative
(tests/py/test_pack_state.py). Speed (BENCHMARKS.md, "Packed state through the device loop"): with
``flatten=true`` the loop body is the hand-written ``ravel_pytree`` step's, kernel for kernel, and
about as fast per step; on an unpacked state each call still unpacks every leaf once (a slice
kernel per leaf) and passes the state leaf by leaf, which a state packed by the caller does not pay.
"""
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from . import rewriter as rw
from ._concat import split_wide_concatenates
from .canonicalize import fold_slices
from .dead_code import erase_dead_ops
from .functions import arg_attrs, callee, last_op, main_func, retype
from .control_flow import is_wrap_loop
from .flatten_update import Flattener, feeding, trees_of
from .matchers import producer, rows, sliced_rows
from .module_pass import ModulePass, option
from .vocabulary import BODY, SHARDINGS, STATE


@dataclass(frozen=True)
class PackState(ModulePass):
    """Examples:
        >>> from loopfuse.compile.pass_manager import parse_pipeline
        >>> parse_pipeline("pack-state{max-leaf-elements=64 flatten=true}")
        [PackState(max_leaf_elements=64, min_group=2, flatten=True)]
    """

    name = "pack-state"
    summary = "Carry the small state leaves of wrap-loop's loop as one flat buffer per element type"
    after_wrap_loop: ClassVar[bool] = True

    max_leaf_elements: int = option(4096, "pack state leaves of at most this many elements", minimum=1)
    min_group: int = option(2, "pack an element type's leaves (flatten alike updates) only when there are "
                               "at least this many", minimum=2)
    flatten: bool = option(False, "compute elementwise updates alike over packed leaves once, on the buffer")

    def apply(self, module_op: ir.Operation) -> None:
        main = main_func(module_op)
        loops = [op.operation for op in main.body.blocks[0].operations if is_wrap_loop(op.operation)]
        if not loops:
            return
        loop = _StepLoop.of(loops[0])
        if self.flatten:
            loop = _split(main, loop)
        trees = list(trees_of(loop.entry)) if self.flatten else []  # found once: packing keeps them
        groups = self._groups(main, loop, trees)
        if groups:
            flattener = _pack(loop, groups)
            if self.flatten:
                flattener.flatten(self.min_group, last_op(flattener.block), trees, self.max_leaf_elements)
            flattener.finish()
            split_wide_concatenates(flattener.block)
        fold_slices(main.operation)
        split_wide_concatenates(main.body.blocks[0])

    def _groups(self, main: func.FuncOp, loop: "_StepLoop", trees: list) -> list[list[int]]:
        """Groups of the loop's carry positions to pack (the state arguments and the pieces of split
        buffers), one per element type (with `flatten`, per element type and `_update_only` role,
        from the step's `trees`), in first-occurrence order."""
        update_only = _update_only(loop, trees) if self.flatten else {}
        by_type: dict[tuple, list[int]] = {}
        attrs = arg_attrs(main)
        for k, v in enumerate(loop.op.operands):   # the counter is no state argument
            i, t = _state_arg(main, v), v.type
            if (i is None or STATE not in attrs[i] or any(s in attrs[i] for s in SHARDINGS)
                    or not isinstance(t, ir.RankedTensorType) or not t.has_static_shape
                    or not 0 < math.prod(t.shape) <= self.max_leaf_elements):
                continue
            by_type.setdefault((str(t.element_type), update_only.get(k)), []).append(k)
        return [g for g in by_type.values() if len(g) >= self.min_group]


class _StepPacker(Flattener):
    """The step function's side: its packed arguments are slices of flat arguments, and `finish`
    makes it return the flat buffers of its packed results."""

    def __init__(self, step: func.FuncOp, results: list[list[int]]):
        super().__init__(step.body.blocks[0])
        self.step, self.results = step, results

    def finish(self) -> None:
        ret = last_op(self.block)
        packed = {j for g in self.results for j in g}
        with ir.InsertionPoint(ret), ret.location:
            flats = [self.flat([ret.operands[j] for j in g], [_size(ret.operands[j]) for j in g], ret)
                     for g in self.results]
        rw.returning(ret, [v for j, v in enumerate(ret.operands) if j not in packed] + flats)
        retype(self.step)
        self.erase_unused()


@dataclass(frozen=True)
class _StepLoop:
    """Wrap-loop's loop and what the rewrites read of it, looked up once: its blocks (which stay
    the same blocks when a `rw.Recarry` moves them), the body's call of the step and the step."""

    op: ir.Operation      # the stablehlo.while
    cond: ir.Block
    body: ir.Block
    call: func.CallOp
    step: func.FuncOp

    @classmethod
    def of(cls, loop: ir.Operation) -> "_StepLoop":
        body = loop.regions[1].blocks[0]
        call = next(op for op in body.operations if isinstance(op, func.CallOp) and op.callee.value == BODY)
        return cls(loop, loop.regions[0].blocks[0], body, call, callee(call))

    @property
    def entry(self) -> ir.Block:
        """The step's entry block."""
        return self.step.body.blocks[0]

    def operands(self) -> dict[int, int]:
        """Carry position -> the step call's operand index, for the carried values the call takes as they are."""
        return {ir.BlockArgument(v).arg_number: m for m, v in enumerate(self.call.operands)
                if isinstance(v, ir.BlockArgument) and v.owner == self.body}

    def recall(self, dropped_operands: set, dropped_results: set, added: Sequence[ir.Value]) -> rw.Rebuilt:
        """The body's call of the step without the operands and results at the positions dropped, and
        with `added` as further operands and the values of their types as further results."""
        return rw.recall(self.call, [m for m in range(len(self.call.operands)) if m not in dropped_operands], added,
                         [j for j in range(len(self.call.results)) if j not in dropped_results], [v.type for v in added])


def _update_only(s: _StepLoop, trees: list) -> dict[int, tuple]:
    """The carry positions whose step argument is read only by update chains into the step's return
    (`flatten_update.feeding`): an optimizer's moments, not the parameters, which the forward pass
    reads too; each with the signature and scalars of the chain that reads it. Each kind of moment
    gets a buffer of its own, so that its flat update writes it in place and the parameters' update
    reads that result: in one buffer with the parameters (or with each other) XLA recomputes the
    moments in the parameters' update from the old buffer, and copies the whole buffer every step
    to keep it."""
    tree_of = {op: tree for tree in feeding(trees, last_op(s.entry)) for op in tree.nodes}
    roles = {}
    for k, m in s.operands().items():
        users = [u.owner.operation for u in s.entry.arguments[m].uses]
        if users and all(op in tree_of for op in users):
            tree = tree_of[users[0]]
            roles[k] = tree.signature, tuple(tree.scalars)
    return roles


def _state_arg(main: func.FuncOp, value: ir.Value) -> int | None:
    """The argument of `main` that `value` is, or is a (reshaped) slice of (a piece of a split buffer)."""
    source = sliced_rows(value)
    value = value if source is None else source[0]
    entry = main.body.blocks[0]
    return ir.BlockArgument(value).arg_number if isinstance(value, ir.BlockArgument) and value.owner == entry else None


def _pack(s: _StepLoop, groups: list[list[int]]) -> _StepPacker:
    """Rewrite the loop and its step for `groups`; returns the step's packer, to finish."""
    loop = s.op
    with ir.InsertionPoint(loop), loop.location:
        flats = [rw.flat_concat([loop.operands[k] for k in g]) for g in groups]
    packed = {k for g in groups for k in g}
    new = rw.Recarry(loop, [k for k in range(len(loop.operands)) if k not in packed], flats)
    with ir.InsertionPoint(new.cond.operations[0]), loop.location:
        _unpack(new.added_args(new.cond), groups, new.old_args(new.cond))
    packer = _pack_step(s, new, groups)
    with ir.InsertionPoint.after(new.op), loop.location:
        _unpack(new.added_results, groups, list(loop.results))
    new.finish()
    return packer


def _pack_step(s: _StepLoop, new: rw.Recarry, groups: list[list[int]]) -> _StepPacker:
    """Make the body's call of the step take and return the flat buffers (`new`'s added values)."""
    ret = last_op(s.body)
    operand_of = s.operands()
    for g in groups:
        for k in g:
            assert k in operand_of, "the step takes carried value k as it is"
            assert ret.operands[k].owner == s.call.operation, "the body returns the step's new value of k"
    arg_groups = [[operand_of[k] for k in g] for g in groups]
    res_groups = [[ir.OpResult(ret.operands[k]).result_number for k in g] for g in groups]
    packer = _StepPacker(s.step, res_groups)
    flats = new.added_args(s.body)
    step_flats = [s.entry.add_argument(v.type, s.step.location) for v in flats]
    with ir.InsertionPoint(s.entry.operations[0]), s.step.location:
        packer.slice_of.update(_unpack(step_flats, arg_groups, list(s.entry.arguments)))
    rw.erase_arguments(s.entry, [i for g in arg_groups for i in g])

    call = s.recall({i for g in arg_groups for i in g}, {j for g in res_groups for j in g}, flats)
    new.next(call.added_results)
    with ir.InsertionPoint.after(call.op), s.call.location:
        _unpack(call.added_results, res_groups, list(s.call.results))  # a packed result read elsewhere in the body
    call.finish()
    return packer


def _size(v: ir.Value) -> int:
    return math.prod(ir.RankedTensorType(v.type).shape)


def _unpack(flats: Sequence[ir.Value], groups: list[list[int]], olds: Sequence[ir.Value]) -> dict:
    """Replace each used `olds[k]` of a group by its slice of the group's flat value, reshaped back;
    returns {slice: (flat, offset)} (flatten-update's `slice_of`)."""
    slices = {}
    for flat, g in zip(flats, groups):
        offset = 0
        for k in g:
            old = olds[k]
            if any(True for _ in old.uses):
                piece = rw.flat_piece(flat, offset, ir.RankedTensorType(old.type))
                old.replace_all_uses_with(piece)
                slices[piece] = (flat, offset)
            offset += _size(old)
    return slices


@dataclass
class _Piece:
    """A piece of a split buffer: the value the step returns for it (in the concatenation it returns
    for the buffer), and the slices of the buffer by which the step reads it."""

    value: ir.Value
    slices: list = field(default_factory=list)

    @property
    def type(self) -> ir.RankedTensorType:
        return ir.RankedTensorType(self.value.type)


@dataclass
class _Split:
    """A carried state buffer that the step reads only by slices of its pieces and returns as the
    concatenation of them: the step call's operand and result that are the buffer, and its pieces."""

    operand: int
    result: int
    pieces: list[_Piece]

    def offsets(self) -> list[tuple[int, _Piece]]:
        """Each piece with the offset of its first element in the buffer."""
        out, offset = [], 0
        for piece in self.pieces:
            out.append((offset, piece))
            offset += math.prod(piece.type.shape)
        return out


def _split(main: func.FuncOp, s: _StepLoop) -> _StepLoop:
    """Carry each state buffer of the loop that the step reads only as slices and returns as a
    concatenation (a state packed by the caller, `loopfuse.pack`) as its pieces instead, each shaped
    as the value the step returns for it, so that grouping can pack the pieces again (per role);
    returns the loop, rewritten or not. Before the loop the pieces are slices of the buffer, after
    it the buffer is their concatenation (`canonicalize.fold_slices` then merges consecutive slices)."""
    splits = {k: split for k, m in s.operands().items() if (split := _split_of(main, s, k, m)) is not None}
    if not splits:
        return s
    loop = s.op
    with ir.InsertionPoint(loop), loop.location:
        init = [rw.flat_piece(loop.operands[k], offset, piece.type)
                for k, split in splits.items() for offset, piece in split.offsets()]
    new = rw.Recarry(loop, [k for k in range(len(loop.operands)) if k not in splits], init)
    _split_step(s, list(splits.values()))
    call = s.recall({split.operand for split in splits.values()}, {split.result for split in splits.values()},
                    new.added_args(s.body))
    new.next(call.added_results)
    call.finish()
    with ir.InsertionPoint.after(new.op), loop.location:   # after the loop: each buffer is the concatenation of its pieces
        pieces = iter(new.added_results)
        for k, split in splits.items():
            loop.results[k].replace_all_uses_with(rw.flat_concat([next(pieces) for _ in split.pieces]))
    new.finish()
    return _StepLoop.of(new.op)


def _split_step(s: _StepLoop, splits: list[_Split]) -> None:
    """Make the step take and return the pieces of the `splits` (after its other arguments and results)."""
    returned: list[ir.Value] = []
    replaced: dict[ir.Value, ir.Value] = {}   # a slice (or its reshape) of a split buffer -> what reads the piece now
    for split in splits:
        for piece in split.pieces:
            arg = s.entry.add_argument(piece.type, s.step.location)
            returned.append(piece.value)
            for sl in piece.slices:
                for use in list(sl.result.uses):
                    user = use.owner.operation
                    if isinstance(user.opview, stablehlo.ReshapeOp) and user.result.type == piece.type:
                        user.result.replace_all_uses_with(arg)
                        replaced[user.result] = arg
                with ir.InsertionPoint(sl), s.step.location:
                    flat = rw.reshape(arg, list(ir.RankedTensorType(sl.result.type).shape))
                sl.result.replace_all_uses_with(flat)
                replaced[sl.result] = flat
    ret = last_op(s.entry)
    dropped = {split.result for split in splits}     # a piece returned as it came reads the piece
    rw.returning(ret, [v for j, v in enumerate(ret.operands) if j not in dropped] + [replaced.get(v, v) for v in returned])
    erase_dead_ops(s.entry)     # the slices of the buffers and the concatenations of their pieces
    rw.erase_arguments(s.entry, [split.operand for split in splits])
    retype(s.step)


def _split_of(main: func.FuncOp, s: _StepLoop, k: int, m: int) -> _Split | None:
    """The `_Split` of carried value `k` (the step call's operand `m`), if it is one, else None."""
    t = s.op.operands[k].type
    if (_state_arg(main, s.op.operands[k]) is None or not isinstance(t, ir.RankedTensorType) or t.rank != 1
            or any(True for _ in s.cond.arguments[k].uses) or len(list(s.body.arguments[k].uses)) != 1):
        return None
    out = last_op(s.body).operands[k]
    if not (isinstance(out, ir.OpResult) and out.owner == s.call.operation) or len(list(out.uses)) != 1:
        return None
    step_out = last_op(s.entry).operands[out.result_number]
    concat = producer(step_out, stablehlo.ConcatenateOp)
    if concat is None or len(list(step_out.uses)) != 1:
        return None
    pieces = [_Piece(_unreshaped(v)) for v in _concatenated(concat)]
    if not all(isinstance(p.value.type, ir.RankedTensorType) and p.value.type.has_static_shape for p in pieces):
        return None
    split = _Split(m, out.result_number, pieces)
    at = {(offset, offset + math.prod(p.type.shape)): p for offset, p in split.offsets()}
    for use in s.entry.arguments[m].uses:
        bounds = rows(use.owner.operation)
        piece = None if bounds is None else at.get(bounds)
        if piece is None:
            return None
        piece.slices.append(use.owner.operation)
    return split


def _unreshaped(value: ir.Value) -> ir.Value:
    """The operand of `value`'s reshape, or `value`."""
    reshape = producer(value, stablehlo.ReshapeOp)
    return value if reshape is None else reshape.operands[0]


def _concatenated(concat: ir.Operation) -> list[ir.Value]:
    """The operands of a 1-D concatenation, those of nested ones in their place (jax lowers a
    concatenate of many operands as a tree of them)."""
    values = []
    for v in concat.operands:
        inner = producer(v, stablehlo.ConcatenateOp)
        if inner is not None and ir.RankedTensorType(v.type).rank == 1 and len(list(v.uses)) == 1:
            values += _concatenated(inner)
        else:
            values.append(v)
    return values
