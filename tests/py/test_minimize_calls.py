"""How `minimize`'s default backend runs a solve as device calls (`CompiledLoop()`, steps chosen from the
program: `chunks.steps_per_call`), and the non-finite stop checked on the host after one call of a step
without loops of its own (`solve._Loop.unwatched`).

References: the same solve in calls of 100 steps (the default before, `CompiledLoop(steps=100)`), bit for
bit, and where that one is bitwise a jitted `lax.fori_loop` of the same steps, this one too; the device calls
each run makes.
"""
import gc
import os
import signal
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import CompiledLoop, Dataset
from loopfuse.compile import compiler
from loopfuse.drivers.chunks import CALL_BYTES, CHUNK, OP_BYTES, LoopChunks, steps_per_call
from loopfuse.drivers.ensemble import Solo
from loopfuse.drivers import solve
from loopfuse.drivers.solve import _Loop
from loopfuse.compile.mlir_context import parse_module
from problems import assert_trees_equal, fori_solve

ADAM = optax.adam(1e-3)


def loss(params, data):
    return jnp.mean((jnp.tanh(data["x"] @ params["w0"]) @ params["w1"] - data["y"]) ** 2)


def looped_loss(params, data):
    """`loss` through a loop of its own (a stablehlo.while in the step)."""
    h = jax.lax.fori_loop(0, 2, lambda i, h: jnp.tanh(h), data["x"] @ params["w0"])
    return jnp.mean((h @ params["w1"] - data["y"]) ** 2)


def mlp(batch: int, width: int):
    """(params, data) of a 4-`width`-1 tanh MLP on `batch` rows (bench_minimize_call's family)."""
    rng = np.random.default_rng(0)
    params = {"w0": rng.normal(size=(4, width)) / 2, "w1": rng.normal(size=(width, 1)) / np.sqrt(width)}
    data = {"x": rng.normal(size=(batch, 4)), "y": rng.normal(size=(batch, 1))}
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), (params, data))


def bitwise(a, b) -> bool:
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def assert_same_solution(s, reference):
    assert (s.steps, s.retcode) == (reference.steps, reference.retcode)
    assert_trees_equal(s.params, reference.params)
    assert_trees_equal(s.loss_history, reference.loss_history)


@pytest.fixture
def calls(monkeypatch):
    """(steps, stops on a non-finite loss) of every device call a loop runner makes: chunks of `drive` and a
    run of one unwatched call (`_Loop.whole`, `_Loop.started`)."""
    seen = []
    run, whole, started = LoopChunks.run, _Loop.whole, _Loop.started

    def recording(self, state, start, k, after=None):
        seen.append((k, self.stop_on_nonfinite))
        return run(self, state, start, k, after)

    def recording_whole(self, state, steps):
        seen.append((steps, self.stop_on_nonfinite))
        return whole(self, state, steps)

    def recording_started(self, init, params, steps):
        seen.append((steps, self.stop_on_nonfinite))
        return started(self, init, params, steps)
    monkeypatch.setattr(LoopChunks, "run", recording)
    monkeypatch.setattr(_Loop, "whole", recording_whole)
    monkeypatch.setattr(_Loop, "started", recording_started)
    return seen


# 8 x 4: every tensor of the step at most 512 bytes, the history written in blocks (wrap-loop's rows);
# 256 x 64: XLA:CPU runs the loop body through its concurrent executor
@pytest.mark.parametrize("batch, width", [(8, 4), (32, 8), (256, 64)])
def test_a_tiny_solve_is_one_call_bitwise_the_calls_of_100_steps(batch, width, calls):
    params, data = mlp(batch, width)
    s = loopfuse.minimize(loss, params, data, ADAM, steps=300)
    assert calls == [(300, False)]      # one call, the loop without its stop: the host checks the losses after it
    calls.clear()
    chunked = loopfuse.minimize(loss, params, data, ADAM, steps=300, backend=CompiledLoop(steps=100))
    assert calls == [(100, True)] * 3
    assert_same_solution(s, chunked)
    reference = fori_solve(loss, ADAM, 300)(params, data)
    if bitwise((chunked.params, chunked.loss_history), reference):    # was bitwise jax.jit's: still is
        assert bitwise((s.params, s.loss_history), reference)


def test_a_diverging_solve_stops_after_its_first_non_finite_loss_as_the_stopping_loop_does(calls):
    params, data = mlp(32, 8)
    opt = optax.sgd(1e3)
    s = loopfuse.minimize(loss, params, data, opt, steps=300)
    assert calls == [(300, False), (300, True)]     # the call checked after, then the stopping loop from the start
    assert s.retcode == "non_finite" and s.steps < 300 and s.loss_history.shape == (s.steps,)
    assert np.isfinite(s.loss_history[:-1]).all() and not np.isfinite(s.loss_history[-1])
    assert_same_solution(s, loopfuse.minimize(loss, params, data, opt, steps=300, backend=CompiledLoop(steps=100)))
    calls.clear()
    assert_same_solution(loopfuse.minimize(loss, params, data, opt, steps=300), s)    # repeated: as planned
    assert calls == [(300, False), (300, True)]
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))


def test_ctrl_c_during_the_one_call_raises_and_leaves_the_callers_params(sigint_raises, monkeypatch):
    """A SIGINT while the one call's history is read back (its state donated, the new one bound) raises
    KeyboardInterrupt out of minimize, the caller's params intact; the same solve then runs to the same end."""
    params, data = mlp(32, 8)
    reference = loopfuse.minimize(loss, params, data, ADAM, steps=300)
    read = solve.host

    def sending(tree):
        os.kill(os.getpid(), signal.SIGINT)
        return read(tree)
    monkeypatch.setattr(solve, "host", sending)
    with pytest.raises(KeyboardInterrupt):
        loopfuse.minimize(loss, params, data, ADAM, steps=300)
    monkeypatch.setattr(solve, "host", read)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))
    assert_same_solution(loopfuse.minimize(loss, params, data, ADAM, steps=300), reference)


@pytest.mark.parametrize("backend", [CompiledLoop(devices=jax.devices()[:1]), CompiledLoop(memory_limit="1GiB")],
                         ids=["mesh", "memory-limit"])
def test_a_program_that_cannot_start_from_the_params_runs_its_one_call_on_the_initial_state(backend, calls):
    """A mesh's program takes the state's shardings and a memory limit's plan is chosen on the state: their one
    call runs from an initial state made apart (`options.init_refused`), as the calls of 100 steps do."""
    params, data = mlp(32, 8)
    s = loopfuse.minimize(loss, params, data, ADAM, steps=300, backend=backend)
    assert calls == [(300, False)]
    assert_same_solution(s, loopfuse.minimize(loss, params, data, ADAM, steps=300, backend=CompiledLoop(steps=100)))


class _Tempered(NamedTuple):
    temperature: jax.Array


def _tempered(t: float) -> optax.GradientTransformation:
    """Gradient descent by ``-g / temperature``, the temperature a constant of the optimizer's state."""
    def update(grads, state, params=None):
        return jax.tree_util.tree_map(lambda g: -g / state.temperature, grads), state
    return optax.GradientTransformation(lambda params: _Tempered(jnp.asarray(t, jnp.float32)), update)


def test_a_constant_the_init_makes_is_not_folded_into_the_loop(calls):
    """A state leaf the init makes a constant and the steps never change (a hyperparameter): the one call's loop
    still divides by it (fold-init's barrier; XLA would multiply by its inverse), bitwise the calls of 20 steps
    on the state made apart, the first solve and a repeated one."""
    params, data = mlp(32, 8)
    opt = _tempered(7.0)
    chunked = loopfuse.minimize(loss, params, data, opt, steps=40, backend=CompiledLoop(steps=20))
    calls.clear()
    for _ in range(2):
        assert_same_solution(loopfuse.minimize(loss, params, data, opt, steps=40), chunked)
    assert calls == [(40, False)] * 2


def test_what_cannot_start_from_the_params_runs_on_the_initial_state_made_apart(calls):
    """An optimizer state holding a typed PRNG key, a loss with ordered effects, an init that prints: the
    solve's one call runs on the initial state made apart (`InitFoldError`, remembered: no second try), its
    results as the calls of 100 steps'."""
    params, data = mlp(32, 8)

    class Keyed(NamedTuple):
        key: jax.Array
    keyed = optax.chain(optax.adam(1e-3), optax.GradientTransformation(lambda p: Keyed(jax.random.key(0)),
                                                                      lambda g, s, p=None: (g, s)))

    def ordered(p, d):
        jax.debug.print("{}", p["w1"][0, 0], ordered=True)
        return loss(p, d)
    printing = optax.GradientTransformation(lambda p: jax.debug.print("init") or optax.adam(1e-3).init(p),
                                            optax.adam(1e-3).update)
    for fn, opt in ((loss, keyed), (ordered, ADAM), (loss, printing)):
        calls.clear()
        s = loopfuse.minimize(fn, params, data, opt, steps=3)
        assert_same_solution(loopfuse.minimize(fn, params, data, opt, steps=3), s)
        assert calls == [(3, False)] * 2
        assert_same_solution(s, loopfuse.minimize(fn, params, data, opt, steps=3, backend=CompiledLoop(steps=1)))


def test_a_solve_keeps_no_data_of_its_own(calls):
    """What a solve keeps for the next one of its signature holds none of its data."""
    params, data = mlp(32, 8)
    loopfuse.minimize(loss, params, data, ADAM, steps=30)
    seen = weakref.ref(data["x"])
    del data
    gc.collect()
    assert seen() is None


def test_a_followed_run_of_one_call_stops_in_the_loop(calls):
    """A run of one call that the host follows (a progress bar, checkpoints) stops in its loop: nothing it shows
    or saves is a state the solve does not return."""
    params, data = mlp(32, 8)
    s = loopfuse.minimize(loss, params, data, optax.sgd(1e3), steps=300, backend=CompiledLoop(steps=300),
                          progress=True)
    assert calls == [(300, True)] and s.retcode == "non_finite"


def test_without_the_non_finite_stop_the_losses_are_not_checked(calls):
    params, data = mlp(32, 8)
    s = loopfuse.minimize(loss, params, data, optax.sgd(1e3), steps=300, stop_on_nonfinite=False)
    assert calls == [(300, False)] and (s.steps, s.retcode) == (300, "max_steps")


def test_an_until_stops_in_the_one_call(calls):
    params, data = mlp(32, 8)
    losses = loopfuse.minimize(loss, params, data, ADAM, steps=300).loss_history
    calls.clear()
    s = loopfuse.minimize(loss, params, data, ADAM, steps=300, until=lambda p, value: value < losses[199])
    assert calls == [(300, True)] and (s.steps, s.retcode) == (201, "converged")
    np.testing.assert_array_equal(s.loss_history, losses[:201])


@pytest.mark.parametrize("how", ["progress", "dataset", "loops of its own"])
def test_calls_of_100_steps_where_the_host_follows_the_run_or_the_step_has_loops(how, calls):
    params, data = mlp(32, 8)
    kwargs = {"progress": True} if how == "progress" else {}
    if how == "dataset":
        data = Dataset(data, batch_size=8)
    s = loopfuse.minimize(looped_loss if how == "loops of its own" else loss, params, data, ADAM, steps=250, **kwargs)
    assert calls == [(CHUNK, True), (CHUNK, True), (50, True)] and s.steps == 250


def test_a_repeated_solve_traces_compiles_and_plans_nothing(monkeypatch, calls):
    """The second solve of a signature traces and compiles nothing, and makes no initial state of its own: the
    first one's plan (`solve._whole`) runs its loop from the params in one call, the caller's params kept."""
    params, data = mlp(32, 8)
    first = loopfuse.minimize(loss, params, data, ADAM, steps=300)
    traces, planned = [], []
    trace, wrap = compiler.trace, Solo.wrap
    monkeypatch.setattr(compiler, "trace", lambda *args, **kwargs: traces.append(1) or trace(*args, **kwargs))
    monkeypatch.setattr(Solo, "wrap", lambda *args, **kwargs: planned.append(1) or wrap(*args, **kwargs))
    again = jax.tree_util.tree_map(jnp.copy, params)
    assert_same_solution(loopfuse.minimize(loss, again, data, ADAM, steps=300), first)
    assert traces == planned == [] and calls == [(300, False)] * 2
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(again))
    other = mlp(32, 8)[1] | {"y": -data["y"]}       # other data of the same signature: its own solve
    monkeypatch.setattr(Solo, "wrap", wrap)
    assert_same_solution(loopfuse.minimize(loss, params, other, ADAM, steps=300),
                         loopfuse.minimize(loss, params, other, ADAM, steps=300, backend=CompiledLoop(steps=100)))
    sgd = optax.sgd(1e3)
    assert loopfuse.minimize(loss, params, data, sgd, steps=300).retcode == "non_finite"   # planned with the stop,
    assert loopfuse.minimize(loss, params, data, sgd, steps=300, stop_on_nonfinite=False).retcode == "max_steps"


def test_steps_per_call_reads_the_step():
    def module(n: int, loop: bool = False):
        t = f"tensor<{n}xf32>"
        twice = f"%1 = func.call @double(%0) : ({t}) -> {t}"
        while_ = (f"%1 = stablehlo.while(%a = %0) : {t} cond {{ %c = stablehlo.constant dense<false> : tensor<i1> "
                  f"stablehlo.return %c : tensor<i1> }} do {{ stablehlo.return %a : {t} }}")
        return parse_module(f"""
        func.func @main(%x: {t}) -> {t} {{
          %0 = func.call @double(%x) : ({t}) -> {t}
          {while_ if loop else twice}
          return %1 : {t}
        }}
        func.func private @double(%x: {t}) -> {t} {{
          %c = stablehlo.constant dense<2.0> : {t}
          %0 = stablehlo.multiply %x, %c : {t}
          return %0 : {t}
        }}""")
    # two calls of @double: two multiplies of 16 floats (its constant is no work)
    assert steps_per_call(module(16), "cpu") == CALL_BYTES["cpu"] // (2 * 64 + 2 * OP_BYTES["cpu"])
    assert steps_per_call(module(2**26), "cpu") == CHUNK      # 256 MiB per value: never fewer than CHUNK
    assert steps_per_call(module(16, loop=True), "cpu") == CHUNK
    assert steps_per_call(module(16), "gpu") == CHUNK         # not measured there: calls of CHUNK as before


@pytest.mark.parametrize("params", [{}, None, ()], ids=["dict", "none", "tuple"])
def test_params_of_no_leaves_run_on_every_backend(params):
    """Nothing to carry: the default backend's loop started from the params (fold-init) makes no state."""
    for backend in (loopfuse.CompiledLoop(), loopfuse.CompiledStep(), loopfuse.GradOnly()):
        sol = loopfuse.minimize(lambda p: jnp.float32(1.0), params, optimizer=optax.sgd(0.1), steps=3, backend=backend)
        assert (sol.params, sol.loss_history.tolist(), sol.retcode) == (params, [1.0, 1.0, 1.0], "max_steps")


def test_a_numpy_step_count_gives_python_ints(tmp_path):
    """Every count an entry point takes (steps, chunk, CompiledLoop's steps, checkpoint_every, keep, max_batch) is
    taken as the int it is: a numpy one came back as Solution.steps, or failed to be written as JSON."""
    for backend in (loopfuse.CompiledLoop(), loopfuse.CompiledLoop(steps=np.int64(2))):
        sol = loopfuse.minimize(lambda p: jnp.sum(p ** 2), jnp.ones(2), optimizer=optax.sgd(0.1), steps=np.int64(5),
                                backend=backend)
        assert type(sol.steps) is int and sol.steps == 5
    sol = loopfuse.minimize(lambda p: jnp.sum(p ** 2), jnp.ones(2), optimizer=optax.sgd(0.1), steps=4,
                            checkpoint_dir=tmp_path / "ck", checkpoint_every=np.int64(2), keep=np.int32(1))
    assert sol.steps == 4
    fit = loopfuse.largest_batch(lambda w, b: (w * jnp.mean(b), {}), jnp.ones(4), lambda n: jnp.ones((n, 4)),
                                 memory_limit="1GiB", max_batch=np.int64(8))
    assert fit.batch_size == 8
    result = loopfuse.fit(loopfuse.compile_step(lambda s, b: (s * 0.5, {"loss": jnp.sum(s)})), jnp.ones(2), (),
                          np.int64(4), chunk=np.int32(2), progress=False)
    assert type(result.steps) is int and result.steps == 4
