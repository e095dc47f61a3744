"""Per-call time of a compiled step vs `jax.jit(f, donate_argnums=0)`, device, numpy and Python-scalar batches.

    python bench/bench_call.py [--leaves 1000] [--calls 200] [--rounds 7] [--out bench/out]

Problems: a tiny Adam MLP step (bench_loop.py "tiny") and the Adam step over `--leaves`
parameter leaves of bench_compile.py. For each problem and batch kind (device arrays, numpy
arrays, device arrays with a Python float that scales them), jax.jit + donation and `loopfuse.compile_step` are timed round-robin: each round runs
`--calls` calls per variant, chaining the returned state. Reported: median microseconds per call
and the median over rounds of the per-round ratio jit time / loopfuse time (>= 1.0: loopfuse is
at least as fast). Writes call.md and call.json into --out.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_compile  # noqa: E402
import bench_loop  # noqa: E402

import loopfuse  # noqa: E402


def problems(leaves: int) -> dict:
    layers = bench_loop.SIZES["tiny"]["layers"]
    tiny = (bench_loop.train_step, lambda: bench_loop.init_state(layers),
            bench_loop.make_batch(layers, bench_loop.SIZES["tiny"]["batch"]), dict(keep_aux=("loss",)))
    fn, state, batch = bench_compile.problem(leaves)
    many = (fn, lambda: bench_compile.fresh(state), batch, {})
    return {"tiny Adam MLP": tiny, f"{leaves} leaves Adam": many}


def weighted(fn):
    """`fn` taking ``(batch, weight)``: the batch scaled by a Python float (a weak-typed scalar leaf)."""
    def step(state, batch):
        data, weight = batch
        return fn(state, jax.tree_util.tree_map(lambda x: x * weight, data))
    return step


def per_call_us(call, state, batch, calls: int):
    t0 = time.perf_counter()
    for _ in range(calls):
        state, aux = call(state, batch)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="bench/out", type=Path)
    ns = ap.parse_args()
    md = [f"jax {jax.__version__}, {ns.rounds} interleaved rounds of {ns.calls} calls (fewer at 1,000 leaves), "
          f"loadavg at start {os.getloadavg()[0]:.1f}", "",
          "| problem | batch | jax.jit + donation us/call | loopfuse step us/call | loopfuse / jit speed (median of rounds) |",
          "|---|---|---:|---:|---:|"]
    rows = []
    for name, (fn, init, batch, options) in problems(ns.leaves).items():
        calls = ns.calls if name.startswith("tiny") else max(5, ns.calls // 20)
        plain = {"jit": jax.jit(fn, donate_argnums=0), "loopfuse": loopfuse.compile_step(fn, **options)}
        fw = weighted(fn)
        scaled = {"jit": jax.jit(fw, donate_argnums=0), "loopfuse": loopfuse.compile_step(fw, **options)}
        kinds = {"device": (plain, batch), "numpy": (plain, jax.tree_util.tree_map(np.asarray, batch)),
                 "device + Python float": (scaled, (batch, 1.0))}
        for kind, (variants, b) in kinds.items():
            states = {v: per_call_us(call, init(), b, 2)[0] for v, call in variants.items()}  # compile, warm up
            times = {v: [] for v in variants}
            for _ in range(ns.rounds):
                for v, call in variants.items():
                    states[v], us = per_call_us(call, states[v], b, calls)
                    times[v].append(us)
            ratio = statistics.median(j / l for j, l in zip(times["jit"], times["loopfuse"]))
            rows.append(dict(problem=name, batch=kind, jit_us=statistics.median(times["jit"]),
                             loopfuse_us=statistics.median(times["loopfuse"]), speed_vs_jit=ratio, rounds=times))
            md.append(f"| {name} | {kind} | {rows[-1]['jit_us']:,.1f} | {rows[-1]['loopfuse_us']:,.1f} | {ratio:.2f}x |")
            print(md[-1], flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "call.md").write_text("\n".join(md) + "\n")
    (ns.out / "call.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
