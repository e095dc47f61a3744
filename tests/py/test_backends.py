"""minimize: every backend (and AD mode) runs the same step, so all reach the same params."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Dataset
from loopfuse.drivers.backends import CompiledLoop, CompiledStep, Forward, GradOnly, Reverse
from loopfuse.drivers.solve import Solution, minimize
from problems import LSQ_PARAMS, assert_trees_equal, lsq_data, lsq_loss, progress_bar_updates

REVERSE = [GradOnly(), CompiledStep(), CompiledLoop(steps=16)]
BACKENDS = REVERSE + [GradOnly(Forward()), CompiledStep(Forward()), CompiledLoop(Forward(), steps=8)]
IDS = ["grad-only", "step", "loop16", "grad-only-fwd", "step-fwd", "loop8-fwd"]
TOL = dict(rtol=1e-4, atol=1e-5)


def mlp_loss(p, batch):
    x, y = batch
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y[:, None]) ** 2)


def _lsq_params():
    return {"w": jnp.zeros(3), "b": jnp.zeros(())}


def _mlp_params():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {"w1": 0.5 * jax.random.normal(k1, (3, 8)), "b1": jnp.zeros(8),
            "w2": 0.5 * jax.random.normal(k2, (8, 1)), "b2": jnp.zeros(1)}


def _solve_all(loss, params, data, optimizer, steps, backends=BACKENDS):
    solutions = [minimize(loss, params, data, optimizer, steps, backend=b) for b in backends]
    for s, b in zip(solutions, backends):
        assert isinstance(s, Solution) and s.backend == b
        assert s.loss_history.shape == (steps,) and s.steps == steps and s.retcode == "max_steps"
        assert s.steps_per_second > 0 and s.compile_seconds > 0
    return solutions


def _assert_agree(solutions):
    ref = solutions[0]
    for s in solutions[1:]:
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), s.params, ref.params)
        np.testing.assert_allclose(s.loss_history, ref.loss_history, **TOL)


def test_least_squares_sgd_all_backends_agree():
    data, params = lsq_data(), _lsq_params()
    solutions = _solve_all(lsq_loss, params, data, optax.sgd(0.1), 44)  # loops of 16 + 16 + 12, 8 * 5 + 4
    _assert_agree(solutions)
    history = solutions[0].loss_history
    np.testing.assert_allclose(history[0], lsq_loss(params, data), rtol=1e-6)  # loss before the first update
    assert np.all(np.diff(history) <= 0) and history[-1] < 1e-2 * history[0]


@pytest.mark.slow     # all six backends agree: the test above; Adam on this MLP: the Dataset test below
def test_mlp_adam_all_backends_agree():
    solutions = _solve_all(mlp_loss, _mlp_params(), lsq_data(), optax.adam(1e-2), 32)
    _assert_agree(solutions)
    assert solutions[0].loss_history[-1] < 0.5 * solutions[0].loss_history[0]


def test_mlp_adam_dataset_all_backends_agree():
    x, y = lsq_data(n=96)
    data = Dataset((x, y), batch_size=32, key=jax.random.key(2))  # 3 batches per epoch, reshuffled
    solutions = _solve_all(mlp_loss, _mlp_params(), data, optax.adam(1e-2), 32, backends=REVERSE)
    _assert_agree(solutions)
    first = mlp_loss(_mlp_params(), data.batch(np.int32(0)))
    np.testing.assert_allclose(solutions[0].loss_history[0], first, rtol=1e-6)
    assert solutions[0].loss_history[-3:].mean() < solutions[0].loss_history[:3].mean()


def _sine_mlp():
    """(loss, params, data) of a 3-16-1 tanh MLP fitting a sine of a projection: the README's figures."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = np.sin(x @ np.array([1.0, -2.0, 0.5], np.float32))
    k1, k2 = jax.random.split(jax.random.key(1))
    params = {"w1": 0.5 * jax.random.normal(k1, (3, 16)), "b1": jnp.zeros(16),
              "w2": 0.5 * jax.random.normal(k2, (16, 1)), "b2": jnp.zeros(1)}
    return mlp_loss, params, (jnp.asarray(x), jnp.asarray(y))


# L-BFGS: test_minimize_lbfgs.py (the step bitwise jax.jit's; the loop's losses bitwise its scan's, to an ftol stop)
@pytest.mark.parametrize("optimizer", [optax.adam(1e-2), pytest.param(optax.lbfgs(), marks=pytest.mark.slow)],
                         ids=["adam", "lbfgs"])
def test_compiled_step_and_compiled_loop_are_bitwise_the_same_to_the_stopping_step(optimizer):
    """CompiledLoop runs CompiledStep's steps in device loops: the same params and loss history bit for
    bit, and a sensitive stop (gtol with L-BFGS, where GradOnly stops at another step) at the same step."""
    loss, params, data = _sine_mlp()
    step, loop = (minimize(loss, params, data, optimizer, 1000, backend=b, until=loopfuse.gtol(1e-3))
                  for b in (CompiledStep(), CompiledLoop(steps=50)))
    assert step.retcode == loop.retcode == "converged" and 100 < step.steps == loop.steps < 1000
    assert_trees_equal((step.params, step.loss_history), (loop.params, loop.loss_history))


@pytest.mark.parametrize("optimizer", [optax.sgd(0.1), optax.adam(1e-2)], ids=["sgd", "adam"])
def test_grad_only_is_the_compiled_step_to_rounding_on_a_well_conditioned_problem(optimizer):
    """GradOnly runs the update outside the compiled derivative, so XLA rounds it otherwise (here the losses
    differ from step 6 or 13 on); on least squares the solves stay within 1e-6 (params) and 1e-5 (losses)."""
    data, params = lsq_data(), LSQ_PARAMS
    grad_only, step = (minimize(lsq_loss, params, data, optimizer, 300, backend=b) for b in (GradOnly(), CompiledStep()))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), grad_only.params, step.params)
    np.testing.assert_allclose(grad_only.loss_history, step.loss_history, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("backend", REVERSE, ids=IDS[:3])
def test_data_none_loss_of_params_only(backend):
    s = minimize(lambda p: jnp.sum((p - 2.0) ** 2), jnp.zeros(3), optimizer=optax.sgd(0.25), steps=20,
                 backend=backend)
    np.testing.assert_allclose(s.params, 2.0, atol=1e-5)
    assert s.loss_history.shape == (20,)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_callers_params_and_batch_stay_alive(backend):
    params, data = _lsq_params(), lsq_data()
    minimize(lsq_loss, params, data, optax.sgd(0.1), steps=3, backend=backend)
    for leaf in jax.tree_util.tree_leaves((params, data)):
        assert not leaf.is_deleted()
    np.testing.assert_array_equal(params["w"], 0.0)


def test_progress_bar_counts_steps_and_shows_each_chunks_last_loss(capsys):
    s = minimize(lsq_loss, _lsq_params(), lsq_data(), optax.sgd(0.1), steps=10, backend=CompiledLoop(steps=4),
                 progress=True)
    h = s.loss_history
    assert progress_bar_updates(capsys.readouterr().err, 10) == [
        (0, ""), (4, f"loss={h[3]:.4g}"), (8, f"loss={h[7]:.4g}"), (10, f"loss={h[9]:.4g}")]


# ---- validation ----------------------------------------------------------------------------
@pytest.mark.parametrize("make, error, match", [
    (lambda: GradOnly("forward"), TypeError,
     "GradOnly\\(ad=...\\) must be Reverse\\(\\) or Forward\\(\\), got 'forward'"),
    (lambda: GradOnly(mode="forward"), TypeError, "unexpected keyword argument 'mode'"),
    (lambda: CompiledStep(ad="forward"), TypeError, "Reverse\\(\\) or Forward\\(\\)"),
    (lambda: CompiledLoop(ad=jax.grad), TypeError, "Reverse\\(\\) or Forward\\(\\)"),
    (lambda: CompiledLoop(steps=0), ValueError, "positive int.*got 0"),
    (lambda: CompiledLoop(steps=2.5), TypeError, "positive int.*got float 2.5"),
    (lambda: CompiledLoop(steps=True), TypeError, "CompiledLoop\\(steps=...\\) must be a positive int, got bool True"),
    (lambda: CompiledLoop(sharding="model"), ValueError, "'data' or 'params', got 'model'"),
    (lambda: CompiledLoop(devices=[]), TypeError, "non-empty list of jax devices"),
    (lambda: CompiledLoop(devices=["cpu:0"]), TypeError, "not devices: \\['cpu:0'\\]"),
    (lambda: CompiledLoop(devices=jax.devices()[0]), TypeError, "list of jax devices"),
])
def test_backend_validation(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_compile_options_only_set_keywords():
    assert CompiledLoop().compile_options() == {} == CompiledStep(memory_budget=1.0).compile_options()
    devices = jax.devices()[:1]
    assert CompiledLoop(devices=devices, sharding="data").compile_options() == {"devices": devices, "sharding": "data"}
    assert CompiledLoop(devices=devices, memory_budget=0).fragment == loopfuse.StepOptions(devices=devices, memory_budget=0.0)


def test_the_backends_options_are_step_options_checked_where_they_are_given():
    """A backend's compile_step keywords are StepOptions fields (type, default, help) and are checked when the
    backend is made (sharding without devices was refused only once minimize compiled)."""
    import dataclasses
    fields = {f.name: f for f in dataclasses.fields(CompiledLoop)}
    for name in ("devices", "sharding", "memory_budget"):
        declared = {f.name: f for f in dataclasses.fields(loopfuse.StepOptions)}[name]
        assert (fields[name].type, fields[name].default, fields[name].kw_only) == (declared.type, declared.default, True)
        assert f"{name}: {declared.metadata['help'][:40]}" in " ".join(CompiledLoop.__doc__.split())
    with pytest.raises(ValueError, match=r"sharding='params' needs devices=\[...\] to shard over"):
        CompiledLoop(sharding="params")


@pytest.mark.parametrize("backend", [GradOnly(Forward()), CompiledStep(Forward()), CompiledLoop(Forward()),
                                     GradOnly(), CompiledLoop(Reverse())],
                         ids=["grad-only-fwd", "step-fwd", "loop-fwd", "grad-only", "loop"])
def test_non_scalar_loss_is_a_clear_error(backend):
    per_example = lambda p, batch: (batch[0] @ p["w"] - batch[1]) ** 2
    with pytest.raises(ValueError, match="must return a real scalar.*float32\\[64\\].*jnp.mean"):
        minimize(per_example, _lsq_params(), lsq_data(), optax.sgd(0.1), steps=2, backend=backend)


@pytest.mark.parametrize("backend", [GradOnly(Forward()), GradOnly(), CompiledLoop(Reverse())],
                         ids=["grad-only-fwd", "grad-only", "loop"])
def test_a_loss_returning_aux_is_a_clear_error(backend):
    """A loss returning (value, aux), as for jax.value_and_grad(has_aux=True), is named (it was a
    TracerArrayConversionError from inside the scalar check); the caller's params are kept."""
    with_aux = lambda p, batch: (lsq_loss(p, batch), {"w": p["w"]})
    params = _lsq_params()
    with pytest.raises(TypeError, match=r"^the loss returned a tuple, not a real scalar.*drop its aux: "
                                        r"minimize\(lambda params, \*args: loss\(params, \*args\)\[0\]"):
        minimize(with_aux, params, lsq_data(), optax.sgd(0.1), steps=2, backend=backend)
    assert not params["w"].is_deleted()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(steps=0), ValueError, "steps must be a positive int, got 0"),
    (dict(steps=2.5), TypeError, "steps must be a positive int, got float 2.5"),
    (dict(steps=True), TypeError, "steps must be a positive int, got bool True"),
    (dict(checkpoint_every=4), ValueError, "checkpoint_every= needs checkpoint_dir="),
    (dict(backend="compiled"), TypeError, "backend must be GradOnly\\(\\), CompiledStep\\(\\) or CompiledLoop\\(\\)"),
    (dict(backend=Forward()), TypeError, "backend must be"),
    (dict(optimizer=optax.sgd), TypeError, "optax.GradientTransformation"),
])
def test_minimize_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        minimize(lsq_loss, _lsq_params(), lsq_data(), **kwargs)
