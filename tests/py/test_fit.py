"""fit: chunked device loops, callbacks, progress and interrupt safety."""
import jax
import numpy as np
import optax
import pytest

import loopfuse
from problems import assert_trees_close, batch, fresh, init_state, train_step


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
    assert result.steps == 25 and not result.interrupted


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
    assert result.interrupted and result.steps == 20
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(result.state))
    ref, ref_step = init_state(opt), jax.jit(train_step(opt))
    for _ in range(20):
        ref, _ = ref_step(ref, batch())
    assert_trees_close(result.state, ref, rtol=1e-5)
    assert result.history["loss"].shape == (20,)


def test_fit_progress_bar_and_bad_arguments(capsys):
    opt = optax.sgd(0.1)
    loopfuse.fit(_step(opt), fresh(init_state(opt)), batch(), 4, chunk=2, progress=True)
    assert "4/4" in capsys.readouterr().err
    with pytest.raises(ValueError, match="must be positive"):
        loopfuse.fit(_step(opt), init_state(opt), batch(), 0)


def test_a_second_fit_reuses_the_compiled_loops():
    opt = optax.sgd(0.1)
    step = _step(opt)
    first = loopfuse.fit(step, fresh(init_state(opt)), batch(), 12, chunk=5, progress=False)
    loopfuse.fit(step, first.state, batch(), 12, chunk=5, progress=False)
    assert step.loop(5).compile_count == 1 and step.loop(2).compile_count == 1
