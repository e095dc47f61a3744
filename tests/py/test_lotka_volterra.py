"""The Lotka-Volterra fit of issue 20, as written there (diffrax Tsit5 + PID + SaveAt(ts) over
[0, 10]): loopfuse with its defaults computes what jax.jit computes, bitwise, for 500 Adam steps in
one device loop and through `minimize` (before the fix, region-analysis copy insertion made the
fitted parameters 7% off); and L-BFGS to convergence with the backends that step from Python, bitwise
their hand-written loops."""
import diffrax
import jax
import jax.numpy as jnp
import optax
import pytest

import loopfuse
from problems import assert_trees_equal, fresh

STEPS = 500
OPT = optax.adam(1e-2)
TS = jnp.linspace(0.0, 10.0, 101)


def _vf(t, y, th):
    a, b, c, d = jnp.exp(th)
    x, z = y
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


def _solve(th):
    return diffrax.diffeqsolve(diffrax.ODETerm(_vf), diffrax.Tsit5(), 0.0, 10.0, 0.05, jnp.array([1.0, 1.0]),
                               args=th, saveat=diffrax.SaveAt(ts=TS), max_steps=4096,
                               stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6)).ys


def _loss(th, data):
    return jnp.mean((_solve(th) - data) ** 2)


def _step(state, data):
    th, opt_state = state
    loss, g = jax.value_and_grad(_loss)(th, data)
    updates, opt_state = OPT.update(g, opt_state, th)
    return (optax.apply_updates(th, updates), opt_state), {"loss": loss}


@pytest.fixture(scope="module")
def problem():
    data = _solve(jnp.log(jnp.array([1.5, 1.0, 3.0, 1.0]))) + 0.01 * jax.random.normal(jax.random.key(0), (101, 2))
    th0 = jnp.log(jnp.array([1.2, 0.8, 2.8, 0.8]))
    scan = jax.jit(lambda s, d: jax.lax.scan(lambda c, _: _step(c, d), s, None, length=STEPS))
    return th0, data, scan((th0, OPT.init(th0)), data)


# By default test_corpus.py runs the reproducer, shortened (diffrax_pid_saveat_ts): loop(3) bitwise
# jax.jit's, and changed by the forced region-analysis copy insertion; the fit as written runs with -m slow.
@pytest.mark.slow
def test_loop_of_500_steps_equals_the_jitted_scan(problem):
    th0, data, expected = problem
    assert_trees_equal(loopfuse.compile_step(_step).loop(STEPS)((fresh(th0), OPT.init(th0)), data), expected)


@pytest.mark.slow
def test_minimize_equals_the_jitted_steps(problem):
    """minimize's loop stops at a non-finite loss; with jaxlib 0.12 such a loop equals the jitted
    steps, and the jitted scan differs from both in the last bits (README, "Results are jax.jit's")."""
    th0, data, _ = problem
    sol = loopfuse.minimize(_loss, th0, data=data, optimizer=OPT, steps=STEPS,
                            backend=loopfuse.CompiledLoop(steps=STEPS))
    step, state, losses = jax.jit(_step), (th0, OPT.init(th0)), []
    for _ in range(STEPS):
        state, aux = step(state, data)
        losses.append(aux["loss"])
    assert_trees_equal((sol.params, sol.loss_history), (state[0], jnp.stack(losses)))


UNTIL = loopfuse.ftol(rtol=1e-6)
LBFGS = optax.lbfgs()


def _lbfgs_step_loop(th, data, whole_step: bool):
    """The hand-written L-BFGS loop of a backend that calls a step from Python, to `UNTIL` (on the
    host, at most 100 steps): CompiledStep's ``jax.jit`` of the whole step, with the outputs of
    minimize's step (the `until` flag and the loss with a one-step axis: XLA compiles what it sees, and
    jaxlib 0.12's XLA gives this step other last bits with other outputs), or GradOnly's ``jax.jit`` of
    value_and_grad then ``jax.jit`` of the update with its line search, applied eagerly.
    Returns (params, losses)."""
    def update(grad, opt_state, th, data, value):
        return LBFGS.update(grad, opt_state, th, value=value, grad=grad, value_fn=lambda p: _loss(p, data))

    if whole_step:
        @jax.jit
        def whole(state, data):
            th, opt_state, previous = state
            value, grad = jax.value_and_grad(_loss)(th, data)
            updates, opt_state = update(grad, opt_state, th, data, value)
            flag = UNTIL(th, value, previous_loss=previous)
            return (optax.apply_updates(th, updates), opt_state, value), ({"loss": value[None]}, flag[None])

        def step(th, opt_state, previous, data):
            (th, opt_state, value), (_, flag) = whole((th, opt_state, previous), data)
            return th, opt_state, value, flag[0]
    else:
        value_and_grad, jitted_update = jax.jit(jax.value_and_grad(_loss)), jax.jit(update)

        def step(th, opt_state, previous, data):
            value, grad = value_and_grad(th, data)
            updates, opt_state = jitted_update(grad, opt_state, th, data, value)
            return optax.apply_updates(th, updates), opt_state, value, UNTIL(th, value, previous_loss=previous)
    opt_state, previous, losses = LBFGS.init(th), jnp.float32(jnp.inf), []
    for _ in range(100):
        th, opt_state, previous, stop = step(th, opt_state, previous, data)
        losses.append(previous)
        if stop:
            break
    return th, jnp.stack(losses)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [loopfuse.GradOnly(), loopfuse.CompiledStep()], ids=["grad-only", "step"])
def test_lbfgs_fit_converges_bitwise_as_the_hand_written_loop(problem, backend):
    """L-BFGS (its zoom line search solving the ODE again) from the start, to `UNTIL`, with the backends
    that step from Python; CompiledLoop's stopping L-BFGS loop is tests/py/test_examples.py's."""
    th0, data, _ = problem
    sol = loopfuse.minimize(_loss, th0, data=data, optimizer=LBFGS, steps=100, backend=backend, until=UNTIL)
    assert sol.retcode == "converged" and sol.steps < 100
    assert jnp.allclose(jnp.exp(sol.params), jnp.array([1.5, 1.0, 3.0, 1.0]), rtol=0.01)
    expected = _lbfgs_step_loop(th0, data, whole_step=isinstance(backend, loopfuse.CompiledStep))
    assert_trees_equal((sol.params, sol.loss_history), expected)
