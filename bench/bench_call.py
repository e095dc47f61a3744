"""Per-call time of a compiled step vs `jax.jit(f, donate_argnums=0)`, device, numpy and Python-scalar batches.

    python bench/bench_call.py [--leaves 1000] [--calls 200] [--rounds 15] [--out bench/out]
    python bench/bench_call.py --executables [--leaves 1000] ...   # which executable runs faster

Problems: a tiny Adam MLP step (bench_loop.py "tiny") and the Adam step over `--leaves`
parameter leaves of bench_compile.py. For each problem and batch kind (device arrays, numpy
arrays, device arrays with a Python float that scales them), jax.jit + donation and `loopfuse.compile_step` are timed round-robin: each round runs
`--calls` calls per variant (a twentieth of them at `--leaves`), chaining the returned state, the
order alternating round by round. Reported: median microseconds per call and the medians over
rounds of the per-round ratios jit time / loopfuse time (>= 1.0: loopfuse is at least as fast),
in wall time and in this process's CPU time (XLA's worker threads included; less sensitive to
other load on a shared machine), and what `Step.__call__` adds over the C++ dispatcher. Writes
call.md and call.json into --out. `--executables` times, instead, jax.jit's executable of the
`--leaves` step against loopfuse's (default, copy-free option off, no `simplify`), all through the
same C++ call path: call_executables.{md,json}.
"""
import argparse
import json
import os
import statistics
import sys
import time
import timeit
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
    """(new state, wall us per call, CPU us per call)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        state, aux = call(state, batch)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - t0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def interleaved(variants: dict, init, batch, calls: int, rounds: int) -> tuple[dict, dict]:
    """Per variant, the wall and the CPU us per call of each round (the order alternating)."""
    states = {v: per_call_us(call, init(), batch, 3)[0] for v, call in variants.items()}  # compile, warm up
    times: dict = {v: [] for v in variants}
    cpu: dict = {v: [] for v in variants}
    for r in range(rounds):
        for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            states[v], us, cpu_us = per_call_us(variants[v], states[v], batch, calls)
            times[v].append(us)
            cpu[v].append(cpu_us)
    return times, cpu


def ratio(times: dict, v: str) -> float:
    """Median over rounds of jit time / `v` time."""
    return statistics.median(j / x for j, x in zip(times["jit"], times[v]))


def frame_us() -> float:
    """What `Step.__call__` adds over calling its C++ dispatcher: both timed around a no-op."""
    step = loopfuse.compile_step(lambda s, b: (s + b, jnp.sum(s)))
    s, b = jnp.ones(3), jnp.ones(3)
    step(s, b)
    noop = lambda *a, **k: None  # noqa: E731
    step._dispatchers[()] = noop
    n = 200_000
    best = lambda f: min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6  # noqa: E731
    return best(lambda: step(s, b)) - best(lambda: noop(s, b, 0))


def executables(leaves: int, calls: int, rounds: int) -> list[str]:
    """Device-batch calls at `leaves` through four executables of one step: jax.jit's and three of
    loopfuse's (default, copy-free option off, no `simplify`). All take the same C++ call path."""
    fn, state, batch = bench_compile.problem(leaves)
    variants = {"jit": jax.jit(fn, donate_argnums=0), "loopfuse default": loopfuse.compile_step(fn),
                "loopfuse, copy-free off": loopfuse.compile_step(
                    fn, xla_options={"xla_cpu_copy_insertion_use_region_analysis": False}),
                "loopfuse, no simplify": loopfuse.compile_step(fn, passes=())}
    times, cpu = interleaved(variants, lambda: bench_compile.fresh(state), batch, calls, rounds)
    return ["", f"Executables at {leaves} leaves, device batch, {rounds} rounds of {calls} calls:", "",
            "| executable | us/call (wall) | vs jit, wall | vs jit, CPU |", "|---|---:|---:|---:|"] + [
        f"| {v} | {statistics.median(times[v]):,.1f} | {ratio(times, v):.2f}x | {ratio(cpu, v):.2f}x |" for v in variants]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--executables", action="store_true",
                    help="only time four executables of the --leaves step (jax.jit's and loopfuse's variants)")
    ap.add_argument("--out", default="bench/out", type=Path)
    ns = ap.parse_args()
    many_calls = max(5, ns.calls // 20)
    md = [f"jax {jax.__version__}, {ns.rounds} interleaved rounds of {ns.calls} calls ({many_calls} at {ns.leaves} "
          f"leaves), loadavg at start {os.getloadavg()[0]:.1f}"]
    rows = []
    if ns.executables:
        md += executables(ns.leaves, many_calls, ns.rounds)
    else:
        md += [f"Step.__call__ over its C++ dispatcher: {frame_us():.2f} us per call", "",
               "| problem | batch | jax.jit + donation us/call | loopfuse step us/call | loopfuse / jit speed, wall "
               "| loopfuse / jit speed, CPU |", "|---|---|---:|---:|---:|---:|"]
    for name, (fn, init, batch, options) in ({} if ns.executables else problems(ns.leaves)).items():
        plain = {"jit": jax.jit(fn, donate_argnums=0), "loopfuse": loopfuse.compile_step(fn, **options)}
        fw = weighted(fn)
        scaled = {"jit": jax.jit(fw, donate_argnums=0), "loopfuse": loopfuse.compile_step(fw, **options)}
        kinds = {"device": (plain, batch), "numpy": (plain, jax.tree_util.tree_map(np.asarray, batch)),
                 "device + Python float": (scaled, (batch, 1.0))}
        for kind, (variants, b) in kinds.items():
            times, cpu = interleaved(variants, init, b, ns.calls if name.startswith("tiny") else many_calls, ns.rounds)
            rows.append(dict(problem=name, batch=kind, jit_us=statistics.median(times["jit"]),
                             loopfuse_us=statistics.median(times["loopfuse"]), speed_vs_jit=ratio(times, "loopfuse"),
                             cpu_speed_vs_jit=ratio(cpu, "loopfuse"), rounds=times, cpu_rounds=cpu))
            md.append(f"| {name} | {kind} | {rows[-1]['jit_us']:,.1f} | {rows[-1]['loopfuse_us']:,.1f} | "
                      f"{rows[-1]['speed_vs_jit']:.2f}x | {rows[-1]['cpu_speed_vs_jit']:.2f}x |")
            print(md[-1], flush=True)
    name = "call_executables" if ns.executables else "call"
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / f"{name}.md").write_text("\n".join(md) + "\n")
    (ns.out / f"{name}.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
