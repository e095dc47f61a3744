"""fit() steps/s on a shuffled vs an unshuffled Dataset (a linear softmax model, batch 128) (figure "data").

    python bench/bench_data.py [--rounds 3] [--sizes "60k x 784" "1M x 64"] [--json PATH]   # 60k: ~3 min
    taskset -c 0 python bench/bench_data.py ...   # XLA with one core (no intra-op threads)

Sizes: 60,000 x 784 (MNIST-sized, the default) and 1,000,000 x 64 (1M examples; 64 features keep
the host copy at 256 MB on a shared machine). Variants, timed round-robin: device and numpy arrays, each
unshuffled and shuffled; each shuffled variant is compared with the unshuffled one of its kind.
Each round is one `fit` of several epochs (chunk=100) on a fresh Dataset (a new key), so every
epoch's order and (for numpy) the one upload are inside the timing; compilation is done before
the rounds. Wall and process-CPU steps/s are both reported (CPU time is the robust one on a
shared machine), and the CPU cost of one epoch's order. Target: shuffled / unshuffled >= 0.8x
(ratio of medians, CPU; bench/harness.py).
"""
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse
from loopfuse.data import epoch_order

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

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
    ap = harness.parser(__doc__, rounds=3)
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["60k x 784"])
    ns = ap.parse_args()
    out = harness.Report("data", ns)
    rounds = 2 if ns.quick else ns.rounds
    out.section(f"batch {BATCH}, fit chunk {CHUNK}, {rounds} interleaved rounds; steps/s: median (min–max); ratios of "
                "medians (CPU: steps per second of this process's CPU time)\n")
    for size in ns.sizes:
        n, d, steps = SIZES[size]
        if ns.quick:
            n, steps = n // 10, 2 * CHUNK
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
        seed = iter(range(10**6))

        def run(make):
            ds, state = make(next(seed)), init(d)
            wall, cpu = harness.clocked(lambda: loopfuse.fit(step, state, ds, steps, chunk=CHUNK, progress=False).state)
            return steps / wall, steps / cpu
        got = harness.interleave({v: (lambda m=m: run(m)) for v, m in variants.items()}, rounds)
        wall, cpu = ({v: [t[i] for t in got[v]] for v in variants} for i in (0, 1))
        base = {v: v.split(",")[0] + ", unshuffled" for v in variants}
        rows = {v: dict(steps_per_s=harness.summary(wall[v]), steps_per_cpu_s=harness.summary(cpu[v]),
                        vs_unshuffled=harness.compare(wall[v], wall[base[v]], True),
                        cpu_vs_unshuffled=harness.compare(cpu[v], cpu[base[v]], True)) for v in variants}
        order_cpu_s = epoch_order_cpu_seconds(n)
        section = [f"#### {size} (batch {BATCH}: {n // BATCH:,} steps per epoch; {steps:,} steps per round)", "",
                   "| Dataset | steps/s (min–max) | vs unshuffled | steps per CPU s (min–max) | vs unshuffled (CPU) "
                   "| target (CPU) |", "|---|---:|---:|---:|---:|---|"]
        for v, r in rows.items():
            c = r["cpu_vs_unshuffled"]
            target = "" if v.endswith("unshuffled") else f"{'PASS' if c['ratio'] >= TARGET else 'MISS'} (>= {TARGET}x)"
            section.append(
                f"| {v} | {r['steps_per_s']['median']:,.0f} ({harness.spread_text(wall[v])}) | "
                f"{'—' if v == base[v] else harness.ratio_text(r['vs_unshuffled'])} | "
                f"{r['steps_per_cpu_s']['median']:,.0f} ({harness.spread_text(cpu[v])}) | "
                f"{'—' if v == base[v] else harness.ratio_text(c)} | {target} |")
        section += ["", f"One epoch's order (`loopfuse.data.epoch_order`, {n:,} examples): {order_cpu_s:.3f} CPU s, "
                    f"{order_cpu_s / (n // BATCH) * 1e6:.1f} CPU us per step of that epoch.", ""]
        out.section("\n".join(section), **{size: dict(variants=rows, epoch_order_cpu_s=order_cpu_s)})
    out.write()


if __name__ == "__main__":
    main()
