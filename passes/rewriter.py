"""The small rewriter layer the structural passes build with: the values a loop rewrite makes.

Each function makes one StableHLO op or a short fixed sequence at the current insertion point and
location (inside ``with ir.InsertionPoint(...), location:``): scalars, zero buffers, a row of a
stacked buffer read or written at a dynamic index, a stack of equal-typed values, a clone of an op
on other operands. `Builder` holds an insertion point and a location for code that builds at
several places in turn. All are exact by construction: reshape, slice, concatenate and
dynamic_update_slice only move elements.
"""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ._concat import FAN_IN


def i32() -> ir.RankedTensorType:
    return ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))


def scalar(value: int, t: ir.RankedTensorType | None = None) -> ir.Value:
    """A 0-d integer constant (i32 unless `t` says otherwise)."""
    t = t or i32()
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(t.element_type, value))).result


def zeros(t: ir.RankedTensorType) -> ir.Value:
    """A tensor of type `t` filled with zero (integer, float or complex elements)."""
    return stablehlo.BroadcastInDimOp(t, zero(t.element_type), []).result


def zero(et: ir.Type) -> ir.Value:
    """A 0-d zero of element type `et`: integer, float, or complex (built from two real zeros)."""
    if isinstance(et, ir.ComplexType):
        real = zero(et.element_type)
        return stablehlo.ComplexOp(real, real).result
    value = ir.IntegerAttr.get(et, 0) if isinstance(et, ir.IntegerType) else ir.FloatAttr.get(et, 0.0)
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], et), value)).result


def reshape(value: ir.Value, shape: list) -> ir.Value:
    """`value` with `shape` (itself when it has it already)."""
    t = ir.RankedTensorType(value.type)
    if list(t.shape) == list(shape):
        return value
    return stablehlo.ReshapeOp(ir.RankedTensorType.get(list(shape), t.element_type), value).result


def stack(values: list) -> ir.Value:
    """`values` (one type) as one tensor with a new leading axis, ``[len(values), *shape]``; built
    as concatenates of at most `_concat.FAN_IN` operands."""
    t = ir.RankedTensorType(values[0].type)
    pieces = [reshape(v, [1, *t.shape]) for v in values]
    while len(pieces) > 1:
        pieces = [chunk[0] if len(chunk := pieces[i:i + FAN_IN]) == 1 else stablehlo.ConcatenateOp(chunk, 0).result
                  for i in range(0, len(pieces), FAN_IN)]
    return pieces[0]


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
    """Rows `start` .. `stop` - 1 (Python ints) of `stacked` (``[n, *shape]``), as ``[stop - start, *shape]``."""
    t = ir.RankedTensorType(stacked.type)
    return stablehlo.SliceOp(stacked, ir.DenseI64ArrayAttr.get([start] + [0] * (t.rank - 1)),
                             ir.DenseI64ArrayAttr.get([stop, *t.shape[1:]]), ir.DenseI64ArrayAttr.get([1] * t.rank)).result


def write_row(stacked: ir.Value, value: ir.Value, index: ir.Value) -> ir.Value:
    """`stacked` with row `index` (a 0-d i32) replaced by `value` (any shape of the row's size)."""
    t = ir.RankedTensorType(stacked.type)
    return write_rows(stacked, reshape(value, [1, *t.shape[1:]]), index)


def write_rows(stacked: ir.Value, rows: ir.Value, index: ir.Value) -> ir.Value:
    """`stacked` with the rows from `index` (a 0-d i32) on replaced by `rows` (``[m, *shape]``)."""
    t = ir.RankedTensorType(stacked.type)
    start = [index] + ([scalar(0)] * (t.rank - 1) if t.rank > 1 else [])
    return stablehlo.DynamicUpdateSliceOp(stacked, rows, start).result


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
