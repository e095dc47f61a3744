"""_jax_compat: the private jax/jaxlib APIs pass their self-test on the installed jax, and the
public fallbacks (forced, or taken when a self-test fails) give the same results."""
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopfuse
from loopfuse import _jax_compat
from problems import assert_trees_equal


CACHES = [_jax_compat._array_result_handler, _jax_compat._register_jax_dialects, _jax_compat._cpp_dispatch,
          _jax_compat._prune, _jax_compat._trace_context]
ROUTES = ("result_handler", "dialects", "dispatch", "dce", "trace_context")


@pytest.fixture
def fresh_detection():
    """Forget which route each feature took (before and after the test)."""
    for c in CACHES:
        c.cache_clear()
    yield
    for c in CACHES:
        c.cache_clear()


def _sgd_loop(s, b):
    return {"w": s["w"] - 0.1 * (s["w"] - b), "n": s["n"] + 1}, {"loss": jnp.sum((s["w"] - b) ** 2)}


def _run_loop():
    state = {"w": jnp.arange(4.0), "n": jnp.zeros((), jnp.int32)}
    return loopfuse.compile_step(_sgd_loop, devices=jax.devices()[:1]).loop(3)(state, jnp.ones(4))


def _assert_equals_jax_jit(got):
    """`got` (a `_run_loop` result) is bitwise three `jax.jit(_sgd_loop)` steps with their stacked aux."""
    state, losses, step = {"w": jnp.arange(4.0), "n": jnp.zeros((), jnp.int32)}, [], jax.jit(_sgd_loop)
    for _ in range(3):
        state, aux = step(state, jnp.ones(4))
        losses.append(aux["loss"])
    assert_trees_equal(got, (state, {"loss": jnp.stack(losses)}))


def test_private_apis_pass_their_self_test_on_the_installed_jax(fresh_detection):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _jax_compat.status() == dict.fromkeys(ROUTES, "private")


def test_private_apis_pass_their_self_test_with_x64_on(fresh_detection):
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _jax_compat.status() == dict.fromkeys(ROUTES, "private")
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_a_first_step_call_warns_nothing_from_loopfuse(fresh_detection):
    """Nor a deprecation (jax 0.12 deprecates jax.sharding.SingleDeviceSharding): the self-tests, a step
    on a Dataset, a checkpoint's restore target of a host leaf."""
    from loopfuse.state.checkpoint import Checkpoints
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_loop()
        loopfuse.compile_step(lambda total, b: (total + b.sum(), {}))(
            jnp.float32(0), loopfuse.Dataset(np.ones(8, np.float32), batch_size=2))
        Checkpoints._abstract(np.float32(0))
    package = os.path.dirname(loopfuse.__file__)
    assert [str(w.message) for w in caught if w.filename.startswith(package)] == []


def test_the_fallback_trace_context_follows_x64_and_dtype_promotion(monkeypatch):
    monkeypatch.setattr(_jax_compat, "_trace_context", lambda: None)
    before = _jax_compat.trace_context()
    with jax.enable_x64(not jax.config.jax_enable_x64):
        assert _jax_compat.trace_context() != before
    with jax.numpy_dtype_promotion("strict"):
        assert _jax_compat.trace_context() != before
    assert _jax_compat.trace_context() == before


def test_forced_fallback_gives_the_same_results(fresh_detection, monkeypatch):
    expected = _run_loop()
    monkeypatch.setenv(_jax_compat.FORCE_ENV, "fallback")
    for c in CACHES:
        c.cache_clear()
    assert _jax_compat.status() == dict.fromkeys(ROUTES, "fallback")
    got = _run_loop()
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        assert a.dtype == b.dtype and a.sharding == b.sharding
    _assert_equals_jax_jit(expected)
    _assert_equals_jax_jit(got)


def test_a_failing_self_test_warns_and_falls_back(fresh_detection, monkeypatch):
    def renamed():
        raise AttributeError("module 'jaxlib._jax' has no attribute 'array_result_handler'")
    monkeypatch.setattr(_jax_compat, "_load_array_result_handler", renamed)
    with pytest.warns(UserWarning, match="array_result_handler.*failed its self-test.*AttributeError.*public fallback"):
        assert _jax_compat.status()["result_handler"] == "fallback"
    _assert_equals_jax_jit(_run_loop())


def test_the_installed_jax_is_inside_the_tested_bounds_of_pyproject():
    import pathlib
    import tomllib

    import jaxlib
    from packaging.requirements import Requirement
    pyproject = pathlib.Path(__file__).parents[2] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    requirements = {r.name: r for r in map(Requirement, dependencies)}
    for name, version in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
        assert any(s.operator == "<" for s in requirements[name].specifier), f"{name} has no upper bound"
        assert requirements[name].specifier.contains(version), f"{name} {version} outside {requirements[name]}"


# ---- passes/_mlir_compat: the MLIR Python APIs jaxlib does not publish ---------------------------
SIMPLIFIABLE = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<2xf32>
  %0 = stablehlo.multiply %x, %one : tensor<2xf32>
  return %0 : tensor<2xf32>
}"""


@pytest.fixture
def rewrite_routes(monkeypatch):
    """Set the routes `_mlir_compat.rewrite` tries (forgetting the one found, before and after)."""
    from loopfuse.passes import _mlir_compat
    _mlir_compat._rewrite.cache_clear()
    yield lambda *routes: monkeypatch.setattr(_mlir_compat, "REWRITE_ROUTES", routes)
    _mlir_compat._rewrite.cache_clear()


def test_the_mlir_rewrite_api_passes_its_self_test(rewrite_routes):
    from loopfuse.passes import _mlir_compat
    api = _mlir_compat.rewrite()
    assert api.__name__ in _mlir_compat.REWRITE_ROUTES and callable(api.apply_patterns_and_fold_greedily)


def test_a_route_that_fails_its_self_test_gives_way_to_the_next(rewrite_routes):
    from loopfuse.passes import _mlir_compat
    rewrite_routes("json", _mlir_compat.REWRITE_ROUTES[-1])     # a module without the API, then the real one
    api, failures = _mlir_compat._rewrite()
    assert api.__name__ == _mlir_compat.REWRITE_ROUTES[-1]
    assert failures == ("json: AttributeError: module 'json' has no attribute 'RewritePatternSet'",)


def test_without_the_rewrite_api_simplify_fails_naming_it(rewrite_routes):
    from loopfuse.compile.mlir_context import parse_module
    from loopfuse.compile.pass_manager import PassFailure, run_pass
    from loopfuse.passes import Simplify
    rewrite_routes("jaxlib.mlir.no_such_rewrite")
    with pytest.raises(PassFailure, match="MLIR's Python rewrite API .* is not usable in this jaxlib: "
                                          "jaxlib.mlir.no_such_rewrite: ModuleNotFoundError"):
        run_pass(parse_module(SIMPLIFIABLE), Simplify())
