"""A repeated minimize compiles nothing: its programs are kept per (loss, optimizer, backend, until)
objects and its executables per abstract signature; the persistent cache serves a new process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import CompiledLoop, CompiledStep, Dataset, GradOnly
from loopfuse.compile import cache, xla
from loopfuse.drivers.solve import _program
from problems import NEWER_XLA, assert_trees_equal, batch, mlp_loss, mlp_params


@pytest.fixture
def compiles(monkeypatch):
    """{"loopfuse": XLA compiles of loopfuse programs, "jax": jax.jit backend compiles}, counted, with no executable
    kept in memory from an earlier test (`cache.RECENT`)."""
    cache.RECENT.clear()
    counts = {"loopfuse": 0, "jax": 0}
    compile_module = xla.compile_module

    def counted(*args, **kwargs):
        counts["loopfuse"] += 1
        return compile_module(*args, **kwargs)
    monkeypatch.setattr(xla, "compile_module", counted)

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            counts["jax"] += 1
    jax.monitoring.register_event_duration_secs_listener(listener)
    yield counts
    jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize("backend, make_optimizer", [
    *[(b, lambda: optax.adam(1e-2)) for b in (GradOnly(), CompiledStep(), CompiledLoop(steps=4))],
    pytest.param(GradOnly(), optax.lbfgs, marks=pytest.mark.slow),
    # the compiled backends key an L-BFGS program as any other (the last test: its loop compiles once)
    *[pytest.param(b, optax.lbfgs, marks=pytest.mark.slow) for b in (CompiledStep(), CompiledLoop(steps=4))],
], ids=["grad-only-adam", "step-adam", "loop4-adam", "grad-only-lbfgs", "step-lbfgs", "loop4-lbfgs"])
def test_a_repeated_minimize_compiles_nothing(backend, make_optimizer, compiles):
    """Also L-BFGS, whose line search GradOnly compiles once (with the update), not at every step."""
    opt, until = make_optimizer(), loopfuse.gtol(1e-9)
    solve = lambda params, data: loopfuse.minimize(mlp_loss, params, data, opt, steps=10, backend=backend, until=until)
    first = solve(mlp_params(), batch())
    assert compiles["loopfuse"] + compiles["jax"] > 0
    counts = dict(compiles)
    again = solve(mlp_params(seed=3), batch(seed=4))       # other values, the same shapes and objects
    assert compiles == counts
    assert again.compile_seconds < 0.2 * first.compile_seconds
    assert_trees_equal(solve(mlp_params(), batch()).params, first.params)
    if not (isinstance(backend, GradOnly) and make_optimizer is optax.lbfgs):
        # another shape compiles its own: the executables are keyed by the abstract signature whatever the
        # optimizer; grad-only-adam checks GradOnly's (GradOnly's L-BFGS compiles again in ~5 s on 2 cores)
        solve(mlp_params(), batch(n=32))
        assert compiles != counts


def test_an_optimizer_and_a_predicate_written_inline_are_one_program(compiles):
    """Keyed by what they compute (`object_keys`), as jax.jit keys a static argument by its equality:
    ``optax.adam(1e-2)`` and an `until` lambda written inline, new objects at every solve, compile once (each was
    another program); another learning rate, or a predicate that holds another value, is another program."""
    def solve(lr, seed, tol=1e-9):
        return loopfuse.minimize(mlp_loss, mlp_params(seed=seed), batch(), optax.adam(lr), steps=4,
                                 backend=CompiledStep(), until=lambda params, loss: loss < tol)
    first = solve(1e-2, 0)
    counts = dict(compiles)
    assert_trees_equal(solve(1e-2, 0).params, first.params)
    solve(1e-2, 1)
    assert compiles == counts
    solve(1e-3, 0)
    assert compiles["loopfuse"] == counts["loopfuse"] + 1
    solve(1e-3, 0, tol=1e-8)
    assert compiles["loopfuse"] == counts["loopfuse"] + 2


def test_equal_tolerances_are_one_program(compiles):
    """`until=loopfuse.gtol(...)` written inline, a new object per solve, compiles once: predicates of equal
    tolerances are equal (each was a new closure, another program). It stops where its formula written by
    hand does, bitwise."""
    opt = optax.adam(1e-2)
    solve = lambda until, seed: loopfuse.minimize(mlp_loss, mlp_params(seed=seed), batch(seed=seed), opt, steps=60,
                                                  until=until)

    def by_hand(params, loss, *, grad):
        return jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in jax.tree.leaves(grad)])) <= 0.05
    reference, first = solve(by_hand, 1), solve(loopfuse.gtol(0.05), 1)
    solve(loopfuse.ftol(rtol=1e-3), 1)
    counts = dict(compiles)
    solve(loopfuse.gtol(0.05), 2), solve(loopfuse.ftol(rtol=1e-3), 2)
    assert compiles == counts
    assert (first.retcode, first.steps) == (reference.retcode, reference.steps) == ("converged", 30)
    assert_trees_equal((first.params, first.loss_history), (reference.params, reference.loss_history))
    assert loopfuse.gtol(0.05) != loopfuse.gtol(0.01) and loopfuse.ftol(1e-3) != loopfuse.ftol(atol=1e-3)


def test_a_loss_that_is_gone_frees_what_it_closed_over():
    """A sweep of solves over losses closing over their data keeps none of it once a loss is gone, as jax.jit
    keeps none (the programs were kept, with their losses, for the last 64 solves: 64 datasets)."""
    import gc

    def solve(i):
        x = jnp.full((1000, 4), float(i), jnp.float32)
        return loopfuse.minimize(lambda p: jnp.mean((x @ p - 1.0) ** 2), jnp.ones(4), optimizer=optax.adam(1e-2),
                                 steps=3).params
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    kept = [solve(i) for i in range(3)]
    gc.collect()
    left = [a.shape for a in jax.live_arrays() if id(a) not in before]
    assert left.count((4,)) == len(kept)                                   # the solutions' params
    # jax 0.11+'s own AOT lowering as loopfuse calls it (``jax.jit(f, keep_unused=True).trace(...).lower()`` in plain
    # jax does the same) keeps what a function closes over, in its caches; jax.jit's call path keeps none
    assert left.count((1000, 4)) == (len(kept) if NEWER_XLA else 0), left


def test_a_bound_method_loss_is_one_program(compiles):
    """Each access of ``model.loss`` makes a new method object: its object and function key the program."""
    class Model:
        def loss(self, params, data):
            return mlp_loss(params, data)
    model = Model()
    solve = lambda: loopfuse.minimize(model.loss, mlp_params(), batch(), opt, steps=4, backend=CompiledStep())
    opt = optax.adam(1e-2)
    first = solve()
    counts = dict(compiles)
    assert_trees_equal(solve().params, first.params)
    assert compiles == counts
    other = Model()
    assert_trees_equal(loopfuse.minimize(other.loss, mlp_params(), batch(), opt, steps=4, backend=CompiledStep()).params,
                       first.params)
    # another object: another program, as jax.jit; the same module, so its executable is the one kept in memory
    assert _program(other.loss, True, opt, CompiledStep(), None) is not _program(model.loss, True, opt, CompiledStep(), None)
    assert compiles["loopfuse"] == counts["loopfuse"]          # (its jitted initial state is jax.jit's to compile)


def test_equal_objects_are_two_losses_and_an_unhashable_ones_method_is_kept_while_it_lives(compiles):
    """A bound method's object keys its programs by identity, as Python compares bound methods: two objects
    that compare equal are two losses (keyed by equality, the second solved the first's loss), and an object
    of a plain dataclass (unhashable) is one program per object, freed with it (it was never cached)."""
    import dataclasses
    import gc
    import weakref

    @dataclasses.dataclass(frozen=True)
    class Named:
        name: str
        target: np.ndarray = dataclasses.field(compare=False)

        def loss(self, w):
            return jnp.sum((w - self.target) ** 2)
    opt = optax.sgd(0.5)
    for target in (1.0, 5.0):
        sol = loopfuse.minimize(Named("q", np.full(2, target, np.float32)).loss, jnp.zeros(2), optimizer=opt, steps=1)
        assert sol.params.tolist() == [target, target]

    @dataclasses.dataclass
    class Plain:
        data: np.ndarray

        def loss(self, w):
            return jnp.sum((w - self.data) ** 2)
    problem = Plain(np.ones(4, np.float32))
    loopfuse.minimize(problem.loss, jnp.zeros(4), optimizer=opt, steps=2)
    counts = dict(compiles)
    loopfuse.minimize(problem.loss, jnp.zeros(4), optimizer=opt, steps=2)
    assert compiles == counts
    data = weakref.ref(problem.data)
    del problem
    gc.collect()
    if not NEWER_XLA:      # jax 0.11+'s own AOT lowering keeps what a traced function closes over (above)
        assert data() is None


def test_a_dataset_solve_repeats_without_compiling(compiles):
    opt, (x, y) = optax.sgd(0.1), (np.ones((32, 4), np.float32), np.ones((32, 1), np.float32))
    data = lambda seed: Dataset({"x": x, "y": y}, batch_size=8, key=jax.random.key(seed))
    loopfuse.minimize(mlp_loss, mlp_params(), data(0), opt, steps=6, backend=CompiledLoop(steps=3))
    counts = dict(compiles)
    loopfuse.minimize(mlp_loss, mlp_params(), data(1), opt, steps=6, backend=CompiledLoop(steps=3))
    assert compiles == counts


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import optax, loopfuse
from loopfuse.compile import xla
from problems import batch, mlp_loss, mlp_params
calls = []
compile_module = xla.compile_module
xla.compile_module = lambda *a, **k: calls.append(1) or compile_module(*a, **k)
sol = loopfuse.minimize(mlp_loss, mlp_params(), batch(), optax.adam(1e-2), steps=20,
                        backend=loopfuse.CompiledLoop(steps=8))
print(json.dumps({"compiles": len(calls), "loss": sol.loss_history.tolist()}))
"""


@pytest.mark.slow     # two processes; test_cache.py's second process loads a cached executable by default
def test_the_persistent_cache_serves_a_new_process(tmp_path):
    env = {**os.environ, "LOOPFUSE_CACHE_DIR": str(tmp_path)}

    def run():
        out = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], env=env, capture_output=True,
                             text=True, timeout=240, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    first, second = run(), run()
    assert first["compiles"] == 2 and second["compiles"] == 0     # loops of 8 and of 4 steps
    assert second["loss"] == first["loss"]


@pytest.mark.slow
def test_a_solve_of_many_chunks_compiles_its_loop_once(compiles):
    """optax.lbfgs's initial state holds weakly typed scalars that its update returns strongly typed:
    the loop carries them strongly typed from the first chunk on (as lax.scan would), so the later
    chunks run the first chunk's executable."""
    s = loopfuse.minimize(mlp_loss, mlp_params(), batch(), optax.lbfgs(), steps=12, backend=CompiledLoop(steps=4))
    assert s.steps == 12 and compiles["loopfuse"] == 1


def test_object_keys_follow_values_and_hold_arrays_by_identity():
    import functools
    from loopfuse.drivers.object_keys import object_key

    def scaled(factor, sign=1.0):
        return lambda g: sign * factor * g
    assert object_key(scaled(2.0)) == object_key(scaled(2.0)) != object_key(scaled(3.0))
    assert object_key(scaled(0.0)) != object_key(scaled(-0.0))              # by the float's bits
    assert object_key(scaled(1, True)) != object_key(scaled(1, 1))          # by type and value
    assert object_key(functools.partial(max, 1)) == object_key(functools.partial(max, 1))
    assert object_key({"lr": [1e-3, 2]}) == object_key({"lr": [1e-3, 2]}) != object_key({"lr": [1e-3, 3]})
    a = jnp.ones(3)
    assert object_key(scaled(a)) == object_key(scaled(a)) != object_key(scaled(jnp.ones(3)))   # arrays by identity

    def recursive(n):                                   # a closure that holds itself: no endless descent
        def f(k):
            return f(k - 1) if k else n
        return f
    assert object_key(recursive(1)) != object_key(recursive(1))
    hash(object_key(recursive(1)))


def test_an_optimizer_holding_an_object_that_cannot_be_compared_is_still_solved():
    class Odd:                      # hashable, but its == is an array (as a numpy-like object's may be)
        def __hash__(self):
            return 0

        def __eq__(self, other):
            return jnp.ones(2)

    def scaled(lr):
        inner, odd = optax.sgd(lr), Odd()
        return optax.GradientTransformation(inner.init, lambda g, s, p=None: (odd, inner.update(g, s, p))[1])
    def loss(p):
        return jnp.sum(p ** 2)
    first, again = (loopfuse.minimize(loss, jnp.ones(2), optimizer=scaled(0.1), steps=3) for _ in range(2))
    np.testing.assert_allclose(first.loss_history, [2.0, 1.28, 0.8192], rtol=1e-6)
    assert np.array_equal(first.loss_history, again.loss_history)
