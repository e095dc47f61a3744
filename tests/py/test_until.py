"""Stopping inside the device loop: ``Step.loop(K, until=pred, stop_on_nonfinite=True)``.

References: the same step compiled without a loop, called once per step (bit for bit on CPU),
and, for the pass alone, the StableHLO reference interpreter running the unstopped loop of as
many steps as the stopped one ran.
"""
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

from loopfuse import Dataset, StepOptions, compile_step
from loopfuse.compile import stopping
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import DropUnusedOutputs, WrapLoop
from loopfuse.compile.trace import trace
from ir_helpers import interpret
from problems import batch, fresh, init_state, mlp_params, train_step

K = 8


def single_steps(fn, state, batch, n, keep_aux=None, start=0):
    """`n` calls of the step compiled alone: (final state, [aux of each step])."""
    single, auxes = compile_step(fn, keep_aux=keep_aux), []
    for i in range(n):
        state, aux = single(state, batch, start=start + i)
        auxes.append(aux)
    return state, auxes


def assert_bitwise(actual, expected):
    a, b = jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_history(history, rows, steps):
    """The first `steps` rows are the per-step values bit for bit; the rest NaN (inexact) or 0."""
    h = np.asarray(history)
    assert h.shape[0] == K
    np.testing.assert_array_equal(h[:steps], np.stack([np.asarray(r) for r in rows]))
    unwritten = h[steps:]
    if np.issubdtype(h.dtype, np.inexact):
        assert np.isnan(unwritten).all()
    else:
        assert (unwritten == 0).all()


# momentum slow: the stop reads the loss, whatever the optimizer
@pytest.mark.parametrize("opt", [optax.adam(1e-2), pytest.param(optax.sgd(0.1, momentum=0.9), marks=pytest.mark.slow)],
                         ids=["adam", "momentum"])
def test_until_equals_the_steps_run_one_by_one(opt):
    fn, b, state0 = train_step(opt), batch(), init_state(opt)
    ref_state, ref_aux = single_steps(fn, fresh(state0), b, 5, keep_aux=("loss",))
    losses = [float(a["loss"]) for a in ref_aux]
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 5  # step 5 is the first below
    threshold = losses[4]

    loop = compile_step(fn, keep_aux=("loss",)).loop(K, until=lambda state, aux: aux["loss"] <= threshold)
    state, aux, steps, stopped = loop(fresh(state0), b)
    assert steps.dtype == jnp.int32 and steps.shape == () and int(steps) == 5
    assert stopped.dtype == jnp.bool_ and stopped.shape == () and bool(stopped)
    assert_bitwise(state, ref_state)
    assert_history(aux["loss"], [a["loss"] for a in ref_aux], 5)


def test_until_equals_the_plain_loop_of_the_steps_run():
    """Every aux history (the gradients too) pads with NaN past the steps run. (With the gradient
    history kept, XLA fuses the loop body differently from the single step, so the plain loop
    itself is the bitwise reference here.)"""
    opt = optax.adam(1e-2)
    fn, b, state0 = train_step(opt), batch(), init_state(opt)
    plain_state, plain_aux = compile_step(fn).loop(5)(fresh(state0), b)
    loop = compile_step(fn).loop(K, until=lambda state, aux: state[1][0].count >= 5)
    state, aux, steps, stopped = loop(fresh(state0), b)
    assert int(steps) == 5 and bool(stopped)
    assert_bitwise(state, plain_state)
    for hist, rows in zip(jax.tree_util.tree_leaves(aux), jax.tree_util.tree_leaves(plain_aux)):
        assert_history(hist, list(np.asarray(rows)), 5)


def test_a_stop_at_the_last_step_says_so():
    """Asked to stop at step K, a loop has run all K steps: only the stopped flag tells it from one
    that was not asked to (what a driver needs to run no further chunk)."""
    opt = optax.adam(1e-2)
    step, until = compile_step(train_step(opt), keep_aux=("loss",)), lambda state, aux: state[1][0].count >= 3
    for k, stopped in ((3, True), (2, False)):
        _, _, steps, flag = step.loop(k, until=until)(fresh(init_state(opt)), batch())
        assert int(steps) == k and bool(flag) is stopped


def test_until_reads_the_new_state_with_a_dataset_and_start():
    """The predicate sees the state after the step (adam's count); integer histories pad with 0."""
    opt = optax.adam(1e-2)
    base = train_step(opt)

    def fn(state, b):
        new_state, aux = base(state, b)
        return new_state, {"loss": aux["loss"], "first": b["i"][0]}

    x = batch(n=24)
    ds = Dataset({**x, "i": np.arange(24, dtype=np.int32)}, batch_size=8)
    state0 = init_state(opt)
    loop = compile_step(fn).loop(K, until=lambda state, aux: state[1][0].count >= 3)
    state, aux, steps, _ = loop(fresh(state0), ds, start=2)
    assert int(steps) == 3
    ref_state, ref_aux = single_steps(fn, fresh(state0), ds, 3, start=2)
    assert_bitwise(state, ref_state)
    assert_history(aux["first"], [a["first"] for a in ref_aux], 3)
    assert_history(aux["loss"], [a["loss"] for a in ref_aux], 3)
    np.testing.assert_array_equal(np.asarray(aux["first"])[:3], [16, 0, 8])  # batches 2, 0, 1 of 3


def test_a_flag_the_step_computes_is_an_aux_leaf_it_does_not_return():
    """The flag of the loss before the update, computed inside the step: the loop stops where `until`
    on that loss stops, bitwise, and returns no history of the flag (drop-unused-outputs)."""
    opt = optax.adam(1e-2)
    base, b, state0 = train_step(opt), batch(), init_state(opt)
    _, ref_aux = single_steps(base, fresh(state0), b, 5, keep_aux=("loss",))
    threshold = float(ref_aux[4]["loss"])

    def fn(state, b):
        new_state, aux = base(state, b)
        return new_state, {"loss": aux["loss"], "stop": aux["loss"] <= threshold}

    step = compile_step(fn, keep_aux=("loss",))
    state, aux, steps, stopped = step.loop(K, until=lambda state, aux: aux["stop"])(fresh(state0), b)
    ref = compile_step(base, keep_aux=("loss",)).loop(K, until=lambda state, aux: aux["loss"] <= threshold)(
        fresh(state0), b)
    assert int(steps) == 5 and bool(stopped) and aux["stop"] is None
    assert_bitwise((state, aux["loss"], steps), (ref[0], ref[1]["loss"], ref[2]))
    final = next(text for stage, text in step.loop(K, until=lambda state, aux: aux["stop"]).lower(state0, b).items()
                 if stage.endswith("final"))
    assert f"tensor<{K}xi1>" not in final


def test_stop_on_nonfinite_stops_after_the_first_bad_step():
    opt = optax.sgd(3.0)  # diverges: the loss reaches inf after a few steps
    fn, b, state0 = train_step(opt), batch(), init_state(opt)
    ref_state, ref_aux = single_steps(fn, fresh(state0), b, K)
    bad = [not all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(a)) for a in ref_aux]
    first = bad.index(True)
    assert 0 < first < K - 1

    loop = compile_step(fn).loop(K, stop_on_nonfinite=True)
    state, aux, steps, stopped = loop(fresh(state0), b)
    assert int(steps) == first + 1 and bool(stopped)
    ref_state, _ = single_steps(fn, fresh(state0), b, first + 1)
    assert_bitwise(state, ref_state)
    assert_history(aux["loss"], [a["loss"] for a in ref_aux[:first + 1]], first + 1)


def _toy(state, x):
    """w counts down from 4; aux `inv` = 1/w is inf after step 4 (w = 0), `w` stays finite."""
    w = state["w"] - 1.0
    return {"w": w}, {"w": w, "inv": 1.0 / w, "n": jnp.int32(1)}


def toy_state():
    return {"w": jnp.float32(4.0)}


def test_nonfinite_watches_only_kept_aux_leaves_and_combines_with_until():
    watched = compile_step(_toy).loop(K, stop_on_nonfinite=True)
    assert int(watched(toy_state(), 0)[2]) == 4
    unwatched = compile_step(_toy, keep_aux=("w", "n")).loop(K, stop_on_nonfinite=True)
    _, aux, steps, stopped = unwatched(toy_state(), 0)
    assert int(steps) == K and not stopped and aux["inv"] is None
    either = compile_step(_toy).loop(K, until=lambda s, a: s["w"] < 3, stop_on_nonfinite=True)
    assert int(either(toy_state(), 0)[2]) == 2
    with pytest.raises(ValueError, match=r"watches the floating aux leaves.*aux leaves: \['n'\]"):
        compile_step(_toy, keep_aux=("n",)).loop(K, stop_on_nonfinite=True)(toy_state(), 0)


@pytest.mark.parametrize("pred, returned", [
    (lambda s, a: a["loss"], r"float32\[\]"),
    (lambda s, a: jnp.isfinite(a["grads"]["scale"][0]).reshape(1), r"bool\[1\]"),
    (lambda s, a: None, "NoneType None"),
])
def test_a_bad_predicate_is_a_type_error_and_keeps_the_state(pred, returned):
    opt = optax.sgd(0.1)
    fn, b = train_step(opt), batch()
    state = fresh(init_state(opt))
    loop = compile_step(fn).loop(K, until=pred)
    with pytest.raises(TypeError, match=f"until must return a scalar bool, it returned {returned}"):
        loop(state, b)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    _, aux, steps, stopped = compile_step(fn).loop(K, until=lambda s, a: a["loss"] < 0)(state, b)
    assert int(steps) == K and not stopped and np.isfinite(np.asarray(aux["loss"])).all()


def test_options():
    step = compile_step(train_step(optax.sgd(0.1)))
    assert step.loop(3) is step.loop(3, until=None, stop_on_nonfinite=False)
    pred = lambda s, a: a["loss"] < 0
    assert step.loop(3, until=pred) is step.loop(3, until=pred) is not step.loop(3)
    with pytest.raises(TypeError, match="until must be a function"):
        step.loop(3, until=0.5)
    with pytest.raises(ValueError, match="use step.loop"):
        StepOptions(stop_on_nonfinite=True)


def test_stopped_loop_equals_the_unstopped_loop_truncated_in_the_interpreter():
    """wrap-loop alone, bit for bit in the StableHLO reference interpreter."""
    opt = optax.adam(1e-2)
    fn, state, b = train_step(opt), init_state(opt, mlp_params((3, 4, 1))), batch(n=4, d_in=3)
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, b))]
    n_state = len(jax.tree_util.tree_leaves(state))

    def looped(k, stop=None):
        t = trace(fn, state, b, {}, ("loss",), stop=stop)
        for spec in (DropUnusedOutputs(), WrapLoop(steps=k)):
            run_pass(t.module, spec)
        return interpret(t.module, args)

    losses = looped(4)[n_state]
    threshold = losses[1]
    stop = stopping.flag(lambda s, aux: aux["loss"] <= threshold, False)
    out = looped(4, stop)
    steps = int(out[n_state + 1])
    assert steps == 2 == int(np.argmax(losses <= threshold)) + 1 and bool(out[n_state + 2])
    unstopped = looped(steps)
    for a, e in zip(out[:n_state], unstopped[:n_state]):
        np.testing.assert_array_equal(a, e)
    np.testing.assert_array_equal(out[n_state][:steps], unstopped[n_state])
    assert np.isnan(out[n_state][steps:]).all()


SPMD_CHECK = """
import json, sys
import jax, numpy as np, optax
from loopfuse import compile_step
from problems import batch, fresh, init_state, train_step
opt = optax.adam(1e-2)
fn, b, out = train_step(opt), batch(), {"devices": jax.device_count()}
for sharding in ("data", "params"):
    single = compile_step(fn, keep_aux=("loss",), devices=jax.devices(), sharding=sharding)
    state, losses = fresh(init_state(opt)), []
    for _ in range(3):
        state, aux = single(state, b)
        losses.append(np.asarray(aux["loss"]).tolist())
    loop = single.loop(8, until=lambda s, a: s[1][0].count >= 3)
    s, aux, steps, _ = loop(fresh(init_state(opt)), b)
    same = all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(state)))
    out[sharding] = dict(steps=int(steps), same_state=same, history=np.asarray(aux["loss"]).tolist(), losses=losses)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_until_over_four_devices_equals_the_steps_run_one_by_one():
    """SPMD (data and params sharding) in a fresh interpreter with 4 CPU devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SPMD_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = json.loads(proc.stdout)
    assert facts["devices"] == 4
    for sharding in ("data", "params"):
        f = facts[sharding]
        assert f["steps"] == 3 and f["same_state"], (sharding, f)
        assert f["history"][:3] == f["losses"] and np.isnan(f["history"][3:]).all()
