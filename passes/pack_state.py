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
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from ._concat import split_wide_concatenates
from .canonicalize import fold_slices
from .dead_code import erase_dead_ops
from .functions import arg_attrs, callee, last_op, main_func
from .control_flow import is_wrap_loop
from .flatten_update import Flattener, feeding, trees_of
from .matchers import producer, rows, sliced_rows
from .module_pass import ModulePass, option
from .vocabulary import BODY, SHARDINGS, STATE


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
        loop = _split(main, loops[0]) if self.flatten else loops[0]
        trees = list(trees_of(_step_entry(loop))) if self.flatten else []  # found once: packing keeps them
        groups = self._groups(main, loop, trees)
        if groups:
            flattener = _pack(loop, groups)
            if self.flatten:
                flattener.flatten(self.min_group, last_op(flattener.block), trees, self.max_leaf_elements)
            flattener.finish()
            split_wide_concatenates(flattener.block)
        fold_slices(main.operation)
        split_wide_concatenates(main.body.blocks[0])

    def _groups(self, main: func.FuncOp, loop: ir.Operation, trees: list) -> list[list[int]]:
        """Groups of the loop's carry positions to pack (the state arguments and the pieces of split
        buffers), one per element type (with `flatten`, per element type and `_update_only` role,
        from the step's `trees`), in first-occurrence order."""
        update_only = _update_only(loop, trees) if self.flatten else {}
        by_type: dict[tuple, list[int]] = {}
        attrs = arg_attrs(main)
        for k in range(1, len(loop.operands)):
            i, t = _state_arg(main, loop.operands[k]), loop.operands[k].type
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
        block = self.block
        ret = last_op(block)
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


def _update_only(loop: ir.Operation, trees: list) -> dict[int, tuple]:
    """The carry positions whose step argument is read only by update chains into the step's return
    (`flatten_update.feeding`): an optimizer's moments, not the parameters, which the forward pass
    reads too; each with the signature and scalars of the chain that reads it. Each kind of moment
    gets a buffer of its own, so that its flat update writes it in place and the parameters' update
    reads that result: in one buffer with the parameters (or with each other) XLA recomputes the
    moments in the parameters' update from the old buffer, and copies the whole buffer every step
    to keep it."""
    body = loop.regions[1].blocks[0]
    call = _step_call(body)
    entry = callee(call).body.blocks[0]
    tree_of = {op: tree for tree in feeding(trees, last_op(entry)) for op in tree.nodes}
    roles = {}
    for k, m in _operands(body, call).items():
        users = [u.owner.operation for u in entry.arguments[m].uses]
        if users and all(op in tree_of for op in users):
            tree = tree_of[users[0]]
            roles[k] = tree.signature, tuple(tree.scalars)
    return roles


def _operands(body: ir.Block, call: func.CallOp) -> dict[int, int]:
    """Carry position -> the step call's operand index, for the carried values the call takes as they are."""
    return {ir.BlockArgument(v).arg_number: m for m, v in enumerate(call.operands)
            if isinstance(v, ir.BlockArgument) and v.owner == body}


def _state_arg(main: func.FuncOp, value: ir.Value) -> int | None:
    """The argument of `main` that `value` is, or is a (reshaped) slice of (a piece of a split buffer)."""
    source = sliced_rows(value)
    value = value if source is None else source[0]
    entry = main.body.blocks[0]
    return ir.BlockArgument(value).arg_number if isinstance(value, ir.BlockArgument) and value.owner == entry else None


def _step_entry(loop: ir.Operation) -> ir.Block:
    """The entry block of the step function the loop calls."""
    return callee(_step_call(loop.regions[1].blocks[0])).body.blocks[0]


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
    ret = last_op(body)
    flat_args = list(body.arguments)[n_carry:]
    operand_of = _operands(body, call)
    for g in groups:
        for k in g:
            assert k in operand_of, "the step takes carried value k as it is"
            assert ret.operands[k].owner == call.operation, "the body returns the step's new value of k"
    arg_groups = [[operand_of[k] for k in g] for g in groups]
    res_groups = [[ir.OpResult(ret.operands[k]).result_number for k in g] for g in groups]
    step = callee(call)
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


def _split(main: func.FuncOp, loop: ir.Operation) -> ir.Operation:
    """Carry each state buffer of the loop that the step reads only as slices and returns as a
    concatenation (a state packed by the caller, `loopfuse.pack`) as its pieces instead, each shaped
    as the value the step returns for it, so that grouping can pack the pieces again (per role);
    returns the loop, rewritten or not. Before the loop the pieces are slices of the buffer, after
    it the buffer is their concatenation (`canonicalize.fold_slices` then merges consecutive slices)."""
    cond, body = (loop.regions[r].blocks[0] for r in range(2))
    call = _step_call(body)
    step = callee(call)
    entry = step.body.blocks[0]
    step_ret, body_ret = last_op(entry), last_op(body)
    splits = {}      # carry position -> (call operand index, call result index, [(piece type, slices, new value)])
    for k, m in _operands(body, call).items():
        pieces = _pieces(main, loop, cond, body, call, entry, step_ret, body_ret, k, m)
        if pieces is not None:
            splits[k] = pieces
    if not splits:
        return loop
    n = len(loop.operands)
    kept = [k for k in range(n) if k not in splits]
    with ir.InsertionPoint(loop), loop.location:
        init = [loop.operands[k] for k in kept]
        for k, (_, _, pieces) in splits.items():
            offset = 0
            for t, _, _ in pieces:
                size = math.prod(t.shape)
                piece = stablehlo.SliceOp(loop.operands[k], [offset], [offset + size], [1]).result
                init.append(piece if t.rank == 1 else stablehlo.ReshapeOp(t, piece).result)
                offset += size
        new = stablehlo.WhileOp([v.type for v in init], init)
    for r, block in enumerate((cond, body)):
        block.append_to(new.regions[r])
        for v in init[len(kept):]:
            block.add_argument(v.type, loop.location)
    piece_args = list(body.arguments)[n:]

    # the step takes and returns the pieces (after its other arguments and results)
    results_out, dropped_args, dropped_results = [], set(), set()
    replaced: dict = {}     # a slice (or its reshape) of a split buffer -> what reads the piece now
    for k, (m, j, pieces) in splits.items():
        dropped_args.add(m)
        dropped_results.add(j)
        for t, slices, value in pieces:
            arg = entry.add_argument(t, step.location)
            results_out.append(value)
            for sl in slices:
                for use in list(sl.result.uses):
                    user = use.owner.operation
                    if isinstance(user.opview, stablehlo.ReshapeOp) and user.result.type == t:
                        user.result.replace_all_uses_with(arg)
                        replaced[user.result] = arg
                with ir.InsertionPoint(sl), step.location:
                    flat = arg if t.rank == 1 else stablehlo.ReshapeOp(sl.result.type, arg).result
                sl.result.replace_all_uses_with(flat)
                replaced[sl.result] = flat
    with ir.InsertionPoint(step_ret), step_ret.location:   # a piece returned as it came reads the piece
        outs = [v for j, v in enumerate(step_ret.operands) if j not in dropped_results] + [
            replaced.get(v, v) for v in results_out]
        func.ReturnOp(outs)
    step_ret.erase()
    erase_dead_ops(entry)     # the slices of the buffers and the concatenations of their pieces
    for i in sorted(dropped_args, reverse=True):
        entry.erase_argument(i)
    step.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in entry.arguments], [v.type for v in outs]))

    # the body calls it so and carries the pieces
    kept_results = [j for j in range(len(call.results)) if j not in dropped_results]
    with ir.InsertionPoint(call), call.location:
        operands = [v for m, v in enumerate(call.operands) if m not in dropped_args] + piece_args
        new_call = func.CallOp([call.results[j].type for j in kept_results] + [a.type for a in piece_args],
                               ir.FlatSymbolRefAttr.get(BODY), operands)
    for n_new, j in enumerate(kept_results):
        call.results[j].replace_all_uses_with(new_call.results[n_new])
    with ir.InsertionPoint(body_ret), body_ret.location:
        stablehlo.ReturnOp([body_ret.operands[k] for k in kept] + list(new_call.results)[len(kept_results):])
    body_ret.erase()
    call.erase()
    for block in (cond, body):
        for k in sorted(splits, reverse=True):
            block.erase_argument(k)

    # after the loop: each buffer is the concatenation of its pieces
    results = list(new.results)
    with ir.InsertionPoint.after(new), loop.location:
        for n_new, k in enumerate(kept):
            loop.results[k].replace_all_uses_with(results[n_new])
        at = len(kept)
        for k, (_, _, pieces) in splits.items():
            parts = [_flat(v) for v in results[at:at + len(pieces)]]
            at += len(pieces)
            loop.results[k].replace_all_uses_with(stablehlo.ConcatenateOp(parts, 0).result)
    loop.erase()
    return new.operation


def _pieces(main, loop, cond, body, call, entry, step_ret, body_ret, k: int, m: int):
    """(call operand m, call result j, pieces) when carried value `k` is a state buffer that the step
    reads only by slices of its pieces and returns as the concatenation of them, else None. A piece:
    (its type: the value's the step returns for it, the slices of it that the step reads, that value)."""
    t = loop.operands[k].type
    if (_state_arg(main, loop.operands[k]) is None or not isinstance(t, ir.RankedTensorType) or t.rank != 1
            or any(True for _ in cond.arguments[k].uses) or len(list(body.arguments[k].uses)) != 1):
        return None
    out = body_ret.operands[k]
    if not (isinstance(out, ir.OpResult) and out.owner == call.operation) or len(list(out.uses)) != 1:
        return None
    j = out.result_number
    concat = producer(step_ret.operands[j], stablehlo.ConcatenateOp)
    if concat is None or len(list(step_ret.operands[j].uses)) != 1:
        return None
    pieces: list = []
    ranges, offset = {}, 0
    for v in _concatenated(concat):
        reshape = producer(v, stablehlo.ReshapeOp)
        value = v if reshape is None else reshape.operands[0]
        if not (isinstance(value.type, ir.RankedTensorType) and value.type.has_static_shape):
            return None
        size = math.prod(value.type.shape)
        ranges[(offset, offset + size)] = len(pieces)
        pieces.append((value.type, [], value))
        offset += size
    for use in entry.arguments[m].uses:
        sl = use.owner.operation
        bounds = rows(sl)
        at = None if bounds is None else ranges.get(bounds)
        if at is None:
            return None
        pieces[at][1].append(sl)
    return m, j, pieces


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


def _flat(value: ir.Value) -> ir.Value:
    t = ir.RankedTensorType(value.type)
    return value if t.rank == 1 else stablehlo.ReshapeOp(
        ir.RankedTensorType.get([math.prod(t.shape)], t.element_type), value).result
