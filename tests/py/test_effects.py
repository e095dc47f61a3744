"""Host callbacks and ordered effects inside compile_step run as under jax.jit: once per step, in order.

Each test runs the same function under jax.jit and under loopfuse (one step per call, and a
``loop(K)``) and compares what the callbacks saw and what was printed, and the results bitwise.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import loopfuse
from problems import assert_trees_equal

SCRIPT = Path(__file__).with_name("effects_multidevice_check.py")


def callback_step(log: list, ordered: bool = False):
    """A step calling every kind of host callback; `log` receives what they see."""
    def step(state, batch):
        w = state["w"]
        jax.debug.print("print w0={w}", w=w[0], ordered=ordered)
        jax.debug.callback(lambda v: log.append(("debug", float(v))), w.sum(), ordered=ordered)
        y = jax.pure_callback(lambda v: np.asarray(v * 2, np.float32), jax.ShapeDtypeStruct((), jnp.float32),
                              batch.sum())
        io_callback(lambda v: log.append(("io", float(v))), None, w[1], ordered=ordered)
        new_w = w * 0.5 + y
        return {"w": new_w}, {"y": y, "grad_norm": jnp.linalg.norm(new_w)}
    return step


def run_jit(make_step, calls: int, state, batch, capfd):
    log = []
    fn = jax.jit(make_step(log))
    for _ in range(calls):
        state, aux = fn(state, batch)
    jax.effects_barrier()
    return state, aux, log, capfd.readouterr().out


def state0():
    return {"w": jnp.arange(4, dtype=jnp.float32)}


BATCH = jnp.ones(3, jnp.float32)


def same_order(log: list, ordered: bool) -> list:
    """The log as far as jax orders it: unordered callbacks of one step may run in any order
    (each step's print depends on the previous step's state, so the prints stay in step order)."""
    return log if ordered else sorted(log)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_callbacks_run_once_per_step_in_order(capfd, ordered):
    make = lambda log: callback_step(log, ordered)  # noqa: E731
    ref_state, ref_aux, ref_log, ref_out = run_jit(make, 3, state0(), BATCH, capfd)
    assert len(ref_log) == 6 and ref_out.count("print w0=") == 3

    log = []
    step = loopfuse.compile_step(make(log))
    state = state0()
    for _ in range(3):
        state, aux = step(state, BATCH)
    jax.effects_barrier()
    assert (same_order(log, ordered), capfd.readouterr().out) == (same_order(ref_log, ordered), ref_out)
    assert_trees_equal((state, aux), (ref_state, ref_aux))


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_loop_runs_callbacks_k_times(capfd, ordered):
    make = lambda log: callback_step(log, ordered)  # noqa: E731
    ref_state, _, ref_log, ref_out = run_jit(make, 5, state0(), BATCH, capfd)

    log = []
    step = loopfuse.compile_step(make(log))
    state, _ = step(state0(), BATCH)          # one step, then a loop of 4: 5 in all
    state, aux = step.loop(4)(state, BATCH)
    jax.effects_barrier()
    assert (same_order(log, ordered), capfd.readouterr().out) == (same_order(ref_log, ordered), ref_out)
    assert_trees_equal(state, ref_state)
    assert aux["y"].shape == (4,)


def test_callback_feeding_only_a_dropped_aux_still_runs():
    seen = []

    def step(state, batch):
        g = state["w"] * batch
        jax.debug.callback(lambda v: seen.append(float(v)), g.sum())
        return {"w": state["w"] + 1}, {"g": g}

    compiled = loopfuse.compile_step(step, keep_aux=()).loop(3)
    state, aux = compiled({"w": jnp.ones(2)}, jnp.full(2, 2.0))
    jax.effects_barrier()
    assert aux == {"g": None}
    assert seen == [4.0, 8.0, 12.0]


def test_ordered_prints_interleave_with_jax_jit_calls(capfd):
    """loopfuse steps join jax's ordering of ordered effects, so the two interleave as called."""
    def step(state, batch):
        jax.debug.print("step {x}", x=state, ordered=True)
        return state + 1, {}

    def other(x):
        jax.debug.print("jit {x}", x=x, ordered=True)
        return x

    compiled, other = loopfuse.compile_step(step, donate=False), jax.jit(other)
    state = jnp.int32(0)
    for _ in range(2):
        state, _ = compiled(state, None)
        other(state)
    state, _ = compiled.loop(2)(state, None)
    other(state)
    jax.effects_barrier()
    assert capfd.readouterr().out.split("\n") == ["step 0", "jit 1", "step 1", "jit 2", "step 2", "step 3",
                                                  "jit 4", ""]


def test_callbacks_on_four_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{SCRIPT.name} failed:\n{proc.stderr[-6000:]}"
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["devices"] == 4
    for name in ("step", "loop", "ordered_step", "ordered_loop"):
        assert facts[name]["log"] == facts[name]["ref_log"] and facts[name]["log"], name
        assert facts[name]["same_state"], name
