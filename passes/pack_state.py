"""pack-state{max-leaf-elements=4096 min-group=2}: carry the small state leaves of wrap-loop's loop as
flat buffers, one per element type.

Rewrites: wrap-loop's ``stablehlo.while`` in ``@main`` carries every state leaf (the arguments
tagged ``loopfuse.state``) as its own value. The statically shaped tensor leaves of at most
``max-leaf-elements`` elements without a sharding attribute are grouped by element type; a group of
at least ``min-group`` leaves is carried as one 1-D buffer instead: the leaves are reshaped to 1-D
and concatenated once before the loop, the cond and body blocks read each leaf as a slice of the
buffer (reshaped back), the body returns the concatenation of the leaves' new values, and the loop's
results are sliced out once after it. The buffers are carried after the other loop values, in the
order their element types first occur; inside a buffer the leaves keep their argument order.

Why it is safe: reshape (row major), concatenate and slice only move elements, and every slice
reads back exactly the elements the concatenation put there, so the cond and the step see the same
values as before, iteration for iteration, and the loop returns the same state. No arithmetic is
added or changed. Larger leaves (matmul weights) stay separate so that the step reads them in place.

Runs after wrap-loop (pipeline.build places it there; ``after_wrap_loop``); without wrap-loop's loop
(a single step) it changes nothing.
"""
import math
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from ._func import arg_attrs, main_func
from .control_flow import is_wrap_loop
from .module_pass import ModulePass, option
from .vocabulary import STATE

SHARDINGS = ("sdy.sharding", "mhlo.sharding")


@dataclass(frozen=True)
class PackState(ModulePass):
    """Examples:
        >>> from loopfuse.pass_manager import parse_pipeline
        >>> parse_pipeline("pack-state{max-leaf-elements=64}")
        [PackState(max_leaf_elements=64, min_group=2)]
    """

    name = "pack-state"
    summary = "Carry the small state leaves of wrap-loop's loop as one flat buffer per element type"
    after_wrap_loop: ClassVar[bool] = True

    max_leaf_elements: int = option(4096, "pack state leaves of at most this many elements", minimum=1)
    min_group: int = option(2, "pack an element type's leaves only when there are at least this many", minimum=2)

    def apply(self, module_op: ir.Operation) -> None:
        f = main_func(module_op)
        loops = [op.operation for op in f.body.blocks[0].operations if is_wrap_loop(op.operation)]
        if not loops:
            return
        groups = self._groups(f, loops[0])
        if groups:
            _pack(loops[0], groups)

    def _groups(self, f: func.FuncOp, loop: ir.Operation) -> list[list[int]]:
        """Groups of the loop's carry positions to pack (carry position = argument index + 1, after
        the counter), one per element type, in first-occurrence order."""
        by_type: dict[str, list[int]] = {}
        args = f.body.blocks[0].arguments
        for i, attrs in enumerate(arg_attrs(f)):
            t = args[i].type
            if (STATE not in attrs or any(s in attrs for s in SHARDINGS) or not isinstance(t, ir.RankedTensorType)
                    or not t.has_static_shape or not 0 < math.prod(t.shape) <= self.max_leaf_elements):
                continue
            assert loop.operands[i + 1] == args[i], "wrap-loop carries argument i at position i + 1"
            by_type.setdefault(str(t.element_type), []).append(i + 1)
        return [g for g in by_type.values() if len(g) >= self.min_group]


def _pack(loop: ir.Operation, groups: list[list[int]]) -> None:
    packed = {k for g in groups for k in g}
    kept = [k for k in range(len(loop.operands)) if k not in packed]
    types = [v.type for v in loop.operands]
    sizes = {k: math.prod(ir.RankedTensorType(types[k]).shape) for k in packed}
    with ir.InsertionPoint(loop), loop.location:
        flats = [_concat([loop.operands[k] for k in g], sizes) for g in groups]
        init = [loop.operands[k] for k in kept] + flats
        new = stablehlo.WhileOp([v.type for v in init], init)
    for region in range(2):
        block = loop.regions[region].blocks[0]
        block.append_to(new.regions[region])
        flat_args = [block.add_argument(v.type, loop.location) for v in flats]
        with ir.InsertionPoint(block.operations[0]), loop.location:
            _unpack(flat_args, groups, [block.arguments[k] for k in range(len(types))], sizes)
        if region == 1:
            ret = block.operations[len(block.operations) - 1]
            with ir.InsertionPoint(ret), loop.location:
                out = [_concat([ret.operands[k] for k in g], sizes) for g in groups]
                stablehlo.ReturnOp([ret.operands[k] for k in kept] + out)
            ret.erase()
        for k in sorted(packed, reverse=True):
            block.erase_argument(k)
    with ir.InsertionPoint.after(new), loop.location:
        results = list(new.results)
        for n, k in enumerate(kept):
            loop.results[k].replace_all_uses_with(results[n])
        _unpack(results[len(kept):], groups, list(loop.results), sizes)
    loop.erase()


def _concat(values: list[ir.Value], sizes: dict) -> ir.Value:
    """The 1-D concatenation of `values` (each reshaped to 1-D)."""
    pieces = [v if ir.RankedTensorType(v.type).rank == 1 else
              stablehlo.ReshapeOp(ir.RankedTensorType.get([math.prod(ir.RankedTensorType(v.type).shape)],
                                                          ir.RankedTensorType(v.type).element_type), v).result
              for v in values]
    return stablehlo.ConcatenateOp(pieces, 0).result


def _unpack(flats: list[ir.Value], groups: list[list[int]], olds: list[ir.Value], sizes: dict) -> None:
    """Replace each used `olds[k]` of a group by its slice of the group's flat value, reshaped back."""
    for flat, g in zip(flats, groups):
        offset = 0
        for k in g:
            old, n = olds[k], sizes[k]
            if any(True for _ in old.uses):
                piece = stablehlo.SliceOp(flat, [offset], [offset + n], [1]).result
                if ir.RankedTensorType(old.type).rank != 1:
                    piece = stablehlo.ReshapeOp(old.type, piece).result
                old.replace_all_uses_with(piece)
            offset += n
