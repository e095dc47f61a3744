"""4-device checks for test_copy_free.py, run in a fresh process (jax fixes its device count at import).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python tests/py/copy_free_check.py

Per sharding ("data", "params"): a K-step loop compiled with loopfuse's XLA defaults and with the
copy-free option turned off, run from the same state; and "split all-reduce": a data-parallel
step whose replicated state reaches `xla.SPLIT_ALL_REDUCE_BYTES`, compiled with the defaults
(one all-reduce per gradient) and with XLA's all-reduce combiner back on. Prints whether the
results are bitwise equal and the executables' temporary bytes as JSON.
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
        h = jnp.tanh(batch["x"] @ p["w"] + p["b"])
        return jnp.mean((jnp.tanh(h @ p["u"]) @ p["v"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPT.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}


def init():
    """(256, 1024) and (1024, 1024) weights (1 and 4 MiB, leading axes divisible by 4): "params"
    splits them over the mesh. The backward pass reads `u` (to carry the gradient down to `w`), so
    without region analysis each loop iteration copies the carried `u` before the update writes it."""
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w": jax.random.normal(k[0], (256, 1024)) * 0.02, "b": jnp.zeros(1024),
              "u": jax.random.normal(k[3], (1024, 1024)) * 0.03, "v": jax.random.normal(k[1], (1024,)) * 0.05}
    x = jax.random.normal(k[2], (16, 256))
    return {"params": params, "opt": OPT.init(params)}, {"x": x, "y": jnp.sin(x[:, 0])}


def deep_init():
    """Three 1024x1024 layers: 12 MiB of gradients, 36 MiB of replicated Adam state."""
    k = jax.random.split(jax.random.key(1), 4)
    params = {"w": [jax.random.normal(k[i], (1024, 1024)) * 0.03 for i in range(3)], "b": jnp.zeros(1024),
              "v": jnp.zeros(1024), "w0": jnp.zeros((256, 1024))}
    x = jax.random.normal(k[3], (16, 256))
    return {"params": params, "opt": OPT.init(params)}, {"x": x, "y": jnp.sin(x[:, 0])}


def deep_step(state, batch):
    def loss_fn(p):
        h = jnp.tanh(batch["x"] @ p["w0"] + p["b"])
        for w in p["w"]:
            h = jnp.tanh(h @ w)
        return jnp.mean((h @ p["v"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPT.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}


def compare(make, options: tuple, state, batch, calls: int = 2) -> dict:
    """Run `make(xla_options)` for each of `options` from the same state: are the results bitwise
    equal, and each executable's temporary bytes."""
    steps = [make(o) for o in options]
    temps = [s.memory_stats(state, batch).temp for s in steps]
    outs = []
    for s in steps:
        x = jax.tree_util.tree_map(jnp.copy, state)
        for _ in range(calls):
            x, aux = s(x, batch)
        outs.append(jax.tree_util.tree_map(np.asarray, (x, aux)))
    equal = [all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)))
             for x, y in zip(outs[0], outs[1])]
    return dict(num_devices=len(steps[0].placement.devices), state_equal=equal[0], aux_equal=equal[1],
                temp_on=temps[0], temp_off=temps[1])


def check(sharding: str) -> dict:
    state, batch = init()
    facts = compare(lambda o: loopfuse.compile_step(step, devices=jax.devices(), sharding=sharding, xla_options=o)
                    .loop(4), (None, OFF), state, batch)
    return dict(facts, u_bytes=state["params"]["u"].nbytes)


def check_split_all_reduce() -> dict:
    state, batch = deep_init()
    combined = {"xla_disable_hlo_passes": ""}  # XLA's all-reduce combiner back on
    facts = compare(lambda o: loopfuse.compile_step(deep_step, devices=jax.devices(), sharding="data", xla_options=o),
                    (None, combined), state, batch)
    grads = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state["params"]))
    replicated = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    return dict(facts, gradient_bytes=grads, replicated_bytes=replicated)


if __name__ == "__main__":
    print(json.dumps({"data": check("data"), "params": check("params"), "split all-reduce": check_split_all_reduce()}))
