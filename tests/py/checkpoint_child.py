"""Child processes for test_checkpoint.py: a checkpointed fit to kill, and the 4-device checks.

    python checkpoint_child.py run DIR NUM_STEPS [PACE]   # prints "ready" before the fit starts, then
        # runs it, sleeping PACE seconds (default 0) after each chunk so that a kill soon after a
        # save lands before the run ends on any machine
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python checkpoint_child.py multidevice DIR
        # prints one JSON object of facts that the test asserts on
"""
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import loopfuse  # noqa: E402

OPT = optax.adam(1e-2)
CHUNK, EVERY = 3, 4


def problem():
    """A shuffled Dataset regression with adam; a typed PRNG key in the state is carried along."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1)) + 0.1).astype(np.float32)
    data = loopfuse.Dataset({"x": x, "y": y}, batch_size=16, key=jax.random.key(3))
    params = {"w": jnp.asarray(rng.normal(size=(8, 32)).astype(np.float32) / 3), "b": jnp.zeros(32),
              "v": jnp.asarray(rng.normal(size=(32, 1)).astype(np.float32) / 6)}

    def step(state, batch):
        params, opt_state, key = state
        def loss(p):
            h = jnp.tanh(batch["x"] @ p["w"] + p["b"])
            return jnp.mean((h @ p["v"] - batch["y"]) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        key, _ = jax.random.split(key)
        return (optax.apply_updates(params, updates), opt_state, key), {"loss": value}

    return step, (params, OPT.init(params), jax.random.key(7)), data


def fit(directory, num_steps, step=None, **kwargs):
    """The checkpointed fit of `problem` (one Step may serve several fits, compiling once)."""
    fn, state, data = problem()
    return loopfuse.fit(step or loopfuse.compile_step(fn), state, data, num_steps, chunk=CHUNK, progress=False,
                        checkpoint_dir=directory, checkpoint_every=EVERY, **kwargs)


def until_ten(state, aux):
    """Ends a run after its 10th step (adam's count in the new state): mid-chunk, between saves."""
    return state[1][0].count >= 10


def raw(tree) -> list:
    """The leaves as numpy arrays (typed keys as their key data), for bitwise comparisons."""
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def multidevice(directory) -> dict:
    from loopfuse.state.checkpoint import Checkpoints
    step = loopfuse.compile_step(problem()[0], devices=jax.devices(), sharding="params")
    first = fit(f"{directory}/a", 8, step)
    resumed = fit(f"{directory}/a", 16, step)
    whole = fit(f"{directory}/b", 16, step)
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("d",)),
                                            jax.sharding.PartitionSpec())
    template = jax.device_put(problem()[1], replicated)
    _, restored, _, _ = Checkpoints(f"{directory}/b", 3).restore(template, ["['loss']"])
    stopped = fit(f"{directory}/c", 16, step, until=until_ten)
    again = fit(f"{directory}/c", 16, step, until=until_ten)
    ten = fit(f"{directory}/d", 10, step)
    return {"device_count": jax.device_count(), "first_steps": first.steps, "resumed_from": resumed.resumed_from,
            "steps": resumed.steps,
            "bitwise": all(np.array_equal(a, b) for a, b in zip(raw(resumed.state), raw(whole.state))),
            "history_equal": bool(np.array_equal(resumed.history["loss"], whole.history["loss"])),
            "state_devices": sorted({len(x.sharding.device_set) for x in jax.tree_util.tree_leaves(whole.state)}),
            "restored_on_template": all(x.sharding == replicated for x in jax.tree_util.tree_leaves(restored)),
            "restored_equal": all(np.array_equal(a, b) for a, b in zip(raw(restored), raw(whole.state))),
            "until": [stopped.steps, stopped.retcode, again.resumed_from, again.steps, again.retcode],
            "until_bitwise": all(np.array_equal(a, b) for r in (stopped, again) for a, b in zip(raw(r.state), raw(ten.state)))}


if __name__ == "__main__":
    if sys.argv[1] == "run":
        print("ready", flush=True)
        pace = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
        fit(sys.argv[2], int(sys.argv[3]), callback=lambda done, aux: time.sleep(pace))
    else:
        print(json.dumps(multidevice(sys.argv[2])))
