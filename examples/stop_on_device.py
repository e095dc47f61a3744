"""What a `jax.jit` training loop does not give you, on a small MLP regression:

1. It stops on the device. ``step.loop(5000, until=...)`` ends inside the compiled loop after the
   first step whose loss is below the target: one call, and the loss history of the steps that
   ran. A jitted ``lax.scan`` runs all 5000 steps; a Python loop that checks the loss waits on the
   device after every step.
2. Its memory figures come from the compiled executable (``step.memory_stats``): the early stop
   and the history cost what jax.jit's donated scan needs, plus the step count and the stop flag.
3. It keeps compiled programs on disk (``cache_dir=``): a new process, here a new `Step`, loads the
   loop instead of compiling it again.

    python examples/stop_on_device.py
"""
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse
from loopfuse import MemoryStats

MAX_STEPS = 5000
TARGET = 1e-3
OPTIMIZER = optax.adam(3e-3)


def init(key, sizes=(1, 32, 32, 1)):
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (m, n)) / np.sqrt(m), jnp.zeros(n)) for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def predict(params, x):
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def train_step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((predict(p, batch["x"]) - batch["y"]) ** 2))(params)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": loss}


def converged(state, aux):
    return aux["loss"] < TARGET


def problem():
    x = jnp.linspace(-2.0, 2.0, 256)[:, None]
    params = init(jax.random.key(0))
    return (params, OPTIMIZER.init(params)), {"x": x, "y": jnp.sin(3 * x)}


def fresh(state):
    return jax.tree_util.tree_map(jnp.copy, state)   # loopfuse and donated jax.jit consume their input


def timed(f, *args):
    """`f`'s result and the seconds of its second call (the first one compiles and warms up)."""
    jax.block_until_ready(f(*fresh(args)))
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    return out, time.perf_counter() - t0


def host_checked(step, state, batch):
    """The Python loop that stops early with jax.jit: the host waits for every step's loss."""
    for steps in range(1, MAX_STEPS + 1):
        state, aux = step(state, batch)
        if aux["loss"] < TARGET:
            break
    return state, steps


def run(cache_dir) -> dict:
    state, batch = problem()
    make = lambda: loopfuse.compile_step(train_step, keep_aux=("loss",), cache_dir=cache_dir).loop(
        MAX_STEPS, until=converged)
    loop = make()
    t0 = time.perf_counter()
    loop.compiled(state, batch)
    compile_seconds = time.perf_counter() - t0
    (final, aux, steps, stopped), seconds = timed(loop, fresh(state), batch)

    scan = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: train_step(c, b), s, None, length=MAX_STEPS),
                   donate_argnums=0).lower(state, batch).compile()
    _, scan_seconds = timed(scan, fresh(state), batch)
    one = jax.jit(train_step, donate_argnums=0)
    (_, host_steps), host_seconds = timed(lambda s, b: host_checked(one, s, b), fresh(state), batch)

    t0 = time.perf_counter()
    make().compiled(state, batch)   # a new Step: what a new process with the same cache_dir does
    load_seconds = time.perf_counter() - t0
    return {"params": final[0], "losses": np.asarray(aux["loss"][:int(steps)]), "steps": int(steps),
            "stopped": bool(stopped), "seconds": seconds, "scan_seconds": scan_seconds, "host_steps": host_steps,
            "host_seconds": host_seconds, "memory": loop.memory_stats(state, batch),
            "scan_memory": MemoryStats.from_analysis(scan.memory_analysis()), "compile_seconds": compile_seconds,
            "load_seconds": load_seconds}


def main(cache_dir=None) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        found = run(cache_dir or scratch)
    ms = lambda s: f"{1e3 * s:.0f} ms"
    print(f"loopfuse loop(until):   stopped at step {found['steps']} (loss {found['losses'][-1]:.2e}) "
          f"in {ms(found['seconds'])}, one call")
    print(f"jax.jit lax.scan:       all {MAX_STEPS} steps in {ms(found['scan_seconds'])}")
    print(f"jax.jit + host check:   stopped at step {found['host_steps']} in {ms(found['host_seconds'])}")
    kib = lambda m: f"{m.peak / 1024:.0f} KiB (temporaries {m.temp / 1024:.0f} KiB)"
    print(f"peak memory: loopfuse {kib(found['memory'])}, jax.jit scan {kib(found['scan_memory'])}")
    print(f"compile: {found['compile_seconds']:.2f} s; a new Step with the same cache_dir loads it in "
          f"{found['load_seconds']:.2f} s")
    return found


if __name__ == "__main__":
    main()
