"""The MLIR Python APIs the passes use that jaxlib does not publish, behind one module.

passes/ imports MLIR bindings only, never jax (loopfuse's own private jax/jaxlib APIs are behind
``loopfuse._jax_compat``). Each API is looked up and self-tested at first use, the public route first:

  API                                        public route               private route
  `rewrite`: pattern sets and MLIR's greedy  jaxlib.mlir.rewrite        jaxlib.mlir._mlir_libs._mlir.rewrite
  pattern driver (the simplify pass)         (upstream MLIR's module,   (what that module re-exports;
                                             where jaxlib ships it)     jaxlib 0.10 to 0.12)

Where no route loads and passes its self-test, `rewrite` raises `MissingMLIRAPI` saying what each
route gave; a pass that needs it then fails with that message (the default pipeline needs none).

`apply_patterns` runs patterns through it. Without folding (the canonicalization patterns the
structural passes run, which must leave every other op where it is), it configures the greedy
driver by its ``GreedyRewriteConfig`` (jaxlib 0.10 to 0.12: folding, constant CSE and region
simplification off, its default folding hoists every constant to the top of its region); where that
is missing or fails its self-test, it repeats MLIR's walk driver (``walk_and_apply_patterns``, which
never folds) until no pattern applies, and erases the ops left dead, as the greedy driver does.
"""
import functools
import importlib
from collections.abc import Callable, Sequence
from types import ModuleType

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .dead_code import erase_dead_ops

REWRITE_ROUTES = ("jaxlib.mlir.rewrite", "jaxlib.mlir._mlir_libs._mlir.rewrite")
_SELF_TEST_MODULE = """
%a = "test.source"() : () -> tensor<2xf32>
%0 = stablehlo.negate %a : tensor<2xf32>
%c = stablehlo.constant dense<1.0> : tensor<2xf32>
%1 = stablehlo.add %0, %c : tensor<2xf32>
"test.sink"(%1) : (tensor<2xf32>) -> ()
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


def _test_rewrite(api: ModuleType, config=None) -> None:
    """A pattern on stablehlo.negate replaces it by its operand, through the greedy driver; with
    `config` (`_no_folding`'s), the constant stays where it is."""
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
        api.apply_patterns_and_fold_greedily(module.operation, patterns.freeze(), *([config] if config else []))
        names = [op.name for op in module.body.operations]
        kept = ["test.source", "stablehlo.constant", "stablehlo.add", "test.sink"]
        if seen != ["stablehlo.negate"] or sorted(names) != sorted(kept) or (config and names != kept):
            raise AssertionError(f"the pattern saw {seen} and left {module}")


Pattern = tuple[type, Callable]  # (root op class, fn(op, rewriter) -> a falsy value iff it rewrote)


def apply_patterns(op: ir.Operation, patterns: Sequence[Pattern], *, folding: bool = True) -> None:
    """Apply `patterns` to the ops nested in `op` until none applies, erasing ops left dead (MLIR's
    greedy driver); with ``folding=False`` nothing else: no op folded, no constant moved or merged."""
    api = rewrite()
    with op.context:
        config = None if folding else _no_folding(api)
        if folding or config is not None:
            api.apply_patterns_and_fold_greedily(op, _frozen(api, patterns), *([config] if config else []))
            return
        rewrote = [True]
        frozen = _frozen(api, [(root, _noting(fn, rewrote)) for root, fn in patterns])
        while rewrote[0]:   # the walk driver visits each op once: again until nothing applies
            rewrote[0] = False
            api.walk_and_apply_patterns(op, frozen)
        _erase_dead(op)


def _frozen(api: ModuleType, patterns: Sequence[Pattern]):
    pattern_set = api.RewritePatternSet()
    for root, fn in patterns:
        pattern_set.add(root, fn)
    return pattern_set.freeze()


def _noting(fn: Callable, rewrote: list) -> Callable:
    def noted(op, rewriter):
        result = fn(op, rewriter)
        rewrote[0] = rewrote[0] or not result
        return result
    return noted


def _erase_dead(op: ir.Operation) -> None:
    """Erase the dead ops of every block nested in `op`, innermost first."""
    def visit(inner: ir.Operation) -> ir.WalkResult:
        for region in inner.regions:
            for block in region.blocks:
                erase_dead_ops(block)
        return ir.WalkResult.ADVANCE
    op.walk(visit)


@functools.cache
def _no_folding(api: ModuleType):
    """The greedy driver's configuration without folding, constant CSE or region simplification,
    if this jaxlib has one that passes its self-test, else None."""
    try:
        config = api.GreedyRewriteConfig()
        config.enable_folding = False
        config.enable_constant_cse = False
        config.region_simplification_level = api.GreedySimplifyRegionLevel.DISABLED
        _test_rewrite(api, config)
        return config
    except Exception:  # missing or changed in this jaxlib: the walk driver instead
        return None
