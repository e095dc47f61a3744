"""_jax_compat: the private jax/jaxlib APIs pass their self-test on the installed jax, and the
public fallbacks (forced, or taken when a self-test fails) give the same results."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopfuse
from loopfuse import _jax_compat
from problems import assert_trees_equal


CACHES = [_jax_compat._array_result_handler, _jax_compat._register_jax_dialects, _jax_compat._cpp_dispatch,
          _jax_compat._prune]
ROUTES = ("result_handler", "dialects", "dispatch", "dce")


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
