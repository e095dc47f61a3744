"""pack-state: loop(K) speed and compile time with and without the pass, against a hand-written
donated ``lax.scan`` of the same step (Adam over many small leaves, bench_compile.py's problem), and
the issue's hand-written ``ravel_pytree`` program (params and moments as flat vectors), and
loopfuse's loop on a state kept packed between calls (``loopfuse.pack``, packed once before the
rounds; its compile time includes the packing's).

    python bench/bench_pack.py [--leaves 300 1000] [--loop 10 [100]] [--rounds 5] [--calls 20] [--variants 1 4] [--hlo]
                               [--out bench/out]

One run per leaf count: compile each variant once (wall time of the whole compile: trace, passes
and XLA for loopfuse, lower and compile for the scan), check the final states against each other,
then interleaved rounds (order reversed every other round) of `--calls` calls each; medians of
steps/s. With two --loop values, every variant at both K in the same rounds, and each call's time
split into per call + K x per step. --hlo counts the kernels of each optimized program.
Writes pack.md and pack.json into --out; states the machine's load average.
"""
import argparse
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

import loopfuse
from bench_compile import adam_step, fresh, loss, problem


def variants(fn, k: int, ravel_fn) -> dict:
    """name -> (compile(state, batch) -> (call, seconds, the state it takes)); `ravel_fn` is the step on
    `ravel(state)`."""
    def jit_scan(step, prepare=lambda s: s):
        def build(state, batch):
            state = prepare(state)
            t0 = time.perf_counter()
            scan = lambda s, b: lax.scan(lambda c, _: step(c, b), s, None, length=k)  # noqa: E731
            call = jax.jit(scan, donate_argnums=0).lower(state, batch).compile()
            return call, time.perf_counter() - t0, state
        return build

    def with_loopfuse(passes, prepare=lambda s: s):
        def build(state, batch):
            t0 = time.perf_counter()
            state = prepare(state)
            loop = loopfuse.compile_step(fn, passes=passes).loop(k)
            loop.compiled(state, batch)
            return loop, time.perf_counter() - t0, state
        return build

    return {"lax.scan (jax.jit, donated)": jit_scan(fn),
            "hand-written ravel_pytree lax.scan (jax.jit, donated)": jit_scan(ravel_fn, ravel),
            "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(["pack-state"]),
            "loopfuse loop + pack-state{flatten=true}": with_loopfuse(["pack-state{flatten=true}"]),
            "loopfuse loop, state packed between calls (loopfuse.pack)": with_loopfuse(None, loopfuse.pack),
            "loopfuse loop, state packed between calls + pack-state{flatten=true}":
                with_loopfuse(["pack-state{flatten=true}"], loopfuse.pack)}


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


def bitwise(a, b) -> bool:
    """The same bits in every state element (in leaf order: `ravel` keeps it, a packed state is unpacked)."""
    a, b = (x.unpack() if isinstance(x, loopfuse.PackedState) else x for x in (a, b))
    return np.asarray(ravel_pytree(a)[0]).tobytes() == np.asarray(ravel_pytree(b)[0]).tobytes()


def kernels(hlo: str) -> tuple[int, int]:
    """(kernels in the while body, kernels outside it) of an optimized HLO module: the instructions
    that run code (fusions, copies, concatenates...), not parameters, tuples, bitcasts or constants."""
    comps = dict(re.findall(r"^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)^}", hlo, re.S | re.M))
    body = re.search(r"body=%?([\w.\-]+)", hlo).group(1)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
    count = lambda text: len(re.findall(  # noqa: E731
        r"= \S+ (?!parameter|get-tuple-element|tuple|bitcast|constant|while)[\w-]+\(", text))
    return count(comps[body]), count(comps[entry])


def run(leaves: int, ks: list[int], rounds: int, calls: int, only=None, hlo: bool = False) -> dict:
    """Each variant at each K, compiled in turn, then timed in interleaved rounds (all of them in
    each round); `calls` calls of loop(ks[0]) per round, as many steps in fewer calls of larger K."""
    fn, state, batch = problem(leaves)
    built = {}
    for k in ks:
        for n, (name, build) in enumerate(variants(fn, k, ravel_step(state[0])).items()):
            if only is None or n in only or n == 0:
                call, seconds, start = build(fresh(state), batch)
                final, _ = call(fresh(start), batch)
                built[(name, k)] = {"call": call, "compile_s": seconds, "ms": [], "state": start, "final": final,
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
        rows.setdefault(name, {})[k] = {"compile_s": b["compile_s"], "ms_per_call": ms, "steps_per_s": k / ms * 1e3,
                                        "bitwise_vs_scan": bitwise(b["final"], built[(keys[0][0], k)]["final"]),
                                        **({"kernels": b["kernels"]} if hlo else {})}
    return {"leaves": leaves, "rows": rows}


def _hlo(call, state, batch) -> str:
    """The optimized HLO of a compiled variant: jax's own, or loopfuse's recompiled with XLA's dump."""
    if hasattr(call, "as_text"):
        return call.as_text()
    with tempfile.TemporaryDirectory() as d:
        step = loopfuse.compile_step(call.fn, passes=call.options.passes, xla_options={"xla_dump_to": d})
        step.loop(call.options.steps).compiled(state, batch)
        return next(Path(d).glob("*after_optimizations.txt")).read_text()


def table(results: list, ks: list[int]) -> list[str]:
    lines = ["| leaves | variant | K | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |"
             + (" while-body kernels | kernels outside |" if "kernels" in _first(results) else ""),
             "|---|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if "kernels" in _first(results) else "")]
    for res in results:
        base = next(iter(res["rows"].values()))
        for name, by_k in res["rows"].items():
            for k, r in by_k.items():
                kern = f" {r['kernels'][0]} | {r['kernels'][1]} |" if "kernels" in r else ""
                lines.append(f"| {res['leaves']} | {name} | {k} | {r['compile_s']:.1f} | "
                             f"{r['compile_s'] / base[k]['compile_s']:.2f}x | {r['steps_per_s']:.0f} | "
                             f"{r['steps_per_s'] / base[k]['steps_per_s']:.2f}x | {r['bitwise_vs_scan']} |{kern}")
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--loop", type=int, nargs="+", default=[10], help="K of loop(K) and of the scan; with two, "
                    "also the split of a call's time into per call and per step")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="calls of loop(first K) per variant per round")
    ap.add_argument("--variants", type=int, nargs="+", help="the rows to run, by number from 0 (the scan, "
                    "row 0, always runs)")
    ap.add_argument("--hlo", action="store_true", help="count the kernels in each variant's optimized HLO")
    ap.add_argument("--out", default="bench/out")
    ns = ap.parse_args()
    load = os.getloadavg()[0]
    results = [run(n, ns.loop, ns.rounds, ns.calls, ns.variants, ns.hlo) for n in ns.leaves]
    lines = [f"Adam over N leaves (shapes 1..32 x 1..32), loop(K), {platform.machine()}, {os.cpu_count()} cores, "
             f"jax {jax.__version__}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}; medians of {ns.rounds} "
             f"interleaved rounds of {ns.calls} calls", "", *table(results, ns.loop)]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pack.md").write_text("\n".join(lines) + "\n")
    (out / "pack.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
