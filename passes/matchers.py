"""Matchers on values and ops shared by the rewriting passes: one reader for each fact (a producer,
a splat, the rows a slice takes)."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

# the ops that compute each element of their result from their operands' elements at its index
ELEMENTWISE = frozenset([f"stablehlo.{n}" for n in (
    "abs add and atan2 cbrt ceil clamp compare complex convert cosine count_leading_zeros divide exponential "
    "exponential_minus_one floor imag is_finite log log_plus_one logistic maximum minimum multiply negate not or "
    "popcnt power real reduce_precision remainder round_nearest_afz round_nearest_even rsqrt select shift_left "
    "shift_right_arithmetic shift_right_logical sign sine sqrt subtract tan tanh xor").split()]
    + [f"chlo.{n}" for n in ("acos acosh asin asinh atan atanh bessel_i1e conj cosh digamma erf erf_inv erfc "
                             "is_inf is_neg_inf is_pos_inf lgamma next_after polygamma sinh square tan zeta").split()]
    + ["sdy.sharding_constraint"])


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


def splat_value(value: ir.Value) -> int | float | None:
    """The number an integer or float splat constant, possibly broadcast (any number of times), is filled
    with, else None."""
    while (broadcast := producer(value, stablehlo.BroadcastInDimOp)) is not None:
        value = broadcast.operands[0]
    attr = splat(value)
    return None if attr is None else attr.value


def slice_attrs(op: ir.Operation) -> tuple[list[int], list[int], list[int]] | None:
    """(start indices, limit indices, strides) of a ``stablehlo.slice``, else None."""
    if op.name != "stablehlo.slice":
        return None
    start, limit, strides = (list(ir.DenseI64ArrayAttr(op.attributes[name]))
                             for name in ("start_indices", "limit_indices", "strides"))
    return start, limit, strides


def rows(op: ir.Operation) -> tuple[int, int] | None:
    """(first, last) when `op` is a unit-stride ``stablehlo.slice`` of whole rows of its operand's
    first axis (statically shaped), rows first .. last - 1; of a 1-D operand, its elements first .. last - 1.

    Examples:
        >>> from loopfuse.compile.mlir_context import parse_module
        >>> m = parse_module('''
        ... func.func @main(%x: tensor<4x3xf32>, %y: tensor<9xf32>) -> (tensor<2x3xf32>, tensor<2x2xf32>, tensor<4xf32>) {
        ...   %0 = stablehlo.slice %x [1:3, 0:3] : (tensor<4x3xf32>) -> tensor<2x3xf32>
        ...   %1 = stablehlo.slice %x [1:3, 1:3] : (tensor<4x3xf32>) -> tensor<2x2xf32>
        ...   %2 = stablehlo.slice %y [2:6] : (tensor<9xf32>) -> tensor<4xf32>
        ...   return %0, %1, %2 : tensor<2x3xf32>, tensor<2x2xf32>, tensor<4xf32>
        ... }''')
        >>> [rows(op.operation) for op in list(m.body.operations[0].regions[0].blocks[0].operations)[:3]]
        [(1, 3), None, (2, 6)]
    """
    attrs = slice_attrs(op)
    if attrs is None or not (isinstance(t := op.operands[0].type, ir.RankedTensorType) and t.has_static_shape):
        return None
    start, limit, strides = attrs
    if strides != [1] * t.rank or start[1:] != [0] * (t.rank - 1) or limit[1:] != list(t.shape[1:]):
        return None
    return start[0], limit[0]


def sliced_rows(value: ir.Value) -> tuple[ir.Value, int, int] | None:
    """(x, first, last) when `value` is rows first .. last - 1 of x (a `rows` slice), possibly reshaped."""
    while (reshape := producer(value, stablehlo.ReshapeOp)) is not None:
        value = reshape.operands[0]
    op = producer(value)
    bounds = None if op is None else rows(op)
    if op is None or bounds is None:
        return None
    return op.operands[0], *bounds
