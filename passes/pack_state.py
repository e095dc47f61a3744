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
the update chains into the step's return only (`flatten_update.feeding`): an elementwise update
alike over many packed leaves (the moments, the parameter step) is computed once over the buffer,
and the buffer the step returns is built from those flat results, while the forward pass (whose
elementwise ops feed reductions and products) stays per leaf, reading slices of the buffer. And a
leaf read only by such chains (an optimizer's moment) goes into a buffer of its own per chain
(`_update_only`), apart from the parameters. This is the structure of a hand-written
``ravel_pytree`` step: per-leaf forward and gradient kernels, the gradient concatenated once, one
flat kernel per moment written in place, one for the parameters.

Why it is safe: reshape (row major), concatenate and slice only move elements, and every slice
reads back exactly the elements the concatenation put there, so the step sees the same values as
before, iteration for iteration, and the loop returns the same state. No arithmetic is added or
changed; flatten-update says why its rewrite computes the same bits. Larger leaves (matmul weights)
stay separate so that the step reads them in place.

Runs after wrap-loop (pipeline.build places it there: ``after_wrap_loop``); without wrap-loop's loop
(a single step) it changes nothing.

Opt-in: exact on StableHLO (the reference interpreter), but XLA fuses the packed loop to other last
bits in some programs (clipped Adam, an RNN; with jaxlib 0.11+ also Lion and RMSProp; with
``flatten=true`` also Adam, ``inject_hyperparams`` and the corpus transformer), within 1e-5 relative
(tests/py/test_pack_state.py). Speed (BENCHMARKS.md, "Packed state through the device loop"): with
``flatten=true`` the loop body is the hand-written ``ravel_pytree`` step's, kernel for kernel, and
about as fast per step; each call still unpacks every leaf once (a slice kernel per leaf) and passes the state leaf by
leaf, which the ``ravel_pytree`` program, whose caller keeps the state flat, does not pay.
"""
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from ._func import arg_attrs, main_func
from .control_flow import is_wrap_loop
from .flatten_update import Flattener, feeding
from .module_pass import ModulePass, option
from .vocabulary import STATE
from .wrap_loop import BODY

SHARDINGS = ("sdy.sharding", "mhlo.sharding")


@dataclass(frozen=True)
class PackState(ModulePass):
    """Examples:
        >>> from loopfuse.pass_manager import parse_pipeline
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
        groups = self._groups(main, loops[0])
        if not groups:
            return
        flattener = _pack(loops[0], groups)
        if self.flatten:
            flattener.flatten(self.min_group, _last(flattener.block))
        flattener.finish()

    def _groups(self, main: func.FuncOp, loop: ir.Operation) -> list[list[int]]:
        """Groups of the loop's carry positions to pack (carry position = argument index + 1, after
        the counter), one per element type (with `flatten`, per element type and `_update_only`
        role), in first-occurrence order."""
        update_only = _update_only(loop) if self.flatten else {}
        by_type: dict[tuple, list[int]] = {}
        args = main.body.blocks[0].arguments
        for i, attrs in enumerate(arg_attrs(main)):
            t = args[i].type
            if (STATE not in attrs or any(s in attrs for s in SHARDINGS) or not isinstance(t, ir.RankedTensorType)
                    or not t.has_static_shape or not 0 < math.prod(t.shape) <= self.max_leaf_elements):
                continue
            assert loop.operands[i + 1] == args[i], "wrap-loop carries argument i at position i + 1"
            by_type.setdefault((str(t.element_type), update_only.get(i + 1)), []).append(i + 1)
        return [g for g in by_type.values() if len(g) >= self.min_group]


class _StepPacker(Flattener):
    """The step function's side: its packed arguments are slices of flat arguments, and `finish`
    makes it return the flat buffers of its packed results."""

    def __init__(self, step: func.FuncOp, results: list[list[int]]):
        super().__init__(step.body.blocks[0])
        self.step, self.results = step, results

    def finish(self) -> None:
        block = self.block
        ret = block.operations[len(block.operations) - 1].operation
        packed = {j for g in self.results for j in g}
        with ir.InsertionPoint(ret), ret.location:
            flats = [self.flat([ret.operands[j] for j in g], [_size(ret.operands[j]) for j in g], ret)
                     for g in self.results]
            outs = [v for j, v in enumerate(ret.operands) if j not in packed] + flats
            func.ReturnOp(outs)
        ret.erase()
        self.step.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], [v.type for v in outs]))
        self.erase_unused()


def _update_only(loop: ir.Operation) -> dict[int, tuple]:
    """The carry positions whose step argument is read only by update chains into the step's return
    (`flatten_update.feeding`): an optimizer's moments, not the parameters, which the forward pass
    reads too; each with the signature of the chain that reads it. Each kind of moment gets a buffer
    of its own, so that its flat update writes it in place and the parameters' update reads that
    result: in one buffer with the parameters (or with each other) XLA recomputes the moments in the
    parameters' update from the old buffer, and copies the whole buffer every step to keep it."""
    step = _callee(_step_call(loop.regions[1].blocks[0]))
    entry = step.body.blocks[0]
    tree_of = {op: tree for tree in feeding(entry, _last(entry)) for op in tree.nodes}
    roles = {}
    for i, arg in enumerate(entry.arguments):
        users = [u.owner.operation for u in arg.uses]
        if users and all(op in tree_of for op in users):
            roles[i + 1] = tree_of[users[0]].signature
    return roles


def _last(block: ir.Block) -> ir.Operation:
    return block.operations[len(block.operations) - 1].operation


def _step_call(body: ir.Block) -> func.CallOp:
    return next(op for op in body.operations if isinstance(op, func.CallOp) and op.callee.value == BODY)


def _pack(loop: ir.Operation, groups: list[list[int]]) -> _StepPacker:
    """Rewrite the loop and its step for `groups`; returns the step's packer, to finish."""
    packed = {k for g in groups for k in g}
    kept = [k for k in range(len(loop.operands)) if k not in packed]
    with ir.InsertionPoint(loop), loop.location:
        flats = [_concat([loop.operands[k] for k in g]) for g in groups]
        init = [loop.operands[k] for k in kept] + flats
        new = stablehlo.WhileOp([v.type for v in init], init)
    cond, body = (loop.regions[r].blocks[0] for r in range(2))
    for r, block in enumerate((cond, body)):
        block.append_to(new.regions[r])
        for v in flats:
            block.add_argument(v.type, loop.location)
    with ir.InsertionPoint(cond.operations[0]), loop.location:
        _unpack(list(cond.arguments)[len(loop.operands):], groups, list(cond.arguments))
    packer = _pack_step(body, groups, len(loop.operands))
    for block in (cond, body):
        for k in sorted(packed, reverse=True):
            block.erase_argument(k)
    with ir.InsertionPoint.after(new), loop.location:
        results = list(new.results)
        for n, k in enumerate(kept):
            loop.results[k].replace_all_uses_with(results[n])
        _unpack(results[len(kept):], groups, list(loop.results))
    loop.erase()
    return packer


def _pack_step(body: ir.Block, groups: list[list[int]], n_carry: int) -> _StepPacker:
    """Make the body's call of the step take and return the flat buffers (the body's last arguments)."""
    call = _step_call(body)
    ret = body.operations[len(body.operations) - 1]
    flat_args = list(body.arguments)[n_carry:]
    for g in groups:
        for k in g:
            assert call.operands[k - 1] == body.arguments[k], "the step takes carried value k as argument k - 1"
            assert ret.operands[k].owner == call.operation, "the body returns the step's new value of k"
    arg_groups = [[k - 1 for k in g] for g in groups]
    res_groups = [[ir.OpResult(ret.operands[k]).result_number for k in g] for g in groups]
    step = _callee(call)
    packer = _StepPacker(step, res_groups)
    entry = step.body.blocks[0]
    step_flats = [entry.add_argument(v.type, step.location) for v in flat_args]
    with ir.InsertionPoint(entry.operations[0]), step.location:
        packer.slice_of.update(_unpack(step_flats, arg_groups, list(entry.arguments)))
    for i in sorted((i for g in arg_groups for i in g), reverse=True):
        entry.erase_argument(i)

    packed_args = {i for g in arg_groups for i in g}
    packed_res = {j for g in res_groups for j in g}
    kept_res = [j for j in range(len(call.results)) if j not in packed_res]
    with ir.InsertionPoint(call), call.location:
        operands = [v for i, v in enumerate(call.operands) if i not in packed_args] + flat_args
        types = [call.results[j].type for j in kept_res] + [v.type for v in flat_args]
        new_call = func.CallOp(types, ir.FlatSymbolRefAttr.get(BODY), operands)
    new_flats = list(new_call.results)[len(kept_res):]
    packed = {k for g in groups for k in g}
    with ir.InsertionPoint(ret), ret.location:
        stablehlo.ReturnOp([v for k, v in enumerate(ret.operands) if k not in packed] + new_flats)
    ret.erase()
    for n, j in enumerate(kept_res):
        call.results[j].replace_all_uses_with(new_call.results[n])
    with ir.InsertionPoint.after(new_call), call.location:
        _unpack(new_flats, res_groups, list(call.results))  # a packed result read elsewhere in the body
    call.erase()
    return packer


def _callee(call: func.CallOp) -> func.FuncOp:
    module = call.operation
    while module.name != "builtin.module":
        module = module.parent
    for op in module.regions[0].blocks[0].operations:
        if isinstance(op, func.FuncOp) and op.sym_name.value == call.callee.value:
            return op
    raise AssertionError(f"no function @{call.callee.value}")


def _size(v: ir.Value) -> int:
    return math.prod(ir.RankedTensorType(v.type).shape)


def _concat(values: list[ir.Value]) -> ir.Value:
    """The 1-D concatenation of `values` (each reshaped to 1-D)."""
    pieces = [v if ir.RankedTensorType(v.type).rank == 1 else
              stablehlo.ReshapeOp(ir.RankedTensorType.get([_size(v)], ir.RankedTensorType(v.type).element_type),
                                  v).result
              for v in values]
    return stablehlo.ConcatenateOp(pieces, 0).result


def _unpack(flats: Sequence[ir.Value], groups: list[list[int]], olds: Sequence[ir.Value]) -> dict:
    """Replace each used `olds[k]` of a group by its slice of the group's flat value, reshaped back;
    returns {slice: (flat, offset)} (flatten-update's `slice_of`)."""
    slices = {}
    for flat, g in zip(flats, groups):
        offset = 0
        for k in g:
            old, n = olds[k], _size(olds[k])
            if any(True for _ in old.uses):
                piece = stablehlo.SliceOp(flat, [offset], [offset + n], [1]).result
                if ir.RankedTensorType(old.type).rank != 1:
                    piece = stablehlo.ReshapeOp(old.type, piece).result
                old.replace_all_uses_with(piece)
                slices[piece] = (flat, offset)
            offset += n
    return slices
