"""minimize(..., ensemble=True): N solves in one call, each member stopping on its own.

Reference: ``jax.jit(jax.vmap(solve))`` of the single-member solve minimize runs, written by hand (a
``lax.while_loop`` of value_and_grad, the optax update, the loss history and the stop), vmapped over a
batch of the same size as the ensemble's tile (XLA may compile other batch sizes to other last bits:
test_tiles_of_another_size_agree_to_the_last_bit says where).
"""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import CompiledLoop, CompiledStep, Dataset, Ensemble, GradOnly, per_member
from loopfuse.errors import StateMismatchError
from problems import NEWER_XLA, SMALL_LOOP_KERNELS, assert_trees_equal, policy_work, vmapped_in_tiles

CODES = {0: "max_steps", 1: "converged", 2: "non_finite"}


def quadratics(n=16, d=8, seed=0, diverging=2):
    """Diagonal quadratics ``0.5 * sum(h * x**2)`` with condition numbers log-uniform in 1..100 and largest
    curvature 1 (SGD(1.0) converges), the first `diverging` with largest curvature 5 (it diverges)."""
    rng = np.random.default_rng(seed)
    kappa = 10 ** rng.uniform(0, 2, n)
    h = kappa[:, None] ** -np.linspace(0, 1, d)[None]
    h[:diverging] *= 5.0
    return jnp.asarray(rng.normal(size=(n, d)), jnp.float32), jnp.asarray(h, jnp.float32)


def quadratic(x, h):
    return 0.5 * jnp.sum(h * x * x)


def below(threshold):
    return lambda params, loss: loss < threshold


def vmapped_solve(loss, params, data, opt, steps, until=None, nonfinite=True, own=False, batch=None, lbfgs=False):
    """``jax.jit(jax.vmap(solve))`` over batches of `batch` members (default: all): (params, history
    [N, steps], steps [N], retcode [N]); `own`: data per member, else shared (None: a loss of params only);
    `lbfgs`: the update takes value, grad and value_fn."""
    takes = set()
    if until is not None:
        takes = {k for k in ("grad", "previous_loss") if k in inspect.signature(until).parameters}

    def solve(p, d):
        f = loss if data is None else (lambda q: loss(q, d))

        def cond(c):
            return (c[0] < steps) & (c[-1] == 0)

        def body(c):
            i, p, s, previous, h, _ = c
            v, g = jax.value_and_grad(f)(p)
            extra = dict(value=v, grad=g, value_fn=f) if lbfgs else {}
            u, s = opt.update(g, s, p, **extra)
            known = {"grad": g, "previous_loss": previous}
            flag = until(p, v, **{k: known[k] for k in takes}) if until is not None else False
            code = jnp.where(nonfinite & ~jnp.isfinite(v), 2, jnp.where(flag, 1, 0))
            return i + 1, optax.apply_updates(p, u), s, v, h.at[i].set(v), code

        init = (0, p, opt.init(p), jnp.float32(jnp.inf), jnp.full(steps, jnp.nan, jnp.float32), 0)
        i, p, _, _, h, code = jax.lax.while_loop(cond, body, init)
        return p, h, i, code

    p, h, i, code = vmapped_in_tiles(solve, params, data, own, batch)
    return p, h, i, np.array([CODES[int(c)] for c in code])


def assert_solution_is(s, reference, history_bitwise=True):
    """`s` (an ensemble Solution) bitwise the reference's params, steps, retcode and history (up to the
    longest member's steps; NaN after; with `history_bitwise` false, each member's within 1e-6 of its largest)."""
    params, history, steps, retcode = reference
    assert_trees_equal(s.params, params)
    np.testing.assert_array_equal(s.steps, steps)
    np.testing.assert_array_equal(s.retcode, retcode)
    assert s.loss_history.shape == (len(steps), steps.max())
    if history_bitwise:
        assert_trees_equal(s.loss_history, history[:, :steps.max()])
    else:
        got, want = np.asarray(s.loss_history), np.asarray(history[:, :steps.max()])
        largest = np.nanmax(np.abs(want), axis=1, keepdims=True)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert (np.nan_to_num(np.abs(got - want)) <= 1e-6 * largest).all()
    assert np.isnan(history[:, steps.max():]).all()


STEPS = 240


@pytest.fixture(scope="module")
def problem():
    return quadratics()


@pytest.mark.parametrize("tile", [16, 4], ids=["one-tile", "tiles-of-4"])
def test_each_member_is_bitwise_the_vmapped_solve(problem, tile):
    x0, h = problem
    s = loopfuse.minimize(quadratic, x0, per_member(h), optax.sgd(1.0), STEPS, until=below(1e-6),
                          ensemble=Ensemble(tile=tile), backend=CompiledLoop(steps=64))
    reference = vmapped_solve(quadratic, x0, h, optax.sgd(1.0), STEPS, until=below(1e-6), own=True, batch=tile)
    # jaxlib 0.12.1 runs both 16-member loops as one kernel each, which record some losses 1 ulp apart
    assert_solution_is(s, reference, history_bitwise=not (SMALL_LOOP_KERNELS and tile == 16))
    assert set(s.retcode) == {"converged", "non_finite", "max_steps"}     # each member stopped on its own
    assert len(set(s.steps.tolist())) > 8
    assert s.best == int(np.nanargmin([np.nan if not np.isfinite(h[n - 1]) else h[n - 1]
                                       for h, n in zip(s.loss_history, s.steps)]))


@pytest.mark.slow     # each tile size is bitwise its own reference: test_each_member_is_bitwise_the_vmapped_solve
def test_tiles_of_another_size_agree_to_the_last_bit(problem):
    """XLA compiles this loss's 8-wide sum over a batch of 4 and of 16 to other last bits (the gradient,
    elementwise, is the same): params and stops agree, the loss history to a few ulp."""
    x0, h = problem
    tiled = loopfuse.minimize(quadratic, x0, per_member(h), optax.sgd(1.0), STEPS, until=below(1e-6),
                              ensemble=Ensemble(tile=4))
    params, history, steps, retcode = vmapped_solve(quadratic, x0, h, optax.sgd(1.0), STEPS, until=below(1e-6), own=True)
    assert_trees_equal(tiled.params, params)
    np.testing.assert_array_equal(tiled.steps, steps)
    np.testing.assert_allclose(tiled.loss_history, history[:, :steps.max()], rtol=1e-6)


def test_one_member_is_the_plain_minimize(problem):
    x0, h = problem
    kwargs = dict(optimizer=optax.sgd(1.0), steps=STEPS, until=below(1e-6), backend=CompiledLoop(steps=64))
    plain = loopfuse.minimize(quadratic, x0[5], h[5], **kwargs)
    one = loopfuse.minimize(quadratic, x0[5:6], per_member(h[5:6]), ensemble=True, **kwargs)
    assert one.steps.tolist() == [plain.steps] and one.retcode.tolist() == [plain.retcode] and one.best == 0
    assert one.steps.dtype == np.int32                   # as an ensemble of N's (it was int64)
    assert_trees_equal((one.params[0], one.loss_history[0]), (plain.params, plain.loss_history))


HOST_CHECKED = dict(optimizer=optax.sgd(1.0), steps=40, until=below(1e-3), ensemble=Ensemble(tile=4))


@pytest.fixture(scope="module")
def checked_loop(problem):
    """The CompiledLoop solve the host-checked backends are compared with (compiled once for both)."""
    x0, h = problem
    return loopfuse.minimize(quadratic, x0, per_member(h), backend=CompiledLoop(steps=16), **HOST_CHECKED)


@pytest.mark.parametrize("backend", [CompiledStep(), GradOnly()], ids=["step", "grad-only"])
def test_host_checked_backends_stop_each_member_where_the_loop_does(problem, checked_loop, backend):
    x0, h = problem      # 40 steps (GradOnly's eager step is slow): every retcode, non_finite at step 33
    loop = checked_loop
    assert set(loop.retcode) == {"converged", "non_finite", "max_steps"}
    s = loopfuse.minimize(quadratic, x0, per_member(h), backend=backend, **HOST_CHECKED)
    np.testing.assert_array_equal(s.retcode, loop.retcode)
    if isinstance(backend, CompiledStep):             # the same step, called once per step: bitwise the loop
        np.testing.assert_array_equal(s.steps, loop.steps)
        assert_trees_equal((s.params, s.loss_history), (loop.params, loop.loss_history))
    else:                                             # its own rounding (see backends), untiled
        np.testing.assert_allclose(s.steps, loop.steps, atol=1)
        ok = s.retcode != "non_finite"
        np.testing.assert_allclose(s.params[ok], loop.params[ok], rtol=1e-4, atol=1e-5)


def test_shared_data_and_a_dataset(problem):
    x0, _ = problem
    h = jnp.linspace(0.1, 1.0, 8)
    s = loopfuse.minimize(quadratic, x0, h, optax.sgd(1.0), STEPS, until=below(1e-4), ensemble=Ensemble(tile=4))
    assert_solution_is(s, vmapped_solve(quadratic, x0, h, optax.sgd(1.0), STEPS, until=below(1e-4), batch=4))

    def loss(x, batch):
        return 0.5 * jnp.sum(batch["h"][0] * x * x)
    data = Dataset({"h": jnp.stack([h, 0.5 * h])}, batch_size=1)      # step i sees row i % 2
    s = loopfuse.minimize(loss, x0, data, optax.sgd(1.0), 60, ensemble=True)
    x = np.asarray(x0)
    for i in range(60):
        x = x - np.asarray(data.arrays["h"][i % 2]) * x
    np.testing.assert_allclose(s.params, x, rtol=1e-5, atol=1e-6)


ROSENBROCK_STARTS = jnp.array([[-1.2, 1.0, -1.2, 1.0], [0.5, 0.5, 0.5, 0.5], [2.0, -1.0, 0.0, 1.5],
                               [1.0, 1.0, 1.0, 1.0], [-0.5, 0.2, 1.5, 2.5], [0.9, 0.8, 0.7, 0.5]])


def rosenbrock(p):
    return jnp.sum(100.0 * (p[1:] - p[:-1] ** 2) ** 2 + (1.0 - p[:-1]) ** 2)


@pytest.mark.parametrize("until", [loopfuse.gtol(1e-4), pytest.param(loopfuse.ftol(rtol=1e-7), marks=pytest.mark.slow)],
                         ids=["gtol", "ftol"])
def test_lbfgs_with_its_line_search_per_member(until):
    s = loopfuse.minimize(rosenbrock, ROSENBROCK_STARTS, optimizer=optax.lbfgs(), steps=200, until=until,
                          ensemble=True)
    reference = vmapped_solve(rosenbrock, ROSENBROCK_STARTS, None, optax.lbfgs(), 200, until=until, lbfgs=True)
    # jaxlib 0.12's XLA computes the loss that the vmapped while_loop records to other last bits (the
    # params, the steps, and so every line-search decision, are the same)
    assert_solution_is(s, reference, history_bitwise=not NEWER_XLA)
    assert (s.retcode == "converged").all() and len(set(s.steps.tolist())) > 3
    assert s.steps[3] <= 2              # the start at the minimum stops at once (ftol: after its second step)


@pytest.mark.slow     # two L-BFGS ensembles compiled: ~10 s on 2 cores
def test_continuing_from_an_ensemble_solution():
    adam = loopfuse.minimize(rosenbrock, ROSENBROCK_STARTS, optimizer=optax.adam(1e-2), steps=50, ensemble=True)
    polished = loopfuse.minimize(rosenbrock, adam, optimizer=optax.lbfgs(), steps=200, until=loopfuse.gtol(1e-4),
                                 ensemble=True)
    again = loopfuse.minimize(rosenbrock, adam.params, optimizer=optax.lbfgs(), steps=200,
                              until=loopfuse.gtol(1e-4), ensemble=True)
    assert_trees_equal((polished.params, polished.steps), (again.params, again.steps))
    np.testing.assert_allclose(polished.params[polished.best], 1.0, atol=1e-3)


def test_a_repeated_ensemble_solve_compiles_nothing(problem):
    x0, h = problem
    kwargs = dict(optimizer=optax.sgd(1.0), steps=STEPS, until=below(1e-6), ensemble=Ensemble(tile=4))
    loopfuse.minimize(quadratic, x0, per_member(h), **kwargs)
    again = loopfuse.minimize(quadratic, x0 + 1.0, per_member(h), **kwargs)
    assert again.compile_seconds < 0.05


# tiles of 4 compact as members stop (policy_work); one tile never compacts, tiles of one always do
@pytest.mark.parametrize("tile", [pytest.param(16, marks=pytest.mark.slow), 4, pytest.param(1, marks=pytest.mark.slow)])
def test_stopped_members_cost_no_more_work(problem, tile):
    """The loss's host callback runs once per member step computed: N per step in one tile (as a vmapped
    loop), fewer as the tiles compact, exactly the member steps run in tiles of one."""
    x0, h = problem
    calls = []

    def counted(x, h):
        jax.debug.callback(lambda v: calls.append(1), x[0])     # per member: its argument is batched
        return quadratic(x, h)
    s = loopfuse.minimize(counted, x0, per_member(h), optax.sgd(1.0), STEPS, until=below(1e-6),
                          ensemble=Ensemble(tile=tile))
    jax.effects_barrier()
    assert len(calls) == policy_work(s.steps, tile)
    assert len(calls) == {16: 16 * s.steps.max(), 1: s.steps.sum()}.get(tile, len(calls))
    assert tile == 16 or len(calls) < 0.6 * 16 * s.steps.max()


# ---- errors --------------------------------------------------------------------------------------
def test_params_leaves_must_share_the_member_axis():
    params = {"a": jnp.zeros((4, 2)), "b": jnp.zeros((3,))}
    with pytest.raises(StateMismatchError, match=r"params leaf \['b'\] has shape \(3,\); in an ensemble every "
                                                 r"params leaf leads with the member axis \(N = 4\)"):
        loopfuse.minimize(lambda p: jnp.sum(p["a"]) + jnp.sum(p["b"]), params, steps=2, ensemble=True)
    with pytest.raises(StateMismatchError, match=r"params leaf \['b'\] has shape \(\)"):
        loopfuse.minimize(lambda p: jnp.sum(p["a"]), {"a": jnp.zeros((4, 2)), "b": jnp.float32(0)}, steps=2,
                          ensemble=True)


def test_per_member_data_must_match_the_members():
    with pytest.raises(StateMismatchError, match="per_member data has 3 entries per leaf, the ensemble 4 members"):
        loopfuse.minimize(quadratic, jnp.zeros((4, 2)), per_member(jnp.ones((3, 2))), steps=2, ensemble=True)
    with pytest.raises(TypeError, match="per_member data gives each member of an ensemble its own data: pass "
                                        "ensemble=True"):
        loopfuse.minimize(quadratic, jnp.zeros((4, 2)), per_member(jnp.ones((4, 2))), steps=2)
    with pytest.raises(TypeError, match="per_member takes a pytree of arrays, not a Dataset"):
        per_member(Dataset({"x": np.zeros((4, 2))}, batch_size=2))


def test_bad_ensemble_arguments():
    with pytest.raises(TypeError, match="ensemble must be True, False or a loopfuse.Ensemble, got 4"):
        loopfuse.minimize(quadratic, jnp.zeros((4, 2)), jnp.ones(2), steps=2, ensemble=4)
    with pytest.raises(ValueError, match=r"Ensemble\(tile=...\) must be a positive int, got 0"):
        Ensemble(tile=0)


def test_a_solution_continues_only_as_the_kind_of_solve_that_made_it():
    """An ensemble's Solution without ensemble=True would fit one problem of params [N, ...], a single solve's
    with ensemble=True its vector as N scalar members: each a TypeError saying how to mean it (sol.params)."""
    x0, h = quadratics(n=4, d=2)
    opt = optax.sgd(0.1)
    ensemble = loopfuse.minimize(quadratic, x0, h[0], opt, steps=2, ensemble=True)
    with pytest.raises(TypeError, match=r"^params is the Solution of a 4-member ensemble, but ensemble=False solves "
                                        r"one problem: pass ensemble=True .* or pass sol.params explicitly"):
        loopfuse.minimize(quadratic, ensemble, h[0], opt, steps=2)
    single = loopfuse.minimize(quadratic, x0[0], h[0], opt, steps=2)
    with pytest.raises(TypeError, match=r"^params is the Solution of a single solve, but an ensemble solves N "
                                        r"problems .* leave ensemble out to continue it, or pass sol.params"):
        loopfuse.minimize(quadratic, single, h[0], opt, steps=2, ensemble=True)
    assert loopfuse.minimize(quadratic, ensemble, h[0], opt, steps=2, ensemble=True).params.shape == (4, 2)
    assert loopfuse.minimize(quadratic, single, h[0], opt, steps=2).params.shape == (2,)


def test_a_bad_until_is_a_type_error_and_the_params_are_kept():
    params = jnp.zeros((4, 2))
    with pytest.raises(TypeError, match=r"until must return a scalar bool, it returned float32\[\]"):
        loopfuse.minimize(quadratic, params, jnp.ones(2), steps=2, until=lambda p, loss: loss, ensemble=True)
    assert not params.is_deleted()
