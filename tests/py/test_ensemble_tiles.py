"""An ensemble's default tile (`loopfuse.drivers.tiles`): read from the member step's program, never timed.

The drivers' choice is observed through a host callback in the `until` predicate, which runs once per
member step a tile computes (the stopped members' included): `policy_work(steps, tile)` of them.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Ensemble, per_member
from loopfuse.drivers import tiles
from problems import assert_trees_equal, policy_work

ONE = jax.ShapeDtypeStruct((64,), jnp.float32)      # one member's 64 parameters


def sgd(x, h):
    """A gradient-descent step on ``0.5 * sum(h * x**2)``: elementwise, no loop."""
    return x - h * x, {"loss": 0.5 * jnp.sum(h * x * x)}


def halve(x, tol):
    """A loop whose trip count depends on the member's `x`."""
    return jax.lax.while_loop(lambda y: jnp.abs(y).max() > tol, lambda y: y / 2, x), {}


def shared(x, k):
    """A loop whose trip count is the batch's (shared by every member)."""
    return jax.lax.fori_loop(0, k, lambda i, y: y / 2, x), {}


def nested(x, tol):
    """A member-dependent loop inside another."""
    return jax.lax.while_loop(lambda y: jnp.abs(y).max() > tol, lambda y: halve(y / 2, tol)[0], x), {}


def quadratics(n, d=64, seed=0):
    """(x0 [n, d], h [n, d]): condition numbers log-uniform in 1..30 (SGD(1.0) stops at varied steps)."""
    rng = np.random.default_rng(seed)
    h = (10 ** rng.uniform(0, 1.5, n))[:, None] ** -np.linspace(0, 1, d)[None]
    return jnp.asarray(rng.normal(size=(n, d)), jnp.float32), jnp.asarray(h, jnp.float32)


def counting_until(calls, threshold):
    """``loss < threshold``, counting the member steps computed (a host callback per member)."""
    def until(params, loss):
        jax.debug.callback(lambda v: calls.append(1), loss)
        return loss < threshold
    return until


def test_an_elementwise_step_runs_tiles_whose_work_matches_their_fixed_cost():
    # 18 ops and 522 elements with the tile's own: r = 1024 * 18 / 522 = 35 members, the nearest power of 2 32
    assert tiles.cost(sgd, ONE, ONE, own=True) == tiles.Cost(ops=18, elements=522, nesting=0)
    assert Ensemble().tile_size(sgd, jnp.ones((1024, 64)), per_member(jnp.ones((1024, 64)))) == 32
    assert Ensemble().tile_size(sgd, jnp.ones((16, 64)), per_member(jnp.ones((16, 64)))) == 16     # at most N
    # a member of 16x the work: a tile of 2 (r = 1024 * 18 / 8202 = 2.2); the fixed tile and no stop read nothing
    wide = jnp.ones((1024, 1024))
    assert Ensemble().tile_size(sgd, wide, per_member(wide)) == 2
    assert Ensemble().tile_size(sgd, wide, per_member(wide), stops=False) == 1024
    assert Ensemble(tile=2048).tile_size(sgd, wide, per_member(wide)) == 1024
    # the devices' platform decides the kernel's worth: the CPU's 1024 elements, an accelerator's 2**20
    assert Ensemble().tile_size(sgd, wide, per_member(wide), devices=jax.devices("cpu")[:1]) == 2
    assert tiles.cost(sgd, ONE, ONE, own=True).tile(1 << 16, "gpu") == 1 << 15


@pytest.mark.parametrize("step, batch, own, nesting", [
    (halve, 1.0, False, 1),
    (shared, 3, False, 0),
    (nested, 1.0, False, 2),
    (lambda x, k: shared(x, k.astype(jnp.int32)), jnp.float32(3), True, 1),   # the member's own bound
    (lambda x, t: jax.lax.cond(t > 0, halve, lambda y, _: (y, {}), x, t), 1.0, False, 1),
    (lambda x, t: (jax.lax.scan(lambda c, _: (halve(c, t)[0], None), x, length=3)[0], {}), 1.0, False, 1),
    (lambda x, t: jax.jit(halve)(x, t), 1.0, False, 1),
    (lambda x, t: (jax.checkpoint(lambda y: halve(y, t)[0])(x), {}), 1.0, False, 1),
], ids=["while", "shared-bound", "nested", "own-bound", "in-cond", "in-scan", "in-jit", "in-checkpoint"])
def test_loops_whose_trip_count_depends_on_the_member_are_found(step, batch, own, nesting):
    assert tiles.cost(step, ONE, batch, own=own).nesting == nesting


def test_nested_loops_run_one_member_per_tile_on_a_cpu():
    """L-BFGS's line search is a loop of the member's; a loss that runs one of its own nests them."""
    def loss(x, h):     # its scale found by halving: a trip count of the member's x
        s = jax.lax.while_loop(lambda s: s * jnp.max(h) > 1.0, lambda s: s / 2,
                               jax.lax.stop_gradient(jnp.sum(x * x)) + 1.0)
        return 0.5 * s * jnp.sum(h * x * x)
    x0, h = quadratics(8, d=4)
    calls = []
    s = loopfuse.minimize(loss, x0, per_member(h), optax.lbfgs(), 30, until=counting_until(calls, 1e-6),
                          ensemble=True)
    jax.effects_barrier()
    assert len(set(s.steps.tolist())) > 2 and len(calls) == s.steps.sum()       # tiles of one: no idle slot


def test_minimize_and_fit_run_the_tile_read_from_the_program():
    x0, h = quadratics(128)
    calls = []
    s = loopfuse.minimize(lambda x, h: 0.5 * jnp.sum(h * x * x), x0, per_member(h), optax.sgd(1.0), 2000,
                          until=counting_until(calls, 1e-4), ensemble=True)
    jax.effects_barrier()
    assert len(calls) == policy_work(s.steps, 32) < policy_work(s.steps, 64)        # four tiles, then fewer

    fit_calls = []

    def step(x, h):
        jax.debug.callback(lambda v: fit_calls.append(1), x[0])
        return sgd(x, h)
    result = loopfuse.fit(loopfuse.compile_step(step), x0, per_member(h), 2000, chunk=500, progress=False,
                          until=lambda x, aux: aux["loss"] < 1e-4, ensemble=True)
    jax.effects_barrier()
    assert len(fit_calls) == policy_work(result.steps, 32)


def test_the_default_is_a_function_of_the_program():
    """Read twice from programs built anew (new function objects), the cost is the same, and so are a
    solve's tile and results."""
    def program():
        return lambda x, h: nested(*sgd(x, h)[:1], jnp.max(h))
    assert tiles.cost(program(), ONE, ONE, own=True) == tiles.cost(program(), ONE, ONE, own=True)
    x0, h = quadratics(256)

    def solve():
        loss = lambda x, h: 0.5 * jnp.sum(h * x * x)    # noqa: E731  (a new loss object: read and compiled anew)
        return loopfuse.minimize(loss, x0, per_member(h), optax.sgd(1.0), 2000, until=lambda p, v: v < 1e-6,
                                 ensemble=True)
    first, again = solve(), solve()
    assert_trees_equal((first.params, first.loss_history, first.steps), (again.params, again.loss_history, again.steps))


def test_the_program_is_read_once_per_member_and_signature():
    traces = []

    def step(x, h):
        traces.append(1)
        return sgd(x, h)
    x, h = jnp.ones((32, 64)), per_member(jnp.ones((32, 64)))
    assert Ensemble().tile_size(step, x, h) == Ensemble().tile_size(step, x + 1.0, h) == 32
    assert len(traces) == 1
    Ensemble().tile_size(step, jnp.ones((32, 8)), per_member(jnp.ones((32, 8))))
    assert len(traces) == 2
