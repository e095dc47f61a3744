"""4-device checks for test_copy_free.py, run in a fresh process (jax fixes its device count at import).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python tests/py/copy_free_check.py

Per sharding ("data", "params"): a K-step loop compiled with loopfuse's XLA defaults and with the
copy-free option turned off, run from the same state; prints whether the results are bitwise
equal and both executables' temporary bytes as JSON.
"""
import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import loopfuse  # noqa: E402

OFF = {"xla_cpu_copy_insertion_use_region_analysis": False}
OPT = optax.adam(1e-3)


def step(state, batch):
    def loss_fn(p):
        return jnp.mean((jnp.tanh(batch["x"] @ p["w"] + p["b"]) @ p["v"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPT.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}


def init():
    """A (256, 1024) weight (1 MiB, leading axis divisible by 4): "params" splits it over the mesh."""
    k = jax.random.split(jax.random.key(0), 3)
    params = {"w": jax.random.normal(k[0], (256, 1024)) * 0.02, "b": jnp.zeros(1024),
              "v": jax.random.normal(k[1], (1024,)) * 0.05}
    x = jax.random.normal(k[2], (16, 256))
    return {"params": params, "opt": OPT.init(params)}, {"x": x, "y": jnp.sin(x[:, 0])}


def check(sharding: str) -> dict:
    devices = jax.devices()
    state, batch = init()
    loops = [loopfuse.compile_step(step, devices=devices, sharding=sharding, xla_options=o).loop(4)
             for o in (None, OFF)]
    temps = [loop.memory_stats(state, batch).temp for loop in loops]
    outs = []
    for loop in loops:
        s = jax.tree_util.tree_map(jnp.copy, state)
        for _ in range(2):
            s, aux = loop(s, batch)
        outs.append(jax.tree_util.tree_map(np.asarray, (s, aux)))
    equal = [all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)))
             for x, y in zip(outs[0], outs[1])]
    return dict(num_devices=len(loops[0].placement.devices),
                state_equal=equal[0], aux_equal=equal[1], temp_on=temps[0], temp_off=temps[1])


if __name__ == "__main__":
    print(json.dumps({s: check(s) for s in ("data", "params")}))
