"""The small rewriter layer the structural passes build with: the values a loop rewrite makes.

Each function makes one StableHLO op or a short fixed sequence at the current insertion point and
location (inside ``with ir.InsertionPoint(...), location:``): scalars, zero buffers, a row of a
stacked buffer read or written at a dynamic index, a stack of equal-typed values, a clone of an op
on other operands. `Builder` holds an insertion point and a location for code that builds at
several places in turn. All are exact by construction: reshape, slice, concatenate and
dynamic_update_slice only move elements. `slice_chunk` and `write_chunk` read and write one of the equal
chunks of a dimension (a micro-batch slice); `inline` replaces a call by its callee's ops.

Loops: every ``stablehlo.while`` a pass builds is a `Loop`, whose carried values are *named groups*
given at the call site, as ``scf.for``'s iter_args are named there: ``Loop.counted(L, carry=[x],
saved=[h])`` builds a loop of L trips, the body reads ``loop.arg("carry")``, ends with
``loop.next(carry=[...], saved=[...])`` and the code after it reads ``loop.result("saved")``; no
caller computes a carried value's position. `recarried` rebuilds an existing loop over other
carried values (the regions moved, not copied), for passes that change what a loop carries;
`Recarry` names its parts while the pass rewires it (the old values by their old positions, the
added ones as a list), as `recall` does for a ``func.call`` that takes and returns other values.
"""
import math
from collections.abc import Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from ._concat import concat_tree
from .functions import callee, last_op


def i32() -> ir.RankedTensorType:
    return ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))


def scalar(value: int, t: ir.RankedTensorType | None = None) -> ir.Value:
    """A 0-d integer constant (i32 unless `t` says otherwise)."""
    t = t or i32()
    return splat(ir.IntegerAttr.get(t.element_type, value), list(t.shape))


def splat(value: ir.IntegerAttr | ir.FloatAttr, shape: Sequence[int] = ()) -> ir.Value:
    """A constant of `shape` (0-d by default) filled with `value`."""
    t = ir.RankedTensorType.get(list(shape), value.type)
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, value)).result


def broadcast(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    """The 0-d `value` broadcast to `shape`."""
    t = ir.RankedTensorType.get(list(shape), ir.RankedTensorType(value.type).element_type)
    return stablehlo.BroadcastInDimOp(t, value, []).result


def zeros(t: ir.RankedTensorType) -> ir.Value:
    """A tensor of type `t` filled with zero (integer, float or complex elements)."""
    return broadcast(zero(t.element_type), t.shape)


def zero(et: ir.Type) -> ir.Value:
    """A 0-d zero of element type `et`: integer, float, or complex (built from two real zeros)."""
    if isinstance(et, ir.ComplexType):
        real = zero(et.element_type)
        return stablehlo.ComplexOp(real, real).result
    return splat(ir.IntegerAttr.get(et, 0) if isinstance(et, ir.IntegerType) else ir.FloatAttr.get(et, 0.0))


def reshape(value: ir.Value, shape: list) -> ir.Value:
    """`value` with `shape` (itself when it has it already)."""
    t = ir.RankedTensorType(value.type)
    if list(t.shape) == list(shape):
        return value
    return stablehlo.ReshapeOp(ir.RankedTensorType.get(list(shape), t.element_type), value).result


def stack(values: list) -> ir.Value:
    """`values` (one type) as one tensor with a new leading axis, ``[len(values), *shape]``; built
    as a tree of concatenates (`_concat.concat_tree`)."""
    t = ir.RankedTensorType(values[0].type)
    return concat_tree([reshape(v, [1, *t.shape]) for v in values], 0)


def row(stacked: ir.Value, index: ir.Value) -> ir.Value:
    """Row `index` (a 0-d i32) of `stacked` (``[n, *shape]``), as a ``shape`` tensor."""
    t = ir.RankedTensorType(stacked.type)
    start = [index] + ([scalar(0)] * (t.rank - 1) if t.rank > 1 else [])
    piece = stablehlo.DynamicSliceOp(stacked, start, ir.DenseI64ArrayAttr.get([1, *t.shape[1:]])).result
    return reshape(piece, list(t.shape[1:]))


def static_row(stacked: ir.Value, index: int) -> ir.Value:
    """Row `index` (a Python int) of `stacked`, as a ``shape`` tensor."""
    return reshape(static_rows(stacked, index, index + 1), list(ir.RankedTensorType(stacked.type).shape[1:]))


def static_rows(stacked: ir.Value, start: int, stop: int) -> ir.Value:
    """Rows `start` .. `stop` - 1 (Python ints) of `stacked` (``[n, *shape]``), as ``[stop - start, *shape]``
    (`stacked` itself when that is all of it)."""
    t = ir.RankedTensorType(stacked.type)
    if (start, stop) == (0, t.shape[0]):
        return stacked
    return stablehlo.SliceOp(stacked, ir.DenseI64ArrayAttr.get([start] + [0] * (t.rank - 1)),
                             ir.DenseI64ArrayAttr.get([stop, *t.shape[1:]]), ir.DenseI64ArrayAttr.get([1] * t.rank)).result


def flat(value: ir.Value) -> ir.Value:
    """`value` reshaped to 1-D (row major)."""
    return reshape(value, [math.prod(ir.RankedTensorType(value.type).shape)])


def flat_piece(buffer: ir.Value, offset: int, t: ir.RankedTensorType) -> ir.Value:
    """The value of type `t` that 1-D `buffer` holds from element `offset` on (a slice, reshaped)."""
    return reshape(static_rows(buffer, offset, offset + math.prod(t.shape)), list(t.shape))


def concat(values: Sequence[ir.Value], dim: int = 0) -> ir.Value:
    """`values` concatenated along `dim` (the one value itself)."""
    return values[0] if len(values) == 1 else stablehlo.ConcatenateOp(list(values), dim).result


def flat_concat(values: Sequence[ir.Value]) -> ir.Value:
    """`values` as one 1-D buffer: their `flat`s concatenated, in order."""
    return concat([flat(v) for v in values])


def write_row(stacked: ir.Value, value: ir.Value, index: ir.Value) -> ir.Value:
    """`stacked` with row `index` (a 0-d i32) replaced by `value` (any shape of the row's size)."""
    t = ir.RankedTensorType(stacked.type)
    return write_rows(stacked, reshape(value, [1, *t.shape[1:]]), index)


def write_rows(stacked: ir.Value, rows: ir.Value, index: ir.Value) -> ir.Value:
    """`stacked` with the rows from `index` (a 0-d i32) on replaced by `rows` (``[m, *shape]``)."""
    t = ir.RankedTensorType(stacked.type)
    start = [index] + ([scalar(0)] * (t.rank - 1) if t.rank > 1 else [])
    return stablehlo.DynamicUpdateSliceOp(stacked, rows, start).result


def slice_chunk(value: ir.Value, dim: int, index: ir.Value, count: int, runs: int = 1) -> ir.Value:
    """Chunk `index` (a 0-d i32) of `value` along `dim`, cut into `runs` runs of `count` equal chunks:
    ``value`` viewed as ``[..., runs, count, size // (runs * count), ...]`` at ``[..., :, index, :, ...]``,
    the runs joined again; one run: rows ``index * size / count`` on, a dynamic_slice."""
    shape = list(ir.RankedTensorType(value.type).shape)
    piece = shape[dim] // (runs * count)
    if runs == 1:
        sizes = shape[:dim] + [piece] + shape[dim + 1:]
        return stablehlo.DynamicSliceOp(value, _chunk_start(len(shape), dim, index, piece),
                                        ir.DenseI64ArrayAttr.get(sizes)).result
    viewed = reshape(value, shape[:dim] + [runs, count, piece] + shape[dim + 1:])
    sizes = shape[:dim] + [runs, 1, piece] + shape[dim + 1:]
    part = stablehlo.DynamicSliceOp(viewed, _chunk_start(len(shape) + 2, dim + 1, index, 1),
                                    ir.DenseI64ArrayAttr.get(sizes)).result
    return reshape(part, shape[:dim] + [runs * piece] + shape[dim + 1:])


def write_chunk(buffer: ir.Value, value: ir.Value, dim: int, index: ir.Value, count: int, runs: int = 1) -> ir.Value:
    """`buffer` with its chunk `index` along `dim` (as `slice_chunk` reads it) replaced by `value`."""
    shape = list(ir.RankedTensorType(buffer.type).shape)
    piece = shape[dim] // (runs * count)
    if runs == 1:
        return stablehlo.DynamicUpdateSliceOp(buffer, value, _chunk_start(len(shape), dim, index, piece)).result
    viewed = reshape(buffer, shape[:dim] + [runs, count, piece] + shape[dim + 1:])
    part = reshape(value, shape[:dim] + [runs, 1, piece] + shape[dim + 1:])
    return reshape(stablehlo.DynamicUpdateSliceOp(viewed, part, _chunk_start(len(shape) + 2, dim + 1, index, 1)).result,
                   shape)


def _chunk_start(rank: int, dim: int, index: ir.Value, piece: int) -> list:
    """Start indices of chunk `index` (`piece` long) along `dim`, 0 elsewhere."""
    start = [scalar(0)] * rank
    start[dim] = index if piece == 1 else stablehlo.MulOp(index, scalar(piece, ir.RankedTensorType(index.type))).result
    return start


def inline(call: ir.Operation) -> None:
    """Replace `call` (a ``func.call``) by a copy of its callee's ops, each located at its own location
    called from the call's (so a message about it names the caller's line)."""
    body = callee(call.opview).body.blocks[0]
    values: dict = dict(zip(body.arguments, call.operands))
    with ir.InsertionPoint(call):
        for view in list(body.operations)[:-1]:
            op = view.operation
            new = clone(op, [values[v] for v in op.operands], values)
            new.location = ir.Location.callsite(op.location, [call.location])
            values.update(zip(op.results, new.results))
    for r, v in zip(call.results, last_op(body).operands):
        r.replace_all_uses_with(values[v])
    call.erase()


def clone(op: ir.Operation, operands: list, captured: dict | None = None) -> ir.Operation:
    """A copy of `op` here reading `operands`; values its regions use from outside it are replaced
    by `captured` (old value -> new value) where given."""
    new = op.clone(ip=ir.InsertionPoint.current)
    for k, v in enumerate(operands):
        if new.operands[k] != v:
            new.operands[k] = v
    if captured:
        def visit(inner: ir.Operation) -> ir.WalkResult:
            if inner != new:
                for k, v in enumerate(inner.operands):
                    if v in captured:
                        inner.operands[k] = captured[v]
            return ir.WalkResult.ADVANCE
        new.walk(visit)
    return new


class Builder:
    """An insertion point and a location: ``with builder:`` builds there (the functions above)."""

    def __init__(self, ip: ir.InsertionPoint, location: ir.Location):
        self.ip, self.location = ip, location

    @classmethod
    def before(cls, op: ir.Operation) -> "Builder":
        return cls(ir.InsertionPoint(op), op.location)

    @classmethod
    def at_end(cls, block: ir.Block, location: ir.Location) -> "Builder":
        return cls(ir.InsertionPoint(block), location)

    def __enter__(self) -> "Builder":
        self.ip.__enter__()
        self.location.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.location.__exit__(*exc)
        self.ip.__exit__(*exc)


class Loop:
    """A ``stablehlo.while`` over a counter and named groups of carried values (see the module
    docstring). The counter (a 0-d i32) is carried first, then the groups in the order given; the
    condition is ``counter < limit``, and ``and not flag`` where a `stop` group (one tensor<i1>) is
    named. Build the body with ``with Builder.at_end(loop.body, location):`` and end it with `next`.

    Examples:
        >>> from loopfuse.compile.mlir_context import make_context
        >>> from jaxlib.mlir.dialects import func
        >>> with make_context(), ir.Location.unknown():
        ...     module = ir.Module.create()
        ...     t = ir.RankedTensorType.get([], ir.F32Type.get())
        ...     with ir.InsertionPoint(module.body):
        ...         f = func.FuncOp("main", ([t], [t]))
        ...     with ir.InsertionPoint(f.add_entry_block()):
        ...         loop = Loop.counted(3, total=[f.arguments[0]])
        ...         with ir.InsertionPoint(loop.body):
        ...             loop.next(total=[stablehlo.AddOp(*loop.arg("total"), *loop.arg("total")).result])
        ...         _ = func.ReturnOp(loop.result("total"))
        ...     print(module.operation.verify(), len(loop.op.operands), loop.names)
        True 2 ('total',)
    """

    def __init__(self, op: ir.Operation, groups: dict[str, int]):
        self.op = op
        self.names = tuple(groups)
        self._spans: dict[str, tuple[int, int]] = {}
        at = 1
        for name, n in groups.items():
            self._spans[name] = (at, at + n)
            at += n

    @classmethod
    def build(cls, start: ir.Value, limit: "int | ir.Value | str", carries: dict[str, Sequence[ir.Value]],
              stop: str | None = None) -> "Loop":
        """A loop here with counter `start` while it is below `limit` (an int, a 0-d i32 value from
        outside, or the name of a one-value group, read as carried) and, with `stop`, the one value of
        that group is false; its body block is empty."""
        init = [start, *(v for values in carries.values() for v in values)]
        types = [v.type for v in init]
        op = stablehlo.WhileOp(types, init).operation
        loop = cls(op, {name: len(values) for name, values in carries.items()})
        cond = op.regions[0].blocks.append(*types)
        with ir.InsertionPoint(cond):
            bound = (scalar(limit, ir.RankedTensorType(start.type)) if isinstance(limit, int) else
                     loop._group(cond.arguments, limit)[0] if isinstance(limit, str) else limit)
            go = stablehlo.CompareOp(cond.arguments[0], bound, stablehlo.ComparisonDirectionAttr.get("LT")).result
            if stop is not None:
                go = stablehlo.AndOp(go, stablehlo.NotOp(loop._group(cond.arguments, stop)[0]).result).result
            stablehlo.ReturnOp([go])
        op.regions[1].blocks.append(*types)
        return loop

    @classmethod
    def counted(cls, trips: "int | ir.Value", **carries: Sequence[ir.Value]) -> "Loop":
        """A loop here of `trips` iterations (an int, or a 0-d i32 value), its counter from 0."""
        return cls.build(scalar(0), trips, carries)

    @property
    def body(self) -> ir.Block:
        return self.op.regions[1].blocks[0]

    @property
    def counter(self) -> ir.Value:
        """The body's counter (0 .. trips - 1 for a counted loop)."""
        return self.body.arguments[0]

    @property
    def final_counter(self) -> ir.Value:
        """The counter after the loop (how many trips ran, for a counted loop)."""
        return self.op.results[0]

    def arg(self, name: str) -> list[ir.Value]:
        """The body's values of group `name`, as this iteration receives them."""
        return self._group(self.body.arguments, name)

    def result(self, name: str) -> list[ir.Value]:
        """The loop's final values of group `name`."""
        return self._group(self.op.results, name)

    def next(self, counter: ir.Value | None = None, **groups: Sequence[ir.Value]) -> None:
        """End the body (at the current insertion point): the next iteration's counter (default the
        counter + 1) and every group's next values, by name."""
        if set(groups) != set(self.names):
            raise ValueError(f"Loop.next needs the groups {sorted(self.names)}, got {sorted(groups)}")
        values = []
        for name in self.names:
            lo, hi = self._spans[name]
            if len(groups[name]) != hi - lo:
                raise ValueError(f"Loop.next: group {name!r} carries {hi - lo} value(s), got {len(groups[name])}")
            values += list(groups[name])
        if counter is None:
            i = self.counter
            counter = stablehlo.AddOp(i, scalar(1, ir.RankedTensorType(i.type))).result
        stablehlo.ReturnOp([counter, *values])

    def _group(self, values, name: str) -> list[ir.Value]:
        lo, hi = self._spans[name]
        return list(values)[lo:hi]


def recarried(loop: ir.Operation, kept: Sequence[int], added: Sequence[ir.Value]) -> ir.Operation:
    """A new ``stablehlo.while`` before `loop` over its carried values at positions `kept` and then
    `added`, with `loop`'s attributes, `loop`'s condition and body blocks moved into it with one new
    argument per added value (appended). The caller rewires the blocks (their arguments at the other
    positions are still there, to be replaced and erased), the body's return and the uses of `loop`'s
    results, then erases `loop`."""
    init = [loop.operands[k] for k in kept] + list(added)
    with ir.InsertionPoint(loop), loop.location:
        new = stablehlo.WhileOp([v.type for v in init], init).operation
    for named in [loop.attributes[i] for i in range(len(loop.attributes))]:
        new.attributes[named.name] = named.attr
    for r in range(2):
        block = loop.regions[r].blocks[0]
        block.append_to(new.regions[r])
        for v in added:
            block.add_argument(v.type, loop.location)
    return new


def returning(ret: ir.Operation, values: Sequence[ir.Value]) -> None:
    """Replace the terminator `ret` (a ``func.return`` or ``stablehlo.return``) by one of its kind returning `values`."""
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create(ret.name, operands=list(values))
    ret.erase()


def erase_arguments(block: ir.Block, positions: Sequence[int]) -> None:
    """Erase the arguments of `block` at `positions` (nothing may read them)."""
    for k in sorted(positions, reverse=True):
        block.erase_argument(k)


class Rebuilt:
    """`old` replaced by `op`, whose results are `old`'s at positions `kept`, in order, then the
    added ones (`added_results`). The caller replaces the uses of `old`'s other results, then
    calls `finish`."""

    def __init__(self, old: ir.Operation, op: ir.Operation, kept: Sequence[int]):
        self.old, self.op, self.kept = old, op, list(kept)

    @property
    def added_results(self) -> list[ir.OpResult]:
        return list(self.op.results)[len(self.kept):]

    def finish(self) -> None:
        """`old`'s kept results read `op`'s; `old` is erased."""
        for n, k in enumerate(self.kept):
            self.old.results[k].replace_all_uses_with(self.op.results[n])
        self.old.erase()


def recall(call: ir.Operation, kept_operands: Sequence[int], added: Sequence[ir.Value], kept_results: Sequence[int],
           added_types: Sequence[ir.Type]) -> Rebuilt:
    """A call of `call`'s function before it on its operands at `kept_operands` then `added`,
    returning its results at `kept_results` then values of `added_types` (the function is the
    caller's to change alike)."""
    with ir.InsertionPoint(call), call.location:
        new = func.CallOp([call.results[j].type for j in kept_results] + list(added_types),
                          call.attributes["callee"],
                          [call.operands[m] for m in kept_operands] + list(added))
    return Rebuilt(call, new.operation, kept_results)


class Recarry(Rebuilt):
    """`loop` rebuilt over its carried values at positions `kept`, then `added` ones (`recarried`).
    While the caller rewires it, its blocks (`cond`, `body`) hold the old arguments, read by their
    old positions (`old_args`), then one per added value (`added_args`); `next` ends the body;
    `finish` erases the old arguments not kept and the old loop.

    Examples:
        A loop carrying ``x`` and ``y`` rebuilt to carry ``y`` after ``x`` only (dropped at position
        1, added at the end):

        >>> from loopfuse.compile.mlir_context import parse_module
        >>> m = parse_module('''
        ... func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {
        ...   %0:2 = stablehlo.while(%x = %a, %y = %b) : tensor<f32>, tensor<f32>
        ...     cond { %c = stablehlo.compare LT, %x, %y : (tensor<f32>, tensor<f32>) -> tensor<i1>
        ...            stablehlo.return %c : tensor<i1> }
        ...     do { %s = stablehlo.add %x, %y : tensor<f32>
        ...          stablehlo.return %s, %y : tensor<f32>, tensor<f32> }
        ...   return %0#0 : tensor<f32>
        ... }''')
        >>> main = m.body.operations[0].regions[0].blocks[0]
        >>> with m.context, ir.Location.unknown():
        ...     new = Recarry(main.operations[0], [0], [main.arguments[1]])
        ...     for block in (new.cond, new.body):
        ...         new.old_args(block)[1].replace_all_uses_with(new.added_args(block)[0])
        ...     new.next(new.added_args(new.body))
        ...     new.finish()
        >>> print(m.operation.verify(), [str(a.type) for a in new.body.arguments], len(main.operations))
        True ['tensor<f32>', 'tensor<f32>'] 2
    """

    def __init__(self, loop: ir.Operation, kept: Sequence[int], added: Sequence[ir.Value]):
        super().__init__(loop, recarried(loop, kept, added), kept)
        self._n_old = len(loop.operands)

    @property
    def cond(self) -> ir.Block:
        return self.op.regions[0].blocks[0]

    @property
    def body(self) -> ir.Block:
        return self.op.regions[1].blocks[0]

    def old_args(self, block: ir.Block) -> list[ir.BlockArgument]:
        """`block`'s arguments for the old loop's carried values, by their old positions."""
        return list(block.arguments)[:self._n_old]

    def added_args(self, block: ir.Block) -> list[ir.BlockArgument]:
        """`block`'s arguments for the added values, in order."""
        return list(block.arguments)[self._n_old:]

    def next(self, added: Sequence[ir.Value]) -> None:
        """End the body with its return's kept operands, then `added`: the added values' next values."""
        ret = last_op(self.body)
        returning(ret, [ret.operands[k] for k in self.kept] + list(added))

    def finish(self) -> None:
        """The old arguments not kept are erased from both blocks (nothing may read them), the old
        loop's kept results read the new loop's, and the old loop is erased."""
        for block in (self.cond, self.body):
            erase_arguments(block, [k for k in range(self._n_old) if k not in self.kept])
        super().finish()
