"""simplify: exact algebraic simplification of StableHLO.

Rewrites, with MLIR's greedy pattern driver (which also erases ops left dead):

* ``x * 1``, ``1 * x`` -> ``x`` (integers and floats; IEEE ``x * 1`` is ``x``, NaN stays NaN).
* ``x + 0``, ``0 + x``, ``x - 0`` -> ``x`` for integers. For floats only ``x + (-0.0)``,
  ``(-0.0) + x`` and ``x - (+0.0)`` are exactly ``x``: ``x + (+0.0)`` turns ``-0.0`` into
  ``+0.0``, so it is left alone (as is ``x - (-0.0)``).
  A "one"/"zero" is a splat constant, possibly behind ``broadcast_in_dim`` (still a splat).
* ``broadcast_in_dim(broadcast_in_dim(x, d1), d2)`` -> ``broadcast_in_dim(x, d2[d1])``: each
  dimension of ``x`` lands where the two broadcasts put it, size-1 dims stay broadcast.
* ``reshape(reshape(x))`` -> ``reshape(x)``, a reshape to its operand's type -> ``x``: a reshape
  keeps the row-major element order, so only the final shape matters (`canonicalize.RESHAPE_PATTERNS`).
* ``transpose(transpose(x, p1), p2)`` -> ``transpose(x, p1[p2])``; the identity transpose -> ``x``.
* ``convert`` to its operand's type -> ``x``.

Only ops whose operands and results are statically shaped ranked tensors are touched, and a
value is only replaced by one of the same type. Inner ops with other users are kept.

Exact on StableHLO (the reference interpreter gives the same bits), but not on what XLA computes:
XLA compiles the simplified program with other fusions and reduction orders, and the last bits of
a result can change (a 2-layer transformer trained with AdamW: its state after one step differed
from ``jax.jit``'s by up to 3.8e-5). So it is opt-in (``passes=["simplify"]``), outside the default
pipeline; see BENCHMARKS.md for what it gains.
"""
import math
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ._mlir_compat import apply_patterns
from .canonicalize import NO_MATCH, RESHAPE_PATTERNS, fold_into_producer, forward, same_type, static
from .matchers import splat_value
from .module_pass import ModulePass


def _is_int(value: ir.Value) -> bool:
    return isinstance(value.type.element_type, ir.IntegerType)


def _is_one(value: ir.Value) -> bool:
    return splat_value(value) == 1


def _is_zero(value: ir.Value, negative: bool) -> bool:
    """All zeros; for floats, all zeros of the given sign."""
    s = splat_value(value)
    return s == 0 and (_is_int(value) or (math.copysign(1.0, s) < 0) == negative)


def _identity_operand(op, rewriter, is_identity):
    """op(x, e) -> x and op(e, x) -> x for a commutative op whose identity `is_identity` recognizes."""
    lhs, rhs = op.operands
    if not static(op):
        return NO_MATCH
    if is_identity(rhs):
        return forward(rewriter, op, lhs)
    if is_identity(lhs):
        return forward(rewriter, op, rhs)
    return NO_MATCH


def _mul_one(op, rewriter):
    """x * 1 -> x, 1 * x -> x."""
    return _identity_operand(op, rewriter, _is_one)


def _add_zero(op, rewriter):
    """x + 0 -> x, 0 + x -> x (integers); the same with -0.0 (floats)."""
    return _identity_operand(op, rewriter, lambda v: _is_zero(v, negative=True))


def _sub_zero(op, rewriter):
    """x - 0 -> x (integers); x - (+0.0) -> x (floats)."""
    lhs, rhs = op.operands
    if not static(op) or not _is_zero(rhs, negative=False):
        return NO_MATCH
    return forward(rewriter, op, lhs)


def _broadcast_broadcast(op, rewriter):
    """broadcast_in_dim(broadcast_in_dim(x, d1), d2) -> broadcast_in_dim(x, d2[d1])."""
    def build(inner):
        outer_dims = list(op.broadcast_dimensions)
        dims = [outer_dims[d] for d in inner.broadcast_dimensions]
        return stablehlo.BroadcastInDimOp(op.result.type, inner.operand, dims)
    return fold_into_producer(op, rewriter, build)


def _transpose_transpose(op, rewriter):
    """transpose(transpose(x, p1), p2) -> transpose(x, p1[p2])."""
    def build(inner):
        inner_perm = list(inner.permutation)
        perm = [inner_perm[p] for p in op.permutation]
        return stablehlo.TransposeOp(inner.operand, perm, results=[op.result.type])
    return fold_into_producer(op, rewriter, build)


def _transpose_identity(op, rewriter):
    """transpose(x, [0, 1, ...]) -> x."""
    if not static(op) or list(op.permutation) != list(range(len(op.permutation))):
        return NO_MATCH
    return forward(rewriter, op, op.operand)


PATTERNS = [
    (stablehlo.MulOp, _mul_one),
    (stablehlo.AddOp, _add_zero),
    (stablehlo.SubtractOp, _sub_zero),
    (stablehlo.BroadcastInDimOp, _broadcast_broadcast),
    *RESHAPE_PATTERNS,
    (stablehlo.ConvertOp, same_type),
    (stablehlo.TransposeOp, _transpose_transpose),
    (stablehlo.TransposeOp, _transpose_identity),
]


@dataclass(frozen=True)
class Simplify(ModulePass):
    name = "simplify"
    summary = "Exact algebraic simplification (x*1, x+(-0.0), reshape/transpose/broadcast chains)"

    def apply(self, module_op: ir.Operation) -> None:
        apply_patterns(module_op, PATTERNS)
