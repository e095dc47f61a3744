"""Host callbacks in a compile_step over 4 CPU devices, for test_effects.py (a fresh process:
jax fixes its device count at import).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python tests/py/effects_multidevice_check.py

Prints one JSON line: what the callbacks saw under loopfuse and under jax.jit with the same
shardings (sorted: devices call back concurrently), and whether the states agree bitwise; an
ordered io_callback (the one ordered effect jax shards) threads one token per device.
"""
import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import loopfuse  # noqa: E402


def make_step(log: list, ordered: bool = False):
    def step(state, batch):
        jax.debug.callback(lambda v: log.append(("debug", float(v))), state["w"].sum())
        y = jax.pure_callback(lambda v: np.asarray(v * 2, np.float32), jax.ShapeDtypeStruct((), jnp.float32),
                              batch.sum())
        io_callback(lambda v: log.append(("io", float(v))), None, y, ordered=ordered)
        return {"w": state["w"] * 0.5 + y}, {"y": y}
    return step


def state0():
    return {"w": jnp.arange(8, dtype=jnp.float32)}


def compare(calls: int, compiled_call, ordered: bool = False) -> dict:
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    batch = jnp.ones(8, jnp.float32)
    ref_log, log = [], []
    ref = jax.jit(make_step(ref_log, ordered), in_shardings=(NamedSharding(mesh, PartitionSpec()),
                                                    NamedSharding(mesh, PartitionSpec("data"))))
    ref_state = state0()
    for _ in range(calls):
        ref_state, _ = ref(ref_state, batch)
    state, _ = compiled_call(loopfuse.compile_step(make_step(log, ordered), devices=devices), state0(), batch)
    jax.effects_barrier()
    return {"log": sorted(log), "ref_log": sorted(ref_log),
            "same_state": bool(np.array_equal(np.asarray(state["w"]), np.asarray(ref_state["w"])))}


def two_steps(step, state, batch):
    state, _ = step(state, batch)
    return step(state, batch)


def main():
    facts = {"devices": jax.device_count(),
             "step": compare(2, two_steps),
             "loop": compare(3, lambda step, state, batch: step.loop(3)(state, batch)),
             "ordered_step": compare(2, two_steps, ordered=True),
             "ordered_loop": compare(3, lambda step, state, batch: step.loop(3)(state, batch), ordered=True)}
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
