"""pack-state: loop(K) speed and compile time with and without the pass, against a hand-written
donated ``lax.scan`` of the same step (Adam over many small leaves, bench_compile.py's problem).

    python bench/bench_pack.py [--leaves 300 1000] [--loop 10] [--rounds 5] [--calls 20] [--out bench/out]

One run per leaf count: compile each variant once (wall time of the whole compile: trace, passes
and XLA for loopfuse, lower and compile for the scan), check the final states against each other,
then interleaved rounds (order reversed every other round) of `--calls` calls each; medians of
steps/s. Writes pack.md and pack.json into --out; states the machine's load average.
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax

import loopfuse
from bench_compile import fresh, problem


def variants(fn, k: int) -> dict:
    """name -> (compile(state, batch) -> call, seconds)."""
    def scan(state, batch):
        return lax.scan(lambda c, _: fn(c, batch), state, None, length=k)

    def jit_scan(state, batch):
        t0 = time.perf_counter()
        call = jax.jit(scan, donate_argnums=0).lower(state, batch).compile()
        return call, time.perf_counter() - t0

    def with_loopfuse(passes):
        def build(state, batch):
            loop = loopfuse.compile_step(fn, passes=passes).loop(k)
            t0 = time.perf_counter()
            loop.compiled(state, batch)
            return loop, time.perf_counter() - t0
        return build

    return {"lax.scan (jax.jit, donated)": jit_scan, "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(["pack-state"]),
            "loopfuse loop + pack-state{flatten=true}": with_loopfuse(["pack-state{flatten=true}"])}


def bitwise(a, b) -> bool:
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def run(leaves: int, k: int, rounds: int, calls: int) -> dict:
    fn, state, batch = problem(leaves)
    built, finals = {}, {}
    for name, build in variants(fn, k).items():
        call, seconds = build(fresh(state), batch)
        s, _ = call(fresh(state), batch)
        built[name], finals[name] = {"call": call, "compile_s": seconds, "rates": []}, s
    names = list(built)
    states = {name: fresh(state) for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            call = built[name]["call"]
            t0 = time.perf_counter()
            for _ in range(calls):
                states[name], _ = call(states[name], batch)
            jax.block_until_ready(states[name])
            built[name]["rates"].append(calls * k / (time.perf_counter() - t0))
    ref = names[0]
    return {"leaves": leaves, "loop": k, "rows": {
        name: {"compile_s": b["compile_s"], "steps_per_s": float(np.median(b["rates"])),
               "bitwise_vs_scan": bitwise(finals[name], finals[ref])} for name, b in built.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--loop", type=int, default=10, help="K of loop(K) and of the scan")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    ap.add_argument("--out", default="bench/out")
    ns = ap.parse_args()
    load = os.getloadavg()[0]
    results = [run(n, ns.loop, ns.rounds, ns.calls) for n in ns.leaves]
    lines = [f"Adam over N leaves (shapes 1..32 x 1..32), loop({ns.loop}), {platform.machine()}, {os.cpu_count()} cores, "
             f"jax {jax.__version__}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}; medians of {ns.rounds} "
             f"interleaved rounds of {ns.calls} calls", "",
             "| leaves | variant | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |",
             "|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        base = next(iter(res["rows"].values()))
        for name, r in res["rows"].items():
            lines.append(f"| {res['leaves']} | {name} | {r['compile_s']:.1f} | {r['compile_s'] / base['compile_s']:.2f}x | "
                         f"{r['steps_per_s']:.0f} | {r['steps_per_s'] / base['steps_per_s']:.2f}x | {r['bitwise_vs_scan']} |")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pack.md").write_text("\n".join(lines) + "\n")
    (out / "pack.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
