"""The persistent compile cache: the first call of a second process against the first's (figure "cache").

    python bench/bench_cache.py [--leaves 100 300] [--rounds 1] [--json PATH]    # ~4 min on 2 cores

For each leaf count and round, two fresh processes run the same Adam step (bench_compile.problem)
with one empty cache folder: the first compiles and stores, the second loads. Each process times
its first call (trace, passes or cache load, XLA, one step) and reports its stages, then builds the Step again
and times its first call (its executable kept in the process's memory, `cache.RECENT`: the trace and one step);
with several rounds the table shows the medians of each process's figures.
"""
import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {300: 0.35, 1000: 0.10}


def child(leaves: int, cache_dir: str) -> None:
    """One process: the first call of the step, timed; prints JSON."""
    import jax

    import loopfuse
    from bench_compile import problem

    fn, state, batch = problem(leaves)
    step = loopfuse.compile_step(fn, cache_dir=cache_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    seconds = step.compiled(state, batch).seconds
    state, _ = step(state, batch)
    jax.block_until_ready(state)
    first_call_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()        # a Step built again in this process: its executable kept in memory
    again = loopfuse.compile_step(fn, cache_dir=cache_dir)
    jax.block_until_ready(again(state, batch)[0])
    print(json.dumps({"first_call_s": first_call_s, "cpu_s": cpu_s, "seconds": seconds,
                      "again_s": time.perf_counter() - t0}))


def run(leaves: int, cache_dir: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    proc = subprocess.run([sys.executable, __file__, "--child", str(leaves), cache_dir], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def median_run(runs: list[dict]) -> dict:
    """Each figure of a process's first call, the median over rounds."""
    return {"first_call_s": statistics.median(r["first_call_s"] for r in runs),
            "again_s": statistics.median(r["again_s"] for r in runs),
            "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "seconds": {k: statistics.median(r["seconds"].get(k, 0) for r in runs) for k in runs[0]["seconds"]}}


def main() -> None:
    import harness
    ap = harness.parser(__doc__, rounds=1)
    ap.add_argument("--leaves", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        return child(int(ns.child[0]), ns.child[1])
    if ns.quick:
        ns.leaves = [10]
    report = harness.Report("cache", ns)
    rows = {}
    for leaves in ns.leaves:
        runs = {"first": [], "second": []}
        for _ in range(ns.rounds):
            with tempfile.TemporaryDirectory(prefix="loopfuse-cache-bench-") as d:
                runs["first"].append(run(leaves, d))
                runs["second"].append(run(leaves, d))
                size = sum(p.stat().st_size for p in Path(d).iterdir())
        rows[leaves] = {"first": median_run(runs["first"]), "second": median_run(runs["second"]), "entry_bytes": size,
                        "rounds": runs}
        print(leaves, json.dumps(rows[leaves]["first"]), json.dumps(rows[leaves]["second"]), file=sys.stderr, flush=True)

    def stages(r):
        s = r["seconds"]
        passes = sum(v for k, v in s.items() if k not in ("trace", "xla", "cache"))
        return (f"{s['trace']:.2f} | {passes:.2f} | {s.get('xla', 0):.2f} | {s.get('cache', 0):.2f}")

    lines = ["Adam step over N parameter leaves (bench_compile.problem), first call of a fresh process, "
             f"two processes sharing one cache folder; {ns.rounds} round(s), medians", "",
             "| leaves | process | first call s | CPU s | trace s | passes s | XLA s | cache s | entry MiB | second / first | target "
             "| a Step built again in the process: first call s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for leaves, r in rows.items():
        ratio = r["second"]["first_call_s"] / r["first"]["first_call_s"]
        target = TARGETS.get(leaves)
        verdict = f"<= {target:.2f}: {'PASS' if ratio <= target else 'MISS'}" if target else "-"
        for name in ("first", "second"):
            p = r[name]
            tail = (f"{r['entry_bytes'] / 2**20:.1f} | {ratio:.3f} | {verdict}" if name == "second" else "- | - | -")
            lines.append(f"| {leaves} | {name} | {p['first_call_s']:.2f} | {p['cpu_s']:.2f} | {stages(p)} | {tail} "
                         f"| {p['again_s']:.3f} |")
    report.section("\n".join(lines) + "\n", leaves=rows)
    report.write()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
