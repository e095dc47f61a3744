"""Chained chunks: a pipelined stopping chunk is dispatched before the previous one's stop is read,
and runs no step when that chunk stopped (`Step.after`, wrap-loop's initial stopped flag).

References: the plain call and the plain run of the steps that ran (bit for bit), compile counts,
and the steps each dispatched chunk reports.
"""
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.drivers.backends import CompiledLoop
from loopfuse.drivers.chunks import LoopChunks, drive
from loopfuse.drivers.solve import minimize
from problems import (LSQ_PARAMS, assert_trees_equal, batch, between, fresh, init_state, interrupted_runs, lsq_data,
                      lsq_loss, slow_state, slow_step, train_step)


def _loop(k=4, **kwargs):
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt)).loop(k, stop_on_nonfinite=True, **kwargs)
    return step, init_state(opt), batch()


@pytest.mark.parametrize("stopped", [False, True])
def test_after_runs_the_call_or_no_step_as_the_flag_says(stopped):
    step, state, b = _loop()
    want = step(fresh(state), b) if not stopped else (state, None, 0, True)
    flag = jnp.asarray(stopped)                   # a device array, as the previous call's flag is
    got = step.after(flag, fresh(state), b)
    assert_trees_equal(got[0], want[0])
    assert (int(got[2]), bool(got[3])) == (want[2], want[3])
    if stopped:
        assert np.isnan(got[1]["loss"]).all()      # no history row was written
    else:
        assert_trees_equal(got[1], want[1])
    assert step.compile_count == 1                 # the plain call and `after` share one executable


def test_after_is_only_for_a_loop_that_can_stop():
    opt = optax.sgd(0.1)
    with pytest.raises(ValueError, match="loop that can stop early"):
        loopfuse.compile_step(train_step(opt)).loop(4).after(jnp.asarray(False), init_state(opt), batch())


@pytest.fixture
def dispatched(monkeypatch):
    """(start, k, chained, steps run) of every LoopChunks chunk that can stop (read at once)."""
    seen = []
    run = LoopChunks.run

    def recording(self, state, start, k, after=None):
        out = run(self, state, start, k, after)
        if out[2] is not None:
            seen.append((start, k, after is not None, int(out[2].steps)))
        return out
    monkeypatch.setattr(LoopChunks, "run", recording)
    return seen


def test_a_stop_in_chunk_3_of_20_equals_the_plain_run_and_the_next_chunk_runs_no_step(dispatched):
    losses = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(0.1), 40, backend=CompiledLoop(steps=8),
                      stop_on_nonfinite=False).loss_history
    threshold = between(losses, 21)               # step 21: the 5th of chunk 3
    backend = CompiledLoop(steps=8)
    s = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(0.1), 160, backend=backend,
                 until=lambda params, loss: loss < threshold)
    assert (s.steps, s.retcode, s.loss_history.shape) == (21, "converged", (21,))
    assert dispatched[:3] == [(0, 8, False, 8), (8, 8, True, 8), (16, 8, True, 5)]
    assert dispatched[3:] and all(chained and ran == 0 for _, _, chained, ran in dispatched[3:])
    plain = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(0.1), 21, backend=backend, stop_on_nonfinite=False)
    assert_trees_equal(s.params, plain.params)
    np.testing.assert_array_equal(s.loss_history, plain.loss_history)


def test_chunks_in_flight_are_bounded_by_chain_seconds(dispatched, monkeypatch):
    """With no time to queue, two chunks are in flight: one chunk runs (no step) after the stop."""
    import loopfuse.drivers.chunks
    monkeypatch.setattr(loopfuse.drivers.chunks, "CHAIN_SECONDS", 0.0)
    losses = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(0.1), 40, backend=CompiledLoop(steps=8),
                      stop_on_nonfinite=False).loss_history
    threshold = between(losses, 21)
    s = minimize(lsq_loss, LSQ_PARAMS, lsq_data(), optax.sgd(0.1), 160, backend=CompiledLoop(steps=8),
                 until=lambda params, loss: loss < threshold)
    assert s.steps == 21 and dispatched == [(0, 8, False, 8), (8, 8, True, 8), (16, 8, True, 5), (24, 8, True, 0)]


def test_a_non_finite_loss_stops_a_chained_run_where_an_unchained_one_stops(dispatched, tmp_path):
    """The unchained reference: the same run checkpointed at every chunk, which waits for each chunk
    (a checkpoint needs its state)."""
    loss = lambda p: jnp.sum(p ** 2)
    run = lambda **kw: minimize(loss, jnp.ones(2), None, optax.sgd(1e3), 40, backend=CompiledLoop(steps=4), **kw)
    s = run()
    assert (s.retcode, s.steps) == ("non_finite", 7) and np.isfinite(s.loss_history[:-1]).all()
    assert dispatched[:2] == [(0, 4, False, 4), (4, 4, True, 3)]
    assert dispatched[2:] and all(chained and ran == 0 for _, _, chained, ran in dispatched[2:])
    del dispatched[:]
    unchained = run(checkpoint_dir=tmp_path, checkpoint_every=4)
    assert dispatched == [(0, 4, False, 4), (4, 4, False, 3)]
    assert (unchained.steps, unchained.retcode) == (s.steps, s.retcode)
    assert_trees_equal(unchained.params, s.params)
    np.testing.assert_array_equal(unchained.loss_history, s.loss_history)


def test_repeated_chained_solves_build_no_further_executable():
    from loopfuse.drivers.solve import _flag, _program
    backend, opt, until = CompiledLoop(steps=8), optax.sgd(0.1), (lambda params, loss: loss < 0.0)
    for steps in (40, 40, 16):
        minimize(lsq_loss, LSQ_PARAMS, lsq_data(), opt, steps, backend=backend, until=until)
    _, program = _program(lsq_loss, True, opt, backend, until)   # as minimize asks
    assert program.loop(8, until=_flag, stop_on_nonfinite=True).compile_count == 1


def test_sigint_during_chained_chunks_returns_a_live_state_equal_to_the_plain_run(sigint_raises):
    """Two chunks are in flight: the interrupted result counts the steps of both, and its state is
    the plain run's of that many steps."""
    step, bias = loopfuse.compile_step(slow_step), jnp.float32(0.01)
    never = lambda state, aux: aux["s"] < -1e30
    run = lambda n, state: drive(LoopChunks(step, bias, never, True), state, n, chunk=5, pipelined=True)
    plain = lambda n: loopfuse.fit(step, slow_state(), bias, n, chunk=5, progress=False).state
    refs: dict = {}
    for result in interrupted_runs(run, 12, seed=2):
        assert result.interrupted and result.steps % 5 == 0
        assert result.steps == 0 or result.history["s"].shape == (result.steps,)
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(result.state))
        if result.steps not in refs:
            refs[result.steps] = plain(result.steps) if result.steps else slow_state()
        assert_trees_equal(result.state, refs[result.steps])


def test_minimize_ctrl_c_raises_and_leaves_the_callers_params(sigint_raises, monkeypatch):
    """A SIGINT during a chained solve (sent by the 2nd chunk's dispatch) raises KeyboardInterrupt;
    the caller's params are copied, never donated."""
    run, calls = LoopChunks.run, []

    def sending(self, state, start, k, after=None):
        calls.append(after is not None)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return run(self, state, start, k, after)
    monkeypatch.setattr(LoopChunks, "run", sending)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    with pytest.raises(KeyboardInterrupt):
        minimize(lsq_loss, params, lsq_data(), optax.sgd(0.1), 80, backend=CompiledLoop(steps=8))
    assert calls == [False, True]      # held while the chunk was dispatched, delivered after it
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))


def test_a_chained_solve_over_a_dataset_stops_where_the_host_check_stops(dispatched):
    """The step index and the stopped flag are both arguments of a chained loop: each chunk sees its
    global steps' batches; GradOnly, which checks on the host after every step, is the reference."""
    x, y = lsq_data(n=48)
    ds = loopfuse.Dataset((x, y), batch_size=8, key=jax.random.key(3))
    run = lambda backend, steps: minimize(lsq_loss, LSQ_PARAMS, ds, optax.sgd(0.05), steps, backend=backend,
                                          until=lambda params, loss: loss < threshold)
    threshold = -1.0
    losses = run(loopfuse.GradOnly(), 40).loss_history
    threshold = float(losses[21]) * (1 + 1e-4)            # step 22 at the latest, past the first chunk
    ref, s = run(loopfuse.GradOnly(), 40), run(CompiledLoop(steps=4), 40)
    assert 4 < ref.steps <= 22 and (s.steps, s.retcode) == (ref.steps, ref.retcode) == (s.steps, "converged")
    assert any(chained and ran == 0 for _, _, chained, ran in dispatched)
    np.testing.assert_allclose(s.loss_history, ref.loss_history, rtol=1e-5)
