"""One MLIR context with every dialect a traced JAX module can contain."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, sdy, stablehlo

from . import _jax_compat


def make_context() -> ir.Context:
    """Return a fresh context with func/arith/... (upstream), stablehlo, chlo and sdy loaded."""
    ctx = _jax_compat.mlir_context()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    sdy.register_dialect(ctx)
    return ctx


def parse_module(text: str, ctx: ir.Context | None = None) -> ir.Module:
    """Parse MLIR text in `ctx` (a new context when None)."""
    ctx = ctx or make_context()
    with ctx:
        return ir.Module.parse(text)
