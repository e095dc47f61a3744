"""fit: chunked device loops, callbacks, progress, interrupt and exception safety."""
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
import loopfuse.drivers.chunks
from loopfuse.drivers.chunks import LoopChunks, _Run
from problems import (assert_trees_close, assert_trees_equal, batch, fresh, init_state, interrupted_runs,
                      progress_bar_updates, slow_state, slow_step, train_step)


def _step(opt):
    return loopfuse.compile_step(train_step(opt), keep_aux=("loss",))


def test_fit_equals_single_steps_and_reports_history():
    opt = optax.adam(1e-2)
    seen = []
    result = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 25, chunk=10, progress=False,
                          callback=lambda done, aux: seen.append((done, aux["loss"].shape)))
    assert seen == [(10, (10,)), (20, (10,)), (25, (5,))]
    ref, losses, ref_step = init_state(opt), [], jax.jit(train_step(opt))
    for _ in range(25):
        ref, aux = ref_step(ref, batch())
        losses.append(aux["loss"])
    assert_trees_close(result.state, ref, rtol=1e-5)
    np.testing.assert_allclose(result.history["loss"], losses, rtol=1e-5)
    assert result.steps == 25 and result.retcode == "max_steps" and not result.interrupted


def test_fit_with_dataset_continues_the_step_index_across_chunks():
    opt = optax.sgd(0.05)
    data = batch(n=40)
    ds = loopfuse.Dataset(data, batch_size=8)
    got = loopfuse.fit(_step(opt), fresh(init_state(opt)), ds, 12, chunk=5, progress=False)
    ref, ref_step = init_state(opt), jax.jit(train_step(opt))
    for i in range(12):
        j = (i % 5) * 8
        ref, _ = ref_step(ref, {k: v[j:j + 8] for k, v in data.items()})
    assert_trees_close(got.state, ref, rtol=1e-5)


def test_keyboard_interrupt_returns_the_last_complete_state():
    opt = optax.sgd(0.1)
    calls = []

    def stop_after_two(done, aux):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    result = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 100, chunk=10, progress=False,
                          callback=stop_after_two)
    assert result.interrupted and result.retcode == "interrupted" and result.steps == 20
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(result.state))
    ref, ref_step = init_state(opt), jax.jit(train_step(opt))
    for _ in range(20):
        ref, _ = ref_step(ref, batch())
    assert_trees_close(result.state, ref, rtol=1e-5)
    assert result.history["loss"].shape == (20,)


def test_fit_progress_bar(capsys):
    opt = optax.sgd(0.1)
    h = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 4, chunk=2, progress=True).history["loss"]
    assert progress_bar_updates(capsys.readouterr().err, 4) == [
        (0, ""), (2, f"loss={h[1]:.4g}"), (4, f"loss={h[3]:.4g}")]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_steps=0), ValueError, "num_steps must be a positive int, got 0"),
    (dict(num_steps=10.5), TypeError, "num_steps must be a positive int, got float 10.5"),
    (dict(num_steps=True), TypeError, "num_steps must be a positive int, got bool True"),
    (dict(num_steps=2**31), ValueError, "num_steps must be below 2\\*\\*31"),
    (dict(chunk=-1), ValueError, "chunk must be a positive int"),
    (dict(chunk="10"), TypeError, "chunk must be a positive int, got str '10'"),
    (dict(step=train_step(optax.sgd(0.1))), TypeError, "step must be a Step \\(loopfuse.compile_step\\(fn\\)\\), got function"),
    (dict(checkpoint_every=5), ValueError, "checkpoint_every= needs checkpoint_dir="),
    (dict(checkpoint_dir="unused", checkpoint_every=0), ValueError, "checkpoint_every must be a positive int"),
    (dict(checkpoint_dir="unused", keep=1.5), TypeError, "keep must be a positive int"),
    (dict(until=0.5), TypeError, "until must be a function \\(state, aux\\) -> scalar bool, got float"),
    (dict(stop_on_nonfinite=1), TypeError, "stop_on_nonfinite must be a bool, got 1"),
])
def test_fit_validates_before_running(kwargs, error, match):
    opt = optax.sgd(0.1)
    step, state = _step(opt), init_state(opt)
    args = dict(step=step, num_steps=4) | kwargs
    with pytest.raises(error, match=match):
        loopfuse.fit(state=state, batch=batch(), progress=False, **args)
    assert step.loop(4).compile_count == 0 and not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


def test_an_exception_after_a_chunk_raises_fit_error_with_the_state_reached():
    opt = optax.sgd(0.1)

    def fail_after_three(done, aux):
        if done == 30:
            raise RuntimeError("logger down")

    with pytest.raises(loopfuse.FitError, match="RuntimeError after 30 of 100 steps: logger down") as info:
        loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 100, chunk=10, progress=False,
                     callback=fail_after_three)
    result = info.value.result
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(result, loopfuse.FitResult) and result.steps == 30 and result.retcode == "error"
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(result.state))
    assert result.history["loss"].shape == (30,)
    ref = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 30, chunk=10, progress=False)
    assert_trees_equal(result.state, ref.state)
    np.testing.assert_array_equal(result.history["loss"], ref.history["loss"])


def test_a_failure_reading_the_first_chunk_back_keeps_the_state_it_reached(monkeypatch):
    """The first chunk consumed the caller's state when its history fails to reach the host: a FitError holds
    the state the chunk made (counted as no step done: its history is lost), never an error that drops it."""
    opt = optax.sgd(0.1)
    state = fresh(init_state(opt))

    def fails(tree):
        raise RuntimeError("host copy failed")

    monkeypatch.setattr(loopfuse.drivers.chunks, "host", fails)
    with pytest.raises(loopfuse.FitError, match="RuntimeError after 0 of 20 steps: host copy failed") as info:
        loopfuse.fit(_step(opt), state, batch(), 20, chunk=10, progress=False)
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(info.value.result.state))


def test_a_typed_key_in_the_aux_comes_back_as_its_key_data_in_the_history():
    """numpy holds no PRNG keys: fit's host history holds a kept key leaf as its key data, each row the key
    the loop's own history holds."""
    def step(state, b):
        w, key = state
        key, sub = jax.random.split(key)
        return (w - 0.1 * (w - b) + 0.01 * jax.random.normal(sub, w.shape), key), {"loss": jnp.sum(w), "key": sub}

    def start():
        return jnp.ones(3), jax.random.key(0)

    got = loopfuse.fit(loopfuse.compile_step(step), start(), jnp.zeros(3), 10, chunk=4, progress=False)
    _, aux = loopfuse.compile_step(step).loop(10)(start(), jnp.zeros(3))
    assert got.history["key"].dtype == np.uint32 and got.history["key"].shape == (10, 2)
    np.testing.assert_array_equal(got.history["key"], jax.random.key_data(aux["key"]))
    np.testing.assert_array_equal(got.history["loss"], aux["loss"])


def test_an_exception_before_any_chunk_completes_is_raised_as_is_and_consumes_nothing():
    opt = optax.sgd(0.1)
    state = fresh(init_state(opt))
    with pytest.raises(TypeError, match="contracting dimensions"):   # the batch has 3 features, not 4
        loopfuse.fit(_step(opt), state, dict(batch(), x=np.zeros((16, 3), np.float32)), 10, chunk=5, progress=False)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


@pytest.mark.parametrize("handler, retcode", [(signal.default_int_handler, "interrupted"), (signal.SIG_IGN, "max_steps")])
def test_sigint_between_chunks_interrupts_unless_the_process_ignores_it(handler, retcode):
    """The SIGINT is sent by the callback after chunk 2, so it surely lands during the run."""
    step, bias = loopfuse.compile_step(slow_step), jnp.float32(0.01)
    kill = lambda done, aux: done == 10 and os.kill(os.getpid(), signal.SIGINT)
    previous = signal.signal(signal.SIGINT, handler)
    try:
        result = loopfuse.fit(step, slow_state(), bias, 50, chunk=5, progress=False, callback=kill)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (result.retcode, result.steps) == (retcode, 10 if retcode == "interrupted" else 50)
    assert signal.getsignal(signal.SIGINT) is previous


def test_sigint_at_random_moments_returns_a_live_state_equal_to_an_uninterrupted_fit(sigint_raises):
    """A real SIGINT mostly lands while a chunk runs in XLA."""
    _interrupted_fits_equal_uninterrupted_ones(25, seed=1)


def test_sigint_with_a_deep_queue_returns_a_live_state_equal_to_an_uninterrupted_fit(sigint_raises, monkeypatch):
    """Chunks queued for up to a second behind the one running: a Ctrl-C stops after all of them."""
    monkeypatch.setattr(loopfuse.drivers.chunks, "CHAIN_SECONDS", 1.0)
    _interrupted_fits_equal_uninterrupted_ones(8, seed=3)


def _interrupted_fits_equal_uninterrupted_ones(runs: int, seed: int) -> None:
    """`runs` fits of the slow step, each hit by a real SIGINT at a random moment: each returns a live
    state after a whole number of chunks, bitwise an uninterrupted fit of that many steps."""
    step, bias = loopfuse.compile_step(slow_step), jnp.float32(0.01)
    run = lambda n, state: loopfuse.fit(step, state, bias, n, chunk=5, progress=False)
    refs: dict = {}
    for result in interrupted_runs(run, runs, seed=seed):
        assert result.interrupted and result.steps % 5 == 0
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(result.state))
        if result.steps not in refs:
            refs[result.steps] = run(result.steps, slow_state()).state if result.steps else slow_state()
        assert_trees_equal(result.state, refs[result.steps])


@pytest.fixture
def chunk_events(monkeypatch):
    """("dispatch", first step) and ("read", steps done) of every chunk a fit runs, in order."""
    seen = []
    run, read_back = LoopChunks.run, _Run.read_back

    def dispatching(self, state, start, k, after=None):
        seen.append(("dispatch", start))
        return run(self, state, start, k, after)

    def reading(self):
        out = read_back(self)
        seen.append(("read", self.done))
        return out
    monkeypatch.setattr(LoopChunks, "run", dispatching)
    monkeypatch.setattr(_Run, "read_back", reading)
    return seen


@pytest.mark.parametrize("chain_seconds, callback, queued", [(60.0, False, True), (0.0, False, False), (60.0, True, False)],
                         ids=["queued", "chunks-longer-than-chain-seconds", "callback"])
def test_fit_queues_chunks_behind_the_one_running(chunk_events, monkeypatch, chain_seconds, callback, queued):
    """The first chunk runs alone (its time sizes the queue); then as many as take CHAIN_SECONDS are
    queued behind the one running, and read back in order. A chunk longer than that is alone in flight;
    a callback sees each chunk before the next is dispatched. The results are the same."""
    monkeypatch.setattr(loopfuse.drivers.chunks, "CHAIN_SECONDS", chain_seconds)
    opt = optax.adam(1e-2)
    seen = []
    result = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 40, chunk=5, progress=True,
                          callback=(lambda done, aux: seen.append(done)) if callback else None)
    starts, ends = range(5, 40, 5), range(10, 45, 5)
    after_first = ([("dispatch", s) for s in starts] + [("read", d) for d in ends] if queued else
                   [e for s, d in zip(starts, ends) for e in (("dispatch", s), ("read", d))])
    assert chunk_events == [("dispatch", 0), ("read", 5)] + after_first
    assert seen == ([5, *ends] if callback else [])
    reference = loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 40, chunk=5, progress=False,
                             callback=lambda done, aux: None)
    assert_trees_equal((result.state, result.history), (reference.state, reference.history))


def test_a_second_fit_reuses_the_compiled_loops():
    opt = optax.sgd(0.1)
    step = _step(opt)
    first = loopfuse.fit(step, fresh(init_state(opt)), batch(), 12, chunk=5, progress=False)
    loopfuse.fit(step, first.state, batch(), 12, chunk=5, progress=False)
    assert step.loop(5).compile_count == 1 and step.loop(2).compile_count == 1
