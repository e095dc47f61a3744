"""Matchers on values shared by the rewriting passes."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo


def producer(value: ir.Value, op_class: type | None = None) -> ir.Operation | None:
    """The op that defines `value` (None for a block argument), if it is an `op_class` when given."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner.operation
    return op if op_class is None or isinstance(op.opview, op_class) else None


def splat(value: ir.Value) -> ir.IntegerAttr | ir.FloatAttr | None:
    """The scalar attribute an integer or float splat ``stablehlo.constant`` is filled with, else None."""
    const = producer(value, stablehlo.ConstantOp)
    if const is None or not isinstance(value.type.element_type, (ir.IntegerType, ir.FloatType)):
        return None
    attr = const.attributes["value"]  # may be a dense_resource blob, which is never read here
    if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
        return None
    scalar = attr.get_splat_value()  # downcast by the bindings: an IntegerAttr or a FloatAttr
    return scalar if isinstance(scalar, (ir.IntegerAttr, ir.FloatAttr)) else None
