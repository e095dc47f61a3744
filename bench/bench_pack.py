"""pack-state: loop(K) speed and compile time with and without the pass, against a hand-written
donated ``lax.scan`` of the same step (Adam over many small leaves, bench_compile.py's problem), and
the issue's hand-written ``ravel_pytree`` program (params and moments as flat vectors), and
loopfuse's loop on a state kept packed between calls (``loopfuse.pack``, packed once before the
rounds; its compile time includes the packing's, as the ravel_pytree program's includes its `ravel`).

    python bench/bench_pack.py [--leaves 300 1000] [--loop 10 [100]] [--rounds 5] [--calls 20] [--compile-rounds 3]
                               [--variants 1 4] [--hlo] [--out bench/out] [--json PATH] [--quick]

One run per leaf count. Compile time (bench/harness.py's `compile_rounds`): first an untimed warm-up
builds and calls every chosen variant at each K on the problem at 4 leaves (jax's first traces of
optax, its lowering rules, XLA's first compile and loopfuse's pass setup are paid there, by no timed
variant) and traces and lowers the step once at the measured size (jax's caches of the functions
it calls, per shape, warm for all alike); then `--compile-rounds` interleaved rounds (order reversed
every other round) each compile every variant from nothing: a fresh function object each time (jax
reuses no trace of it), no persistent compile cache ($LOOPFUSE_CACHE_DIR unset, loopfuse has no
other; jax's off). Per variant: the
median wall seconds, its ratio to the scan's as the median of the per-round ratios, and the median
of each part: loopfuse's `Executable.seconds` (trace, each pass, XLA), jax.jit's `.lower()` and
`.compile()`, the packing, and the rest of the wall time. The last round's compile of each variant
then runs: the final states are compared with the scan's (bitwise, else the largest relative
difference), and interleaved speed rounds of `--calls` calls each give medians of steps/s. With two
--loop values, every variant at both K in the same rounds, and each call's time split into per
call + K x per step. --hlo counts the kernels of each optimized program. Writes pack.md (and --json)
into --out with the environment line (load average at start and end).
"""
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
from bench_compile import adam_step, loss, problem  # noqa: E402
from problems import fresh  # noqa: E402


def variants(fn, k: int, ravel_fn) -> dict:
    """name -> build(state, batch) -> ((call, the state it takes), {part: seconds}): a compile from
    nothing (a fresh function object each time); `ravel_fn` is the step on `ravel(state)`."""
    def jit_scan(step, prepare=None):
        def build(state, batch):
            t0 = time.perf_counter()
            state = state if prepare is None else prepare(state)
            packing = time.perf_counter() - t0
            scan = lambda s, b: lax.scan(lambda c, _: step(c, b), s, None, length=k)  # noqa: E731
            call, parts = harness.jit_compile(scan, state, batch)
            return (call, state), parts if prepare is None else {"pack": packing, **parts}
        return build

    def with_loopfuse(passes, pack=None):
        return lambda state, batch: harness.loopfuse_compile(fn, state, batch, steps=k, passes=passes, pack=pack)

    return {"lax.scan (jax.jit, donated)": jit_scan(fn),
            "hand-written ravel_pytree lax.scan (jax.jit, donated)": jit_scan(ravel_fn, ravel),
            "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(["pack-state"]),
            "loopfuse loop + pack-state{flatten=true}": with_loopfuse(["pack-state{flatten=true}"]),
            "loopfuse loop, state packed between calls (loopfuse.pack)": with_loopfuse(None, {}),
            "loopfuse loop, state packed between calls + pack-state{flatten=true}":
                with_loopfuse(["pack-state{flatten=true}"], {})}


def ravel(state):
    """Adam's state with the params and each moment as one flat f32 vector (the issue's hand-written
    program): `ravel_pytree` of each."""
    params, (adam, *rest) = state
    return ravel_pytree(params)[0], (adam._replace(mu=ravel_pytree(adam.mu)[0], nu=ravel_pytree(adam.nu)[0]), *rest)


def ravel_step(params):
    """bench_compile's step on `ravel(state)`: the loss reads unravel(flat params), the gradient is
    taken with respect to the flat vector, optax updates the flat vectors."""
    unravel = ravel_pytree(params)[1]
    return adam_step(lambda flat, t: loss(unravel(flat), t))


def kernels(hlo: str) -> tuple[int, int]:
    """(kernels in the while body, kernels outside it) of an optimized HLO module: the instructions
    that run code (fusions, copies, concatenates...), not parameters, tuples, bitcasts or constants."""
    comps = dict(re.findall(r"^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)^}", hlo, re.S | re.M))
    body = re.search(r"body=%?([\w.\-]+)", hlo).group(1)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
    count = lambda text: len(re.findall(  # noqa: E731
        r"= \S+ (?!parameter|get-tuple-element|tuple|bitcast|constant|while)[\w-]+\(", text))
    return count(comps[body]), count(comps[entry])


WARM_LEAVES = 4


def warm_up(ks: list[int], only) -> None:
    """Pay jax's and XLA's one-time costs (first traces of optax, lowering rules, XLA's first compile,
    loopfuse's pass setup) before any timed compile: every chosen variant built and called once at
    each K on the problem at `WARM_LEAVES` leaves."""
    fn, state, batch = problem(WARM_LEAVES)
    for k in ks:
        for n, build in enumerate(variants(fn, k, ravel_step(state[0])).values()):
            if only is None or n in only or n == 0:
                (call, start), _ = build(state, batch)
                jax.block_until_ready(call(fresh(start), batch))


def run(leaves: int, ks: list[int], rounds: int, calls: int, only=None, hlo: bool = False,
        compile_rounds: int = 3) -> dict:
    """Each variant at each K: warm-up, `compile_rounds` interleaved rounds of compiling them all,
    then, with each one's last compile, interleaved speed rounds (all of them in each round);
    `calls` calls of loop(ks[0]) per round, as many steps in fewer calls of larger K."""
    harness.no_compile_cache()
    fn, state, batch = problem(leaves)
    ravel_fn = ravel_step(state[0])
    warm_up(ks, only)
    harness.warm_trace(fn, state, batch)
    harness.warm_trace(ravel_fn, ravel(state), batch)
    builds = {}
    for k in ks:
        for n, (name, build) in enumerate(variants(fn, k, ravel_fn).items()):
            if only is None or n in only or n == 0:
                builds[(name, k)] = lambda build=build: build(state, batch)   # compiling consumes no state
    timed = harness.compile_rounds(builds, compile_rounds)
    built = {}
    for (name, k), t in timed.items():
        call, start = t["built"]
        final, _ = call(fresh(start), batch)
        built[(name, k)] = {"call": call, "ms": [], "state": fresh(start), "final": final,
                            "compile": harness.compile_stats(t, timed[(next(iter(builds))[0], k)]),
                            "calls": max(1, calls * ks[0] // k)}
        if hlo:
            built[(name, k)]["kernels"] = kernels(_hlo(call, fresh(start), batch))
    keys = list(built)
    for r in range(rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            b = built[key]
            t0 = time.perf_counter()
            for _ in range(b["calls"]):
                b["state"], _ = b["call"](b["state"], batch)
            jax.block_until_ready(b["state"])
            b["ms"].append((time.perf_counter() - t0) / b["calls"] * 1e3)
    rows = {}
    for (name, k), b in built.items():
        ms = float(np.median(b["ms"]))
        rows.setdefault(name, {})[k] = {"compile_s": b["compile"]["seconds"]["median"], "compile": b["compile"],
                                        "ms_per_call": ms, "steps_per_s": k / ms * 1e3,
                                        **harness.state_match(b["final"], built[(keys[0][0], k)]["final"]),
                                        **({"kernels": b["kernels"]} if hlo else {})}
    return {"leaves": leaves, "compile_rounds": compile_rounds, "rows": rows}


def _hlo(call, state, batch) -> str:
    """The optimized HLO of a compiled variant: jax's own, or loopfuse's recompiled with XLA's dump."""
    if hasattr(call, "as_text"):
        return call.as_text()
    with tempfile.TemporaryDirectory() as d:
        step = loopfuse.compile_step(call.fn, passes=call.options.passes, xla_options={"xla_dump_to": d})
        step.loop(call.options.steps).compiled(state, batch)
        return next(Path(d).glob("*after_optimizations.txt")).read_text()


def table(results: list, ks: list[int]) -> list[str]:
    rounds = results[0].get("compile_rounds", 1)
    lines = [f"Compile: seconds, median of {rounds} interleaved round(s) of compiling every variant after a warm-up; "
             "vs scan: median (min–max) of the per-round ratios (< 1: compiles faster). Steps/s: median of the speed "
             "rounds, ratio of medians.", "",
             "| leaves | variant | K | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |"
             + (" while-body kernels | kernels outside |" if "kernels" in _first(results) else ""),
             "|---|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if "kernels" in _first(results) else "")]
    for res in results:
        base_name, base = next(iter(res["rows"].items()))
        for name, by_k in res["rows"].items():
            for k, r in by_k.items():
                kern = f" {r['kernels'][0]} | {r['kernels'][1]} |" if "kernels" in r else ""
                lines.append(f"| {res['leaves']} | {name} | {k} | {r['compile_s']:.1f} | "
                             f"{harness.paired_text(r['compile']['vs_reference'], name == base_name)} | "
                             f"{r['steps_per_s']:.0f} | "
                             f"{r['steps_per_s'] / base[k]['steps_per_s']:.2f}x | {harness.match_text(r)} |{kern}")
    lines += ["", "Where the compile time goes: medians over the rounds, seconds (jax.jit: trace = `.lower()`, "
              "XLA = `.compile()`; pack: `loopfuse.pack`, or `ravel` for the hand-written program; other: the rest "
              "of the wall time).", "", "| leaves | variant | K " + harness.PARTS_HEADER,
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for res in results:
        for name, by_k in res["rows"].items():
            for k, r in by_k.items():
                lines.append(f"| {res['leaves']} | {name} | {k} " + harness.parts_cells(r["compile"]))
    if len(ks) == 2:  # ms per call = per call + K * per step, fitted on the two K
        lo, hi = ks
        lines += ["", f"Split of the median time per call (ms) into per call + K x per step, from K = {lo} "
                  f"and {hi}:", "", "| leaves | variant | per step, us | per call, ms |", "|---|---|---:|---:|"]
        for res in results:
            for name, by_k in res["rows"].items():
                step = (by_k[hi]["ms_per_call"] - by_k[lo]["ms_per_call"]) / (hi - lo)
                per_call = by_k[lo]["ms_per_call"] - lo * step
                lines.append(f"| {res['leaves']} | {name} | {step * 1e3:.0f} | {per_call:.2f} |")
    return lines


def _first(results):
    return next(iter(next(iter(results[0]["rows"].values())).values()))


def main() -> None:
    ap = harness.parser(__doc__, rounds=5, compile_rounds=3)
    ap.add_argument("--leaves", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--loop", type=int, nargs="+", default=[10], help="K of loop(K) and of the scan; with two, "
                    "also the split of a call's time into per call and per step")
    ap.add_argument("--calls", type=int, default=20, help="calls of loop(first K) per variant per round")
    ap.add_argument("--variants", type=int, nargs="+", help="the rows to run, by number from 0 (the scan, "
                    "row 0, always runs)")
    ap.add_argument("--hlo", action="store_true", help="count the kernels in each variant's optimized HLO")
    ns = ap.parse_args()
    if ns.quick:
        ns.leaves, ns.loop, ns.rounds, ns.calls, ns.compile_rounds = [12], [5], 2, 2, 2
    out = harness.Report("pack", ns)
    results = [run(n, ns.loop, ns.rounds, ns.calls, ns.variants, ns.hlo, ns.compile_rounds) for n in ns.leaves]
    out.section("\n".join([f"Adam over N leaves (shapes 1..32 x 1..32), loop(K); steps/s: medians of {ns.rounds} "
                           f"interleaved rounds of {ns.calls} calls", "", *table(results, ns.loop)]) + "\n",
                pack=results)
    out.write()


if __name__ == "__main__":
    main()
