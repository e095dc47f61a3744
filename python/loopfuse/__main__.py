"""python -m loopfuse [demo]: train a small MLP with Adam through loopfuse and print the figures."""
import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse


def _problem(seed=0, n=1024, d=16, hidden=64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = np.sin(x @ rng.normal(size=(d, 1)).astype(np.float32))
    params = {"w1": jnp.asarray(rng.normal(size=(d, hidden)).astype(np.float32) / np.sqrt(d)),
              "b1": jnp.zeros(hidden), "w2": jnp.asarray(rng.normal(size=(hidden, 1)).astype(np.float32) / 8),
              "b2": jnp.zeros(1)}
    return params, {"x": x, "y": y}


def _loss(p, b):
    return jnp.mean((jnp.tanh(b["x"] @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - b["y"]) ** 2)


def demo(steps: int, chunk: int, dump: str) -> None:
    opt = optax.adam(3e-3)

    def train_step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(_loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss, "grads": grads}

    params, data = _problem()
    dataset = loopfuse.Dataset(data, batch_size=128, key=jax.random.key(0))
    step = loopfuse.compile_step(train_step, keep_aux=("loss",), dump_ir=dump)
    state = (params, opt.init(params))
    print(f"loopfuse demo: 16-64-1 MLP, Adam, {len(data['x'])} examples in batches of 128, {steps} steps "
          f"in device loops of {chunk}")
    t0 = time.perf_counter()
    result = loopfuse.fit(step, state, dataset, steps, chunk=chunk, progress=False,
                          callback=lambda done, aux: print(f"  step {done:5d}  loss {aux['loss'][-1]:.5f}"))
    seconds = time.perf_counter() - t0
    losses = result.history["loss"]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {seconds:.2f}s (first chunk includes compiling)")

    batch = {k: v[:128] for k, v in data.items()}

    def loss_only_step(state, batch):        # what the compiled step returns: the state and the loss
        new_state, aux = train_step(state, batch)
        return new_state, {"loss": aux["loss"]}

    def jit_memory(fn, **jit_options):
        return loopfuse.MemoryStats.from_analysis(
            jax.jit(fn, **jit_options).lower(result.state, batch).compile().memory_analysis())

    rows = (("loopfuse.compile_step", "state donated; returns state, loss",
             step.memory_stats(result.state, batch)),
            ("jax.jit", "state donated; returns state, loss", jit_memory(loss_only_step, donate_argnums=0)),
            ("jax.jit (as written)", "no donation; returns state, loss, grads", jit_memory(train_step)))
    print(f"memory of one step (bytes) {'':48s} {'arguments':>11s} {'outputs':>9s} {'aliased':>9s} {'temp':>9s} "
          f"{'peak':>9s}")
    for name, what, m in rows:
        print(f"  {name:22s} {what:50s} {m.argument:11d} {m.output:9d} {m.alias:9d} {m.temp:9d} {m.peak:9d}")
    (_, _, ours), (_, _, same), (_, _, written) = rows
    print(f"  peak ratio loopfuse / jax.jit (same donation and outputs) = {ours.peak / same.peak:.3f}")
    print(f"  peak ratio loopfuse / jax.jit (as written)                = {ours.peak / written.peak:.3f}")
    print(f"IR after tracing and after every pass: {dump}/")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m loopfuse", description=__doc__)
    p.add_argument("command", nargs="?", default="demo", choices=["demo"])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--chunk", type=int, default=500)
    p.add_argument("--dump-ir", default=None, help="folder for the IR dumps (default: a temporary folder)")
    ns = p.parse_args(argv)
    demo(ns.steps, ns.chunk, ns.dump_ir or tempfile.mkdtemp(prefix="loopfuse-ir-"))


if __name__ == "__main__":
    main()
