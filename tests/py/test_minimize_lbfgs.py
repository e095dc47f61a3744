"""minimize with line-search optimizers (optax.lbfgs): the update gets value, grad and value_fn, the
line search runs inside the compiled step or loop, and the result is bitwise a hand-written jax.jit
loop of the same update; the gtol/ftol predicates stop it."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Dataset
from loopfuse.drivers.backends import CompiledLoop, CompiledStep, GradOnly
from loopfuse.drivers.solve import minimize
from problems import assert_trees_equal, batch, mlp_loss, mlp_params

COMPILED = [CompiledStep(), CompiledLoop(steps=8)]
IDS = ["step", "loop8"]


def rosenbrock(p, _=None):
    return jnp.sum(100.0 * (p[1:] - p[:-1] ** 2) ** 2 + (1.0 - p[:-1]) ** 2)


X0 = jnp.array([-1.2, 1.0, -1.2, 1.0])
LBFGS = optax.lbfgs()


def _jit_loop(loss, params, data, steps, opt=None):
    """The hand-written reference: jax.jit of one L-BFGS step, called `steps` times from Python;
    `data` a fixed batch, a Dataset (step i sees data.batch(i)) or None (loss of params only)."""
    opt = opt or optax.lbfgs()
    f = (lambda p, _: loss(p)) if data is None else loss

    @jax.jit
    def step(params, opt_state, batch):
        value, grad = jax.value_and_grad(f)(params, batch)
        updates, opt_state = opt.update(grad, opt_state, params, value=value, grad=grad,
                                        value_fn=lambda p: f(p, batch))
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, losses = opt.init(params), []
    for i in range(steps):
        batch = data.batch(np.int32(i)) if isinstance(data, Dataset) else data
        params, opt_state, value = step(params, opt_state, () if data is None else batch)
        losses.append(value)
    return params, np.asarray(losses)


def _jit_scan(loss, params, steps, opt=None):
    """The hand-written device loop: jax.jit of a lax.scan of the same L-BFGS step (XLA may compile a
    step inside a loop to other last bits than a lone step, so a compiled loop is compared with it)."""
    opt = opt or optax.lbfgs()

    def step(carry, _):
        params, opt_state = carry
        value, grad = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grad, opt_state, params, value=value, grad=grad, value_fn=loss)
        return (optax.apply_updates(params, updates), opt_state), value

    (params, _), losses = jax.jit(lambda c: jax.lax.scan(step, c, None, length=steps))((params, opt.init(params)))
    return params, np.asarray(losses)


@pytest.fixture(scope="module")
def rosenbrock_reference():
    """{"step": the jitted step called from Python, "loop": the jitted scan}, 20 steps each."""
    return {"step": _jit_loop(rosenbrock, X0, None, 20), "loop": _jit_scan(rosenbrock, X0, 20)}


# the loop's losses are bitwise the scan's, to its stop, in test_ftol_stops_where_the_loss_change_is_small
@pytest.mark.parametrize("backend", [CompiledStep(), pytest.param(CompiledLoop(steps=8), marks=pytest.mark.slow)],
                         ids=IDS)
def test_lbfgs_on_rosenbrock_is_bitwise_the_jit_loop(backend, rosenbrock_reference):
    s = minimize(lambda p: rosenbrock(p), X0, optimizer=optax.lbfgs(), steps=20, backend=backend)
    params, losses = rosenbrock_reference["loop" if isinstance(backend, CompiledLoop) else "step"]
    assert_trees_equal(s.params, params)
    assert_trees_equal(s.loss_history, losses)
    assert s.retcode == "max_steps" and 0 < losses[-1] < 0.01 * losses[0]     # mid-way, not yet converged


# All with -m slow (each compiles an L-BFGS program of its own). By default: the loop's L-BFGS to gtol in
# test_adam_then_lbfgs_continues_from_the_solution; the compiled step's L-BFGS bitwise in
# test_lbfgs_on_rosenbrock_is_bitwise_the_jit_loop[step] and its until stopping it in test_until_drivers'
# test_minimize_converging_mid_chunk_stops_there_on_every_backend[step]; GradOnly's L-BFGS bitwise in
# test_lbfgs_grad_only_is_bitwise_the_hand_written_grad_only_loop.
@pytest.mark.slow
@pytest.mark.parametrize("backend", [GradOnly(), CompiledStep(), CompiledLoop(steps=8)], ids=["grad-only", *IDS])
def test_lbfgs_converges_on_rosenbrock(backend):
    s = minimize(rosenbrock, X0, optimizer=optax.lbfgs(), steps=200, backend=backend, until=loopfuse.gtol(1e-5))
    assert s.retcode == "converged" and s.steps < 200
    np.testing.assert_allclose(s.params, 1.0, atol=1e-4)


def grad_only_loop(loss, params, data, steps, opt=None, until=None):
    """The hand-written loop GradOnly is: jax.jit of value_and_grad, jax.jit of the update with its line
    search (value_fn on the step's batch), `optax.apply_updates` eagerly, `until` on the host; `data` a
    fixed batch (not a Dataset). Returns (params, losses)."""
    opt = opt or optax.lbfgs()
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    update = jax.jit(lambda g, s, p, b, v: opt.update(g, s, p, value=v, grad=g, value_fn=lambda q: loss(q, b)))
    opt_state, losses, previous = opt.init(params), [], jnp.float32(jnp.inf)
    for _ in range(steps):
        value, grad = value_and_grad(params, data)
        updates, opt_state = update(grad, opt_state, params, data, value)
        stop = until is not None and bool(until(params, value, previous_loss=previous))
        params, previous = optax.apply_updates(params, updates), value
        losses.append(value)
        if stop:
            break
    return params, np.asarray(losses)


def test_lbfgs_grad_only_is_bitwise_the_hand_written_grad_only_loop():
    """GradOnly jits the derivative and the update with its line search (eagerly, jax would compile the
    line search's while loop again at every step; test_minimize_cache counts its compiles)."""
    s = minimize(rosenbrock, X0, optimizer=LBFGS, steps=20, backend=GradOnly())
    assert_trees_equal((s.params, s.loss_history), grad_only_loop(rosenbrock, X0, None, 20, LBFGS))
    assert 0 < s.loss_history[-1] < 0.01 * s.loss_history[0]


@pytest.mark.slow     # about a minute per backend on 2 cores: the L-BFGS MLP compiles twice, and the references
@pytest.mark.parametrize("backend", COMPILED, ids=IDS)
def test_lbfgs_mlp_with_a_fixed_batch_and_a_dataset_is_bitwise_the_jit_loop(backend):
    data = batch(n=48)
    for d in (data, Dataset(data, batch_size=16, key=jax.random.key(0))):
        s = minimize(mlp_loss, mlp_params(), d, optimizer=optax.lbfgs(), steps=12, backend=backend)
        params, losses = _jit_loop(mlp_loss, mlp_params(), d, 12)
        assert_trees_equal(s.params, params)
        assert_trees_equal(s.loss_history, losses)


@pytest.mark.parametrize("backend", [CompiledStep(), pytest.param(CompiledLoop(steps=8), marks=pytest.mark.slow)],
                         ids=IDS)    # one update for both: the loop runs the step's
def test_adam_unchanged_by_the_extra_keywords(backend):
    """adam's update takes **extra_args: minimize passes value/grad/value_fn, which it ignores."""
    opt = optax.adam(1e-2)
    s = minimize(mlp_loss, mlp_params(), batch(), optimizer=opt, steps=10, backend=backend)
    params, losses = _jit_loop(mlp_loss, mlp_params(), batch(), 10, opt)
    assert_trees_equal(s.params, params)
    assert_trees_equal(s.loss_history, losses)


def test_ftol_stops_where_the_loss_change_is_small(rosenbrock_reference):
    reference = rosenbrock_reference["loop"][1]
    change = np.abs(np.diff(reference))             # change[i-1] = |loss[i-1] - loss[i]|
    first = 1 + int(np.argmax(change <= 1e-6 + 0.1 * np.abs(reference[1:])))
    assert first < len(reference) - 1
    s = minimize(rosenbrock, X0, optimizer=optax.lbfgs(), steps=60, backend=CompiledLoop(steps=8),
                 until=loopfuse.ftol(rtol=0.1, atol=1e-6))
    assert s.retcode == "converged" and s.steps == first + 1
    assert_trees_equal(s.loss_history, reference[:first + 1])


def test_gtol_definition_is_the_infinity_norm():
    until = loopfuse.gtol(0.5)
    assert bool(until(None, 0.0, grad={"a": jnp.array([0.5, -0.4]), "b": jnp.array(-0.1)}))
    assert not bool(until(None, 0.0, grad={"a": jnp.array([0.5, -0.6]), "b": jnp.array(-0.1)}))
    assert not bool(loopfuse.ftol(atol=1.0)(None, jnp.float32(3.0), previous_loss=jnp.float32(jnp.inf)))


@pytest.mark.parametrize("make", [lambda: loopfuse.gtol(-1.0), lambda: loopfuse.ftol(rtol="x"),
                                  lambda: loopfuse.ftol(atol=True)])
def test_tolerance_validation(make):
    with pytest.raises(ValueError, match="must be a non-negative number"):
        make()


def test_an_update_needing_other_keywords_is_a_clear_error():
    def update(updates, state, params=None, *, value, hessian):
        return updates, state
    opt = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    params = X0
    with pytest.raises(TypeError, match=r"requires keyword arguments \['hessian'\].*supplies \['value', 'grad', "
                                        r"'value_fn'\]"):
        minimize(rosenbrock, params, optimizer=opt, steps=2)
    np.testing.assert_array_equal(params, X0)


def test_a_hidden_required_keyword_is_a_clear_error_when_traced():
    inner = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(),
                                                  lambda u, s, p=None, *, hessian, **extra: (u, s))
    with pytest.raises(TypeError, match="needs arguments minimize cannot supply.*hessian.*value, grad, value_fn"):
        minimize(rosenbrock, X0, optimizer=optax.chain(inner), steps=2, backend=CompiledStep())


def test_adam_then_lbfgs_continues_from_the_solution():
    """A Solution as params: its params, a fresh optimizer state; the same as passing sol.params."""
    adam = minimize(rosenbrock, X0, optimizer=optax.adam(1e-2), steps=50, backend=CompiledLoop(steps=25))
    lbfgs = optax.lbfgs()
    polished = minimize(rosenbrock, adam, optimizer=lbfgs, steps=100, backend=CompiledLoop(steps=25),
                        until=loopfuse.gtol(1e-5))
    again = minimize(rosenbrock, adam.params, optimizer=lbfgs, steps=100, backend=CompiledLoop(steps=25),
                     until=loopfuse.gtol(1e-5))
    assert_trees_equal(polished.params, again.params)
    np.testing.assert_allclose(polished.loss_history[0], rosenbrock(adam.params), rtol=1e-6)
    assert polished.retcode == "converged"
    np.testing.assert_allclose(polished.params, 1.0, atol=1e-4)
