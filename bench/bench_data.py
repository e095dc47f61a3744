"""fit() steps/s on a shuffled vs an unshuffled Dataset (a linear softmax model, batch 128).

    python bench/bench_data.py [--rounds 3] [--sizes "60k x 784" "1M x 64"] [--out bench/out]
    taskset -c 0 python bench/bench_data.py ...   # XLA with one core (no intra-op threads)

Sizes: 60,000 x 784 (MNIST-sized) and 1,000,000 x 64 (1M examples; 64 features keep the host
copy at 256 MB on a shared machine). Variants, timed round-robin: device and numpy arrays, each
unshuffled and shuffled; each shuffled variant is compared with the unshuffled one of its kind.
Each round is one `fit` of several epochs (chunk=100) on a fresh Dataset (a new key), so every
epoch's order and (for numpy) the one upload are inside the timing; compilation is done before
the rounds. Wall and process-CPU steps/s are both reported (CPU time is the robust one on a
shared machine), and the CPU cost of one epoch's order. Target: shuffled / unshuffled >= 0.8x
(median of per-round ratios, CPU). Writes data.md and data.json into --out.
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse
from loopfuse.data import epoch_order

SIZES = {"60k x 784": (60_000, 784, 4 * 468), "1M x 64": (1_000_000, 64, 2 * 7_812)}  # examples, features, steps/round (whole epochs)
BATCH, CLASSES, CHUNK, TARGET = 128, 10, 100, 0.8
OPT = optax.sgd(0.1)


def train_step(state, batch):
    def loss_fn(p):
        logits = batch["x"] @ p["w"] + p["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPT.update(grads, state["opt"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}


def init(features):
    params = {"w": jnp.zeros((features, CLASSES)), "b": jnp.zeros(CLASSES)}
    return {"params": params, "opt": OPT.init(params)}


def epoch_order_cpu_seconds(n: int, epochs: int = 3) -> float:
    """Median process-CPU seconds of computing one epoch's order of `n` examples (after a first one)."""
    key = jax.random.key(0)
    epoch_order(key, 0, n)
    times = []
    for e in range(1, epochs + 1):
        c0 = time.process_time()
        epoch_order(key, e, n)
        times.append(time.process_time() - c0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--out", default="bench/out", type=Path)
    ns = ap.parse_args()
    rows, orders, md = {}, {}, [f"jax {jax.__version__}, batch {BATCH}, fit chunk {CHUNK}, {ns.rounds} interleaved rounds, "
                    f"{len(os.sched_getaffinity(0))} CPU cores, loadavg at start {os.getloadavg()[0]:.1f}", ""]
    for size in ns.sizes:
        n, d, steps = SIZES[size]
        rng = np.random.default_rng(0)
        host = {"x": rng.normal(size=(n, d)).astype(np.float32), "y": rng.integers(0, CLASSES, n).astype(np.int32)}
        device = jax.device_put(host)
        step = loopfuse.compile_step(train_step, keep_aux=("loss",))
        variants = {"device arrays, unshuffled": lambda r: loopfuse.Dataset(device, BATCH),
                    "device arrays, shuffled": lambda r: loopfuse.Dataset(device, BATCH, key=jax.random.key(r)),
                    "numpy arrays, unshuffled": lambda r: loopfuse.Dataset(host, BATCH),
                    "numpy arrays, shuffled": lambda r: loopfuse.Dataset(host, BATCH, key=jax.random.key(r))}
        for make in variants.values():  # compile loop(CHUNK) for each Dataset form
            loopfuse.fit(step, init(d), make(-1), CHUNK, chunk=CHUNK, progress=False)
        rates, cpu_rates = {v: [] for v in variants}, {v: [] for v in variants}
        for r in range(ns.rounds):
            for v, make in variants.items():
                ds, state = make(r), init(d)
                t0, c0 = time.perf_counter(), time.process_time()
                loopfuse.fit(step, state, ds, steps, chunk=CHUNK, progress=False)
                rates[v].append(steps / (time.perf_counter() - t0))
                cpu_rates[v].append(steps / (time.process_time() - c0))
        base = {v: v.split(",")[0] + ", unshuffled" for v in variants}
        rows[size] = {v: dict(steps_per_s=statistics.median(x), rounds=x,
                              vs_unshuffled=statistics.median(a / b for a, b in zip(x, rates[base[v]])),
                              steps_per_cpu_s=statistics.median(cpu_rates[v]),
                              cpu_vs_unshuffled=statistics.median(
                                  a / b for a, b in zip(cpu_rates[v], cpu_rates[base[v]])))
                      for v, x in rates.items()}
        orders[size] = order_cpu_s = epoch_order_cpu_seconds(n)
        section = [f"### {size} (batch {BATCH}: {n // BATCH:,} steps per epoch; {steps:,} steps per round)", "",
                   "| Dataset | steps/s (median) | rounds min-max | vs unshuffled | steps per CPU s | vs unshuffled (CPU) | target (CPU) |",
                   "|---|---:|---:|---:|---:|---:|---|"]
        section += [f"| {v} | {r['steps_per_s']:,.0f} | {min(r['rounds']):,.0f}-{max(r['rounds']):,.0f} | "
                    f"{r['vs_unshuffled']:.2f}x | {r['steps_per_cpu_s']:,.0f} | {r['cpu_vs_unshuffled']:.2f}x | "
                    + ("" if v.endswith("unshuffled") else
                       f"{'PASS' if r['cpu_vs_unshuffled'] >= TARGET else 'MISS'} (>= {TARGET}x)")
                    + " |" for v, r in rows[size].items()]
        section += ["", f"One epoch's order (`loopfuse.data.epoch_order`, {n:,} examples): {order_cpu_s:.3f} CPU s, "
                    f"{order_cpu_s / (n // BATCH) * 1e6:.1f} CPU us per step of that epoch.", ""]
        print("\n".join(section), flush=True)
        md += section
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "data.md").write_text("\n".join(md) + "\n")
    (ns.out / "data.json").write_text(json.dumps(dict(variants=rows, epoch_order_cpu_s=orders), indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
