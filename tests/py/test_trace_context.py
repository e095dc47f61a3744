"""A Step traces again when jax's trace-time configuration changes (x64, dtype promotion, matmul
precision, ...), as jax.jit does: its executables are keyed on jax's trace context too."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import CompiledLoop, CompiledStep
from problems import assert_trees_equal


@pytest.fixture
def enable_x64():
    """Turns jax_enable_x64 on when called (globally, as jax.config.update does); restored after the test."""
    previous = jax.config.jax_enable_x64
    yield lambda: jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_x64", previous)


def _loss(p, d):
    t = jnp.linspace(0.0, 1.0, 3)        # float32, or float64 under x64
    return jnp.sum((p * t - d) ** 2)


def _step(p, d):
    loss, g = jax.value_and_grad(_loss)(p, d)
    return p - 0.1 * g, {"loss": loss}


def test_a_step_traces_again_when_x64_is_turned_on(enable_x64):
    step = loopfuse.compile_step(_step, donate=False)
    p, d = jnp.float32(0.3), jnp.ones(3, jnp.float32)
    assert_trees_equal(step(p, d), jax.jit(_step)(p, d))
    enable_x64()
    expected = jax.jit(_step)(p, d)
    assert expected[1]["loss"].dtype == np.float64
    for _ in range(2):                   # the first call, then the C++ dispatcher's
        assert_trees_equal(step(p, d), expected)
    assert step.compile_count == 2
    jax.config.update("jax_enable_x64", False)
    assert_trees_equal(step(p, d), jax.jit(_step)(p, d))   # the first program again
    assert step.compile_count == 2


def test_strict_dtype_promotion_raises_as_jax_jit():
    def mixed(p, d):
        return p, {"loss": jnp.sum(p * d)}   # bfloat16 * float32: an implicit promotion
    step = loopfuse.compile_step(mixed, donate=False)
    p, d = jnp.ones(3, jnp.bfloat16), jnp.ones(3, jnp.float32)
    assert_trees_equal(step(p, d), jax.jit(mixed)(p, d))
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception) as expected:
            jax.jit(mixed)(p, d)
        assert expected.type.__name__ == "TypePromotionError"
        with pytest.raises(expected.type):
            step(p, d)
    assert_trees_equal(step(p, d), jax.jit(mixed)(p, d))
    assert step.compile_count == 1


def test_another_default_matmul_precision_compiles_another_program():
    def matmul(w, x):
        return w, {"y": x @ w}
    step = loopfuse.compile_step(matmul, donate=False)
    w, x = jnp.ones((4, 4)), jnp.arange(8.0).reshape(2, 4)
    step(w, x)
    with jax.default_matmul_precision("highest"):
        assert_trees_equal(step(w, x), jax.jit(matmul)(w, x))
        assert "HIGHEST" in step.lower(w, x)["00-traced"]
    assert step.compile_count == 2


def _reference_solve(opt, p, d, steps: int):
    """The params and losses of `steps` updates of `opt`, each a jax.jit call."""
    @jax.jit
    def update(p, s, d):
        loss, g = jax.value_and_grad(_loss)(p, d)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss
    s, losses = opt.init(p), []
    for _ in range(steps):
        p, s, loss = update(p, s, d)
        losses.append(loss)
    return p, np.stack(losses)


@pytest.mark.parametrize("backend", [CompiledLoop(), CompiledStep()], ids=["loop", "step"])
def test_minimize_solves_again_when_x64_is_turned_on(backend, enable_x64):
    opt, p, d = optax.adam(0.1), jnp.float32(0.3), jnp.ones(3, jnp.float32)
    for x64 in (False, True):
        if x64:
            enable_x64()
        sol = loopfuse.minimize(_loss, p, d, opt, steps=3, backend=backend)
        assert sol.loss_history.dtype == (np.float64 if x64 else np.float32)
        assert_trees_equal((sol.params, sol.loss_history), _reference_solve(opt, p, d, 3))
