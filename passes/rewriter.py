"""The small rewriter layer the structural passes build with: values made at one insertion point.

`Builder` holds an insertion point and a location and makes the handful of values a loop rewrite
needs (scalars, zero buffers, a row of a stacked buffer read or written at a dynamic index, a stack
of equal-typed values, a clone of an op on other operands); `erase` removes ops whose results are
no longer used, users before producers. Each is one StableHLO op or a short fixed sequence, exact by
construction: reshape, slice, concatenate and dynamic_update_slice only move elements.
"""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ._concat import FAN_IN

I32 = "i32"


class Builder:
    """Makes values before `before` (an op), with `before`'s location unless another is given."""

    def __init__(self, ip: ir.InsertionPoint, location: ir.Location):
        self.ip, self.location = ip, location

    @classmethod
    def before(cls, op: ir.Operation) -> "Builder":
        return cls(ir.InsertionPoint(op), op.location)

    @classmethod
    def at_end(cls, block: ir.Block, location: ir.Location) -> "Builder":
        return cls(ir.InsertionPoint(block), location)

    def __enter__(self):
        self._ip, self._loc = self.ip, self.location
        self._ip.__enter__()
        self._loc.__enter__()
        return self

    def __exit__(self, *exc):
        self._loc.__exit__(*exc)
        self._ip.__exit__(*exc)

    # ---- values ----------------------------------------------------------------------------
    @staticmethod
    def i32_type() -> ir.RankedTensorType:
        return ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))

    def scalar(self, value: int, t: ir.RankedTensorType | None = None) -> ir.Value:
        """A 0-d integer constant (i32 unless `t` says otherwise)."""
        t = t or self.i32_type()
        with self:
            return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                t, ir.IntegerAttr.get(t.element_type, value))).result

    def zeros(self, t: ir.RankedTensorType) -> ir.Value:
        """A tensor of type `t` filled with zero (integer, float or complex elements)."""
        with self:
            return stablehlo.BroadcastInDimOp(t, _zero(t.element_type), []).result

    def reshape(self, value: ir.Value, shape: list) -> ir.Value:
        t = ir.RankedTensorType(value.type)
        if list(t.shape) == list(shape):
            return value
        with self:
            return stablehlo.ReshapeOp(ir.RankedTensorType.get(list(shape), t.element_type), value).result

    def stack(self, values: list) -> ir.Value:
        """`values` (one type) as one tensor with a new leading axis, ``[len(values), *shape]``;
        built as concatenates of at most `_concat.FAN_IN` operands."""
        t = ir.RankedTensorType(values[0].type)
        pieces = [self.reshape(v, [1, *t.shape]) for v in values]
        with self:
            while len(pieces) > 1:
                pieces = [chunk[0] if len(chunk := pieces[i:i + FAN_IN]) == 1 else
                          stablehlo.ConcatenateOp(chunk, 0).result for i in range(0, len(pieces), FAN_IN)]
        return pieces[0]

    def row(self, stacked: ir.Value, index: ir.Value) -> ir.Value:
        """Row `index` (a 0-d i32) of `stacked` (``[n, *shape]``), as a ``shape`` tensor."""
        t = ir.RankedTensorType(stacked.type)
        zero = self.scalar(0)
        with self:
            piece = stablehlo.DynamicSliceOp(stacked, [index] + [zero] * (t.rank - 1),
                                             ir.DenseI64ArrayAttr.get([1, *t.shape[1:]])).result
        return self.reshape(piece, list(t.shape[1:]))

    def static_row(self, stacked: ir.Value, index: int) -> ir.Value:
        """Row `index` (a Python int) of `stacked`, as a ``shape`` tensor."""
        t = ir.RankedTensorType(stacked.type)
        with self:
            piece = stablehlo.SliceOp(stacked, ir.DenseI64ArrayAttr.get([index] + [0] * (t.rank - 1)),
                                      ir.DenseI64ArrayAttr.get([index + 1, *t.shape[1:]]),
                                      ir.DenseI64ArrayAttr.get([1] * t.rank)).result
        return self.reshape(piece, list(t.shape[1:]))

    def write_row(self, stacked: ir.Value, value: ir.Value, index: ir.Value) -> ir.Value:
        """`stacked` with row `index` (a 0-d i32) replaced by `value`."""
        t = ir.RankedTensorType(stacked.type)
        row = self.reshape(value, [1, *t.shape[1:]])
        zero = self.scalar(0)
        with self:
            return stablehlo.DynamicUpdateSliceOp(stacked, row, [index] + [zero] * (t.rank - 1)).result

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        with self:
            return stablehlo.AddOp(a, b).result

    def subtract(self, a: ir.Value, b: ir.Value) -> ir.Value:
        with self:
            return stablehlo.SubtractOp(a, b).result

    def less(self, a: ir.Value, b: ir.Value) -> ir.Value:
        with self:
            return stablehlo.CompareOp(a, b, stablehlo.ComparisonDirectionAttr.get("LT")).result

    def clone(self, op: ir.Operation, operands: list, captured: dict | None = None) -> ir.Operation:
        """A copy of `op` here reading `operands`; values its regions use from outside it are
        replaced by `captured` (old value -> new value) where given."""
        with self:
            new = op.clone(ip=self.ip)
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


def erase(ops: list) -> None:
    """Erase `ops` (whose results are used only by each other), latest first."""
    for op in reversed(ops):
        op.erase()


def _zero(et: ir.Type) -> ir.Value:
    """A 0-d zero of element type `et`: integer, float, or complex (built from two real zeros)."""
    if isinstance(et, ir.ComplexType):
        real = _zero(et.element_type)
        return stablehlo.ComplexOp(real, real).result
    zero = ir.IntegerAttr.get(et, 0) if isinstance(et, ir.IntegerType) else ir.FloatAttr.get(et, 0.0)
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], et), zero)).result
