"""The MLIR Python APIs the passes use that jaxlib does not publish, behind one module.

passes/ imports MLIR bindings only, never jax (loopfuse's own private jax/jaxlib APIs are behind
``loopfuse._jax_compat``). Each API is looked up and self-tested at first use, the public route first:

  API                                        public route               private route
  `rewrite`: pattern sets and MLIR's greedy  jaxlib.mlir.rewrite        jaxlib.mlir._mlir_libs._mlir.rewrite
  pattern driver (the simplify pass)         (upstream MLIR's module,   (what that module re-exports;
                                             where jaxlib ships it)     jaxlib 0.10 to 0.12)

Where no route loads and passes its self-test, `rewrite` raises `MissingMLIRAPI` saying what each
route gave; a pass that needs it then fails with that message (the default pipeline needs none).
"""
import functools
import importlib
from types import ModuleType

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

REWRITE_ROUTES = ("jaxlib.mlir.rewrite", "jaxlib.mlir._mlir_libs._mlir.rewrite")
_SELF_TEST_MODULE = """
%a = "test.source"() : () -> tensor<2xf32>
%0 = stablehlo.negate %a : tensor<2xf32>
"test.sink"(%0) : (tensor<2xf32>) -> ()
"""


class MissingMLIRAPI(RuntimeError):
    """An MLIR Python API a pass needs is not in this jaxlib (or fails its self-test)."""


def rewrite() -> ModuleType:
    """MLIR's Python rewrite API: ``RewritePatternSet`` (``add(op class, fn)``, ``freeze()``) and
    ``apply_patterns_and_fold_greedily(op, frozen patterns)``."""
    api, failures = _rewrite()
    if api is None:
        raise MissingMLIRAPI("MLIR's Python rewrite API (RewritePatternSet, apply_patterns_and_fold_greedily) is "
                             "not usable in this jaxlib: " + "; ".join(failures))
    return api


@functools.cache
def _rewrite() -> tuple[ModuleType | None, tuple[str, ...]]:
    """(the first route that loads and passes its self-test, or None; why each route before it failed)."""
    failures: list[str] = []
    for route in REWRITE_ROUTES:
        try:
            api = importlib.import_module(route)
            _test_rewrite(api)
            return api, tuple(failures)
        except Exception as e:  # missing, renamed or changed in this jaxlib: try the next route
            failures.append(f"{route}: {type(e).__name__}: {e}")
    return None, tuple(failures)


def _test_rewrite(api: ModuleType) -> None:
    """A pattern on stablehlo.negate replaces it by its operand, through the greedy driver."""
    ctx = ir.Context()
    stablehlo.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    seen = []

    def forward(op, rewriter):
        seen.append(op.name)
        rewriter.replace_op(op, [op.operand])

    with ctx, ir.Location.unknown():
        module = ir.Module.parse(_SELF_TEST_MODULE)
        patterns = api.RewritePatternSet()
        patterns.add(stablehlo.NegOp, forward)
        api.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        if seen != ["stablehlo.negate"] or "stablehlo.negate" in str(module):
            raise AssertionError(f"the pattern saw {seen} and left {module}")
