"""Per-call time of a compiled step vs `jax.jit(f, donate_argnums=0)`, device, numpy and Python-scalar batches (figure "call").

    python bench/bench_call.py [--leaves 100] [--calls 200] [--rounds 9] [--json PATH]      # ~4 min on 2 cores
    python bench/bench_call.py --executables [--leaves 100] ...   # figure "call_executables", ~3 min

Problems: a tiny Adam MLP step (bench_loop.py "tiny") and the Adam step over `--leaves`
parameter leaves of bench_compile.py. For each problem and batch kind (device arrays, numpy
arrays, device arrays with a Python float that scales them), jax.jit + donation (as users write
it, and compiled with the XLA options loopfuse compiled its executable with) and
`loopfuse.compile_step` are timed in interleaved rounds (bench/harness.py): each round runs
`--calls` calls per variant (a twentieth of them at `--leaves`), chaining the returned state.
Reported: median microseconds per call (wall, and this process's CPU time, XLA's worker threads
included) with min-max, the ratio of medians, and what `Step.__call__` adds over the C++
dispatcher: on a no-op (first line, warm caches) and in the tables, where the step's C++
dispatcher alone (`Step._entry`, the same executable without `Step.__call__`'s frame) runs as a
variant of its own. `--executables` times, instead, jax.jit's executables of the `--leaves` step
(both ways) against loopfuse's (default, copy-free option off, no passes), all through the same
C++ call path (loopfuse's through their dispatchers alone).
"""
import sys
import time
import timeit
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import bench_compile  # noqa: E402
import bench_loop  # noqa: E402
import harness  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402

SAME = "jax.jit + donation, loopfuse's XLA options"
DISPATCHER = "loopfuse's C++ dispatcher alone"


def problems(leaves: int) -> dict:
    layers = bench_loop.SIZES["tiny"]["layers"]
    tiny = (bench_loop.train_step, lambda: bench_loop.init_state(layers),
            bench_loop.make_batch(layers, bench_loop.SIZES["tiny"]["batch"]), dict(keep_aux=("loss",)))
    fn, state, batch = bench_compile.problem(leaves)
    many = (fn, lambda: fresh(state), batch, {})
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


def variants_of(fn, init, batch, **options) -> dict:
    """jax.jit + donation both ways, loopfuse's step and its C++ dispatcher alone, each a ``call(state, batch)``."""
    step = loopfuse.compile_step(fn, **options)
    opts = harness.loopfuse_options(step, init(), batch)
    return {"jax.jit + donation": harness.jit(fn), SAME: harness.jit(fn, opts), "loopfuse": step,
            DISPATCHER: dispatcher(step, init(), batch)}


def dispatcher(step, state, batch):
    """`step`'s jaxlib C++ dispatcher (`Step._entry`, bound by a first call): its calls without `Step.__call__`'s frame."""
    step(state, batch)
    return step._entry


def interleaved(variants: dict, init, batch, calls: int, rounds: int) -> tuple[dict, dict]:
    """Per variant, the wall and the CPU us per call of each round (bench/harness.py rounds)."""
    states = {v: per_call_us(call, init(), batch, 3)[0] for v, call in variants.items()}  # compile, warm up

    def run(v):
        def once():
            states[v], us, cpu_us = per_call_us(variants[v], states[v], batch, calls)
            return us, cpu_us
        return once
    out = harness.interleave({v: run(v) for v in variants}, rounds)
    return {v: [w for w, _ in t] for v, t in out.items()}, {v: [c for _, c in t] for v, t in out.items()}


def cells(times: dict, cpu: dict, v: str) -> str:
    """'median (min–max) | vs jit wall | vs jit CPU' of variant `v`."""
    ref = "jax.jit + donation"
    return (f"{np.median(times[v]):,.1f} ({harness.spread_text(times[v], '{:,.1f}')}) | "
            + " | ".join("1.00x (reference)" if v == ref else harness.ratio_text(harness.compare(t[v], t[ref], False))
                         for t in (times, cpu)))


def frame_us() -> float:
    """What `Step.__call__` adds over calling its C++ dispatcher: both timed around a no-op."""
    step = loopfuse.compile_step(lambda s, b: (s + b, jnp.sum(s)))
    s, b = jnp.ones(3), jnp.ones(3)
    step(s, b)
    noop = lambda *a, **k: None  # noqa: E731
    step._entry = noop
    n = 200_000
    best = lambda f: min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6  # noqa: E731
    return best(lambda: step(s, b)) - best(lambda: noop(s, b))


def executables(leaves: int, calls: int, rounds: int) -> tuple[list, dict]:
    """Device-batch calls at `leaves` through jax.jit's executables (both ways) and three of
    loopfuse's (default, copy-free option off, no passes). All take the same C++ call path (loopfuse's
    dispatchers alone, without `Step.__call__`'s frame)."""
    fn, state, batch = bench_compile.problem(leaves)
    init = lambda: fresh(state)  # noqa: E731
    variants = variants_of(fn, init, batch)
    variants = {**{v: call for v, call in variants.items() if v != "loopfuse"},
                "loopfuse, copy-free off": dispatcher(loopfuse.compile_step(
                    fn, xla_options={"xla_cpu_copy_insertion_use_region_analysis": False}), init(), batch),
                "loopfuse, passes=()": dispatcher(loopfuse.compile_step(fn, passes=()), init(), batch)}
    times, cpu = interleaved(variants, init, batch, calls, rounds)
    return [f"Executables at {leaves} leaves, device batch, {rounds} rounds of {calls} calls; speed ratios of medians "
            "(> 1: faster than jax.jit + donation):", "",
            "| executable | us/call, wall (min–max) | vs jax.jit, wall | vs jax.jit, CPU |", "|---|---:|---:|---:|"] + [
        f"| {v} | {cells(times, cpu, v)} |" for v in variants], dict(rounds=times, cpu_rounds=cpu)


def main() -> None:
    ap = harness.parser(__doc__, rounds=9)
    ap.add_argument("--leaves", type=int, default=100)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--executables", action="store_true",
                    help="only time the executables of the --leaves step (jax.jit's and loopfuse's variants)")
    ns = ap.parse_args()
    if ns.quick:
        ns.leaves, ns.calls, ns.rounds = 10, 20, 2
    report = harness.Report("call_executables" if ns.executables else "call", ns)
    many_calls = max(5, ns.calls // 20)
    if ns.executables:
        md, results = executables(ns.leaves, many_calls, ns.rounds)
        report.section("\n".join(md) + "\n", executables=results)
        report.write()
        return
    md = [f"{ns.rounds} interleaved rounds of {ns.calls} calls ({many_calls} at {ns.leaves} leaves); speed ratios "
          "of medians (> 1: faster than jax.jit + donation); CPU = this process's CPU time.", "",
          f"Step.__call__ over its C++ dispatcher: {frame_us():.2f} us per call", "",
          "| problem | batch | variant | us/call, wall (min–max) | vs jax.jit, wall | vs jax.jit, CPU |",
          "|---|---|---|---:|---:|---:|"]
    rows = []
    for name, (fn, init, batch, options) in problems(ns.leaves).items():
        kinds = {"device": (fn, batch), "numpy": (fn, jax.tree_util.tree_map(np.asarray, batch)),
                 "device + Python float": (weighted(fn), (batch, 1.0))}
        for kind, (f, b) in kinds.items():
            variants = variants_of(f, init, b, **options)
            times, cpu = interleaved(variants, init, b, ns.calls if name.startswith("tiny") else many_calls, ns.rounds)
            rows.append(dict(problem=name, batch=kind, rounds=times, cpu_rounds=cpu))
            md += [f"| {name} | {kind} | {v} | {cells(times, cpu, v)} |" for v in variants]
            print("\n".join(md[-3:]), flush=True)
    report.section("\n".join(md) + "\n", rows=rows)
    report.write()


if __name__ == "__main__":
    main()
