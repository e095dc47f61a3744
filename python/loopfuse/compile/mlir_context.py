"""One MLIR context with every dialect a traced JAX module can contain, and modules parsed or copied in it."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, sdy, stablehlo

from .. import _jax_compat


def make_context() -> ir.Context:
    """Return a fresh context with func/arith/... (upstream), stablehlo, chlo and sdy loaded."""
    ctx = _jax_compat.mlir_context()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    sdy.register_dialect(ctx)
    return ctx


def copy_module(module: ir.Module) -> ir.Module:
    """A deep copy of `module`, in its context (cloned in memory: no print and re-parse)."""
    copy = ir.Module.create(module.operation.location)
    attrs = module.operation.attributes
    for name in attrs:
        copy.operation.attributes[name] = attrs[name]
    for op in module.body.operations:
        copy.body.append(op.clone(ip=False))
    return copy


def parse_module(text: str, ctx: ir.Context | None = None) -> ir.Module:
    """Parse MLIR text in `ctx` (a new context when None)."""
    ctx = ctx or make_context()
    with ctx:
        return ir.Module.parse(text)
