"""What the opt-in `simplify` pass gains and what it perturbs (figure "simplify").

    python bench/bench_simplify.py [--rounds 5] [--leaves 100] [--json PATH]    # ~3 min on 2 cores

Two Adam programs: the MLP of bench_loop ("medium") and the step over `--leaves` parameter leaves
of bench_compile. Each is compiled by loopfuse with the default pipeline and with
``passes=["simplify"]``, as `loop(10)`. Per pipeline: the ops in the final module, the compile time
(trace + passes + XLA, a fresh Step each round), the steps/s of the loop (interleaved rounds,
medians with min-max), the executable's temporary bytes, and after one call (10 steps) the largest
difference of the state from the default pipeline's (0 means bitwise equal).
"""
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_compile  # noqa: E402
import bench_loop  # noqa: E402
import harness  # noqa: E402

import loopfuse  # noqa: E402

K = 10
PIPELINES = {"default": None, "simplify": ["simplify"]}


def problems(leaves: int) -> dict:
    size = bench_loop.SIZES["medium"]
    mlp = (bench_loop.train_step, bench_loop.init_state(size["layers"]), bench_loop.make_batch(size["layers"], size["batch"]))
    return {"MLP (bench_loop medium)": mlp, f"Adam over {leaves} leaves": bench_compile.problem(leaves)}


def ops(text: str) -> int:
    return sum(1 for line in text.splitlines() if "= stablehlo." in line or "= \"stablehlo." in line)


def main() -> None:
    ap = harness.parser(__doc__, rounds=5)
    ap.add_argument("--leaves", type=int, default=100)
    ns = ap.parse_args()
    if ns.quick:
        ns.leaves, ns.rounds = 10, 2
    out = harness.Report("simplify", ns)
    lines = [f"`loop({K})` per call; compile = trace + passes + XLA (s, median (min–max)); steps/s median (min–max) over "
             f"{ns.rounds} interleaved rounds; difference = max |state - default's state| after one call", "",
             "| program | pipeline | ops | compile s | steps/s | simplify / default | temp | difference |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    rows = []
    for name, (fn, state, batch) in problems(ns.leaves).items():
        steps = {p: loopfuse.compile_step(fn, passes=passes).loop(K) for p, passes in PIPELINES.items()}
        final = {p: jax.device_get(s(jax.tree_util.tree_map(np.array, state), batch)[0]) for p, s in steps.items()}

        def compile_time(passes):
            def run():
                t0 = time.perf_counter()
                loopfuse.compile_step(fn, passes=passes).loop(K).compiled(state, batch)
                return time.perf_counter() - t0
            return run

        def speed(step):
            def run():
                s = jax.tree_util.tree_map(np.array, state)
                s, _ = step(s, batch)
                jax.block_until_ready(s)
                t0 = time.perf_counter()
                for _ in range(5):
                    s, _ = step(s, batch)
                jax.block_until_ready(s)
                return 5 * K / (time.perf_counter() - t0)
            return run

        compiles = harness.interleave({p: compile_time(passes) for p, passes in PIPELINES.items()}, max(2, ns.rounds // 2))
        speeds = harness.interleave({p: speed(s) for p, s in steps.items()}, ns.rounds)
        c = harness.compare(speeds["simplify"], speeds["default"], higher_is_better=True)
        for p, step in steps.items():
            diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
                       for a, b in zip(jax.tree_util.tree_leaves(final[p]), jax.tree_util.tree_leaves(final["default"])))
            ex = step.compiled(state, batch)
            lines.append(f"| {name} | {p} | {ops(step.lower(state, batch)['final'])} | "
                         f"{harness.summary(compiles[p])['median']:.2f} ({harness.spread_text(compiles[p], '{:.2f}')}) | "
                         f"{harness.summary(speeds[p])['median']:,.0f} ({harness.spread_text(speeds[p])}) | "
                         f"{harness.ratio_text(c) if p == 'simplify' else ''} | {harness.mib(ex.memory.temp)} MiB | "
                         f"{diff:.3g} |")
            rows.append(dict(program=name, pipeline=p, compile=harness.summary(compiles[p]),
                             steps_per_second=harness.summary(speeds[p]), temp=ex.memory.temp, difference=diff))
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
