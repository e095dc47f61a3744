"""until= and stop_on_nonfinite= in `minimize` and `fit`: the run ends after the step that asks it to.

References: the same run without a stop, of as many steps as the stopped one ran (bit for bit),
and, across minimize's backends, each other (a device loop stops where the host check stops).
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.errors import AuxPathError
from loopfuse.drivers.backends import CompiledLoop, CompiledStep, GradOnly
from loopfuse.drivers.solve import minimize
from problems import LSQ_PARAMS, assert_trees_equal, batch, between, fresh, init_state, lsq_data, lsq_loss, train_step

BACKENDS = [GradOnly(), CompiledStep(), CompiledLoop(steps=8)]
IDS = ["grad-only", "step", "loop8"]


def _solve(steps, backend, lr=0.1, **kwargs):
    return minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(lr), steps, backend=backend, **kwargs)


@pytest.fixture(scope="module")
def losses():
    """The loss history of 40 unstopped steps (strictly decreasing)."""
    history = _solve(40, GradOnly(), stop_on_nonfinite=False).loss_history
    assert (np.diff(history) < 0).all()
    return history


# ---- minimize --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_minimize_converging_mid_chunk_stops_there_on_every_backend(backend, losses):
    threshold = between(losses, 13)                          # step 13: the 5th of CompiledLoop's 2nd chunk
    s = _solve(40, backend, until=lambda params, loss: loss < threshold)
    assert s.steps == 13 and s.retcode == "converged" and s.loss_history.shape == (13,)
    np.testing.assert_allclose(s.loss_history, losses[:13], rtol=1e-5)
    plain = _solve(13, backend, stop_on_nonfinite=False)      # the converged step's update is applied
    assert plain.retcode == "max_steps" and plain.steps == 13
    assert_trees_equal((s.params, s.loss_history), (plain.params, plain.loss_history))


def test_minimize_converging_on_the_last_step_of_a_chunk_runs_no_further_chunk(losses):
    threshold = between(losses, 12)                          # the end of the 3rd loop of 4 steps
    s = _solve(40, CompiledLoop(steps=4), until=lambda params, loss: loss < threshold)
    assert s.steps == 12 and s.retcode == "converged" and s.loss_history.shape == (12,)


def test_minimize_until_sees_the_params_before_the_update(losses):
    threshold = between(losses, 13)
    s = _solve(40, CompiledLoop(steps=8), until=lambda params, loss: lsq_loss(params, lsq_data()) < threshold)
    assert s.steps == 13 and s.retcode == "converged"


def test_minimize_loops_stop_on_the_flag_of_their_step_and_return_only_the_loss(losses):
    """The flag of `until` (on the params before the update) is the device loop's own stop: an aux leaf
    of the step that its loop does not return (no flag history to read back and drop)."""
    from loopfuse.drivers.solve import _flag, _program
    backend, opt, threshold = CompiledLoop(steps=8), optax.sgd(0.1), between(losses, 5)
    until = lambda params, loss: loss < threshold
    s = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), opt, 40, backend=backend, until=until)
    init, program = _program(lsq_loss, True, opt, backend, until)
    loop = program.loop(8, until=_flag, stop_on_nonfinite=True)
    _, aux, steps, stopped = loop(init(LSQ_PARAMS, lsq_data()), lsq_data())
    assert loop.compile_count == 1 and (int(steps), bool(stopped)) == (s.steps, True) == (5, True)
    assert jax.tree_util.tree_leaves(aux) == [aux["loss"]]
    np.testing.assert_array_equal(np.asarray(aux["loss"])[:5], s.loss_history)


@pytest.fixture(scope="module")
def diverging():
    """The loss history of 40 unstopped steps that diverge (the loss of step 36 is the first inf)."""
    reference = _solve(40, GradOnly(), lr=1.5, stop_on_nonfinite=False)
    assert reference.retcode == "max_steps" and reference.steps == 40
    assert np.isfinite(reference.loss_history[:35]).all() and not np.isfinite(reference.loss_history[35])
    return reference.loss_history


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_minimize_diverging_stops_after_the_first_non_finite_loss_on_every_backend(backend, diverging):
    s = _solve(40, backend, lr=1.5)
    assert s.retcode == "non_finite" and s.steps == 36 and s.loss_history.shape == (36,)  # mid-chunk in loop8
    assert not np.isfinite(s.loss_history[-1])
    np.testing.assert_allclose(s.loss_history[:-1], diverging[:35], rtol=1e-4)


def test_minimize_non_finite_takes_precedence_over_until_at_the_same_step():
    s = _solve(40, CompiledLoop(steps=8), lr=1.5, until=lambda params, loss: ~jnp.isfinite(loss))
    assert s.retcode == "non_finite" and s.steps == 36
    s = _solve(40, CompiledLoop(steps=8), lr=1.5, until=lambda params, loss: ~jnp.isfinite(loss),
               stop_on_nonfinite=False)
    assert s.retcode == "converged" and s.steps == 36


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("until, returned", [
    (lambda params, loss: loss, r"float32\[\]"),
    (lambda params, loss: params["w"] > 0, r"bool\[3\]"),
], ids=["float", "vector"])
def test_minimize_a_bad_until_is_a_type_error_naming_what_it_returned(backend, until, returned):
    with pytest.raises(TypeError, match=f"until must return a scalar bool, it returned {returned}; .*"
                                        r"until=lambda params, loss: loss < 1e-6"):
        _solve(4, backend, until=until)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(LSQ_PARAMS))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(until=1e-6), TypeError, "until must be a function"),
    (dict(stop_on_nonfinite="yes"), TypeError, "stop_on_nonfinite must be a bool"),
])
def test_minimize_validates_the_stop_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        _solve(4, CompiledLoop(), **kwargs)


# ---- fit -------------------------------------------------------------------------------------
def _adam_step():
    return loopfuse.compile_step(train_step(optax.adam(1e-2)), keep_aux=("loss",))


def _fit(step, num_steps, chunk, opt=optax.adam(1e-2), **kwargs):
    return loopfuse.fit(step, fresh(init_state(opt)), batch(), num_steps, chunk=chunk, progress=False, **kwargs)


@pytest.fixture(scope="module")
def adam():
    """A step and the loss history of 25 unstopped steps of it (strictly decreasing)."""
    step = _adam_step()
    history = _fit(step, 25, 10).history["loss"]
    assert (np.diff(history) < 0).all()
    return step, history


def test_fit_until_stops_mid_chunk_equal_to_the_plain_fit_of_the_steps_run(adam):
    step, history = adam
    threshold, seen = float(history[12]), []
    result = _fit(step, 25, 10, until=lambda state, aux: aux["loss"] <= threshold,
                  callback=lambda done, aux: seen.append((done, aux["loss"].shape)))
    assert result.steps == 13 and result.retcode == "until" and not result.interrupted
    assert seen == [(10, (10,)), (13, (3,))]
    plain = _fit(step, 13, 10)
    assert plain.retcode == "max_steps"
    assert_trees_equal((result.state, result.history), (plain.state, plain.history))


def test_fit_until_on_the_new_state_at_a_chunk_end_runs_no_further_chunk():
    result = _fit(_adam_step(), 25, 5, until=lambda state, aux: state[1][0].count >= 10)
    assert result.steps == 10 and result.retcode == "until" and result.history["loss"].shape == (10,)


@pytest.mark.parametrize("chunk", [20, 6], ids=["mid-chunk", "chunk-end"])
def test_fit_stop_on_nonfinite(chunk):
    opt = optax.sgd(3.0)        # diverges: the loss of step 6 is inf
    step = loopfuse.compile_step(train_step(opt))
    result = _fit(step, 20, chunk, opt, stop_on_nonfinite=True)
    assert result.steps == 6 and result.retcode == "non_finite"
    loss = result.history["loss"]
    assert loss.shape == (6,) and np.isinf(loss[-1]) and np.isfinite(loss[:-1]).all()
    plain = _fit(step, 6, chunk, opt)
    assert_trees_equal((result.state, result.history), (plain.state, plain.history))


@pytest.mark.parametrize("until, returned", [
    (lambda state, aux: aux["loss"], r"float32\[\]"),
    (lambda state, aux: state[0]["scale"][0].reshape(1) > 0, r"bool\[1\]"),
    (lambda state, aux: None, "NoneType None"),
], ids=["float", "vector", "none"])
def test_fit_a_bad_until_is_a_type_error_before_anything_runs(until, returned):
    opt, step = optax.adam(1e-2), _adam_step()
    state = fresh(init_state(opt))
    with pytest.raises(TypeError, match=f"until must return a scalar bool, it returned {returned}; .*"
                                        r"until=lambda state, aux: aux\['loss'\] < 1e-4"):
        loopfuse.fit(step, state, batch(), 25, chunk=10, progress=False, until=until)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert step.loop(10).compile_count == 0


def test_fit_with_until_names_the_steps_own_aux_paths():
    step = loopfuse.compile_step(train_step(optax.adam(1e-2)), keep_aux=("lss",))
    with pytest.raises(AuxPathError, match=r"keep_aux names 'lss', .* aux leaves are \['grads.*'loss'\](\n|$)"):
        _fit(step, 25, 10, until=lambda state, aux: aux["loss"] < 0)   # (then only jax's note on its frames)


def test_a_second_fit_with_the_same_until_reuses_its_compiled_loops():
    step, traced = _adam_step(), []

    def until(state, aux):
        traced.append(1)         # runs only while a loop is traced
        return aux["loss"] < 0

    first = _fit(step, 12, 5, until=until)
    assert first.retcode == "max_steps" and first.steps == 12
    n = len(traced)
    assert n > 0
    _fit(step, 12, 5, until=until)
    assert len(traced) == n
