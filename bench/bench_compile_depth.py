"""Compile time of a rolled program against jax.jit's as the stack deepens (figure "compile_depth").

    python bench/bench_compile_depth.py [--depths 12 24 48] [--compile-rounds 3]

bench_roll_models' ``eqx`` model (an equinox residual MLP of blocks 256 -> 1024 -> 256, batch 1024, AdamW,
`layered.eqx_mlp`) at each depth: interleaved rounds (harness.compile_rounds, no compile cache) compiling
from nothing jax.jit's step (the state donated) and the program `fit` runs with ``memory_budget=0.0`` (its
``loop(2)`` on the layers stacked, `pack(state, layers=True)`), each timed by part (trace, passes, XLA);
and, from each optimized HLO module, its fusions and how many are distinct (`harness.distinct_fusions`:
XLA:CPU generates code once per distinct fusion, so an unrolled stack of alike layers costs it little more
than one layer's kernels, while its HLO passes grow with the layers).
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import layered  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402


def measure(layers: int, rounds: int, quick: bool) -> dict:
    size = dict(width=8, hidden=16, batch=4) if quick else dict(width=256, hidden=1024, batch=1024)
    step, state, batch = layered.eqx_mlp(layers=layers, **size)
    stacked = loopfuse.pack(fresh(state), layers=True)

    def jit_build():
        return harness.jit_compile(step, fresh(state), batch)

    def fit_build():
        loop = loopfuse.compile_step(harness.fresh_fn(step), keep_aux=("loss",), memory_budget=0.0).loop(2)
        return loop, loop.compiled(stacked, batch).seconds
    harness.warm_trace(step, state, batch)
    timed = harness.compile_rounds({"jax.jit": jit_build, "fit": fit_build}, rounds)
    loop = timed["fit"]["built"]
    report = loop.compiled(stacked, batch).reports["roll-layers"]
    stats = harness.compile_stats(timed["fit"], timed["jax.jit"])
    jit_parts = {k: statistics.median(p[k] for p in timed["jax.jit"]["parts"]) for k in ("trace", "xla")}
    rolled_hlo = loop.compiled(stacked, batch).executable.hlo_modules()[0].to_string()
    return dict(layers=layers, rolled=report.startswith("rolled"), jit=harness.summary(timed["jax.jit"]["total"]),
                jit_parts=jit_parts, fit=stats, jit_fusions=harness.distinct_fusions(timed["jax.jit"]["built"].as_text()),
                fit_fusions=harness.distinct_fusions(rolled_hlo))


def main() -> None:
    ap = harness.parser(__doc__, rounds=1, compile_rounds=3)
    ap.add_argument("--depths", type=int, nargs="+", default=[12, 24, 48])
    ns = ap.parse_args()
    if ns.quick:
        ns.depths, ns.compile_rounds = [3, 6], 1
    out = harness.Report("compile_depth", ns)
    harness.no_compile_cache()
    rows = ["| blocks | jax.jit s (trace, XLA) | fit's program s (trace, passes, XLA) | ratio | "
            "jax.jit fusions (distinct) | fit's program fusions (distinct) |", "|---|---|---|---|---|---|"]
    results = []
    for layers in ns.depths:
        r = measure(layers, ns.compile_rounds, ns.quick)
        results.append(r)
        parts = r["fit"]["parts"]
        passes = sum(v for k, v in parts.items() if k not in ("trace", "xla", "other", "cache"))
        rows.append(f"| {layers}{'' if r['rolled'] else ' (not rolled)'} | {r['jit']['median']:.2f} "
                    f"({r['jit_parts']['trace']:.2f}, {r['jit_parts']['xla']:.2f}) | "
                    f"{r['fit']['seconds']['median']:.2f} ({parts.get('trace', 0):.2f}, {passes:.2f}, "
                    f"{parts.get('xla', 0):.2f}) | {harness.paired_text(r['fit']['vs_reference'])} | "
                    f"{r['jit_fusions'][0]} ({r['jit_fusions'][1]}) | {r['fit_fusions'][0]} ({r['fit_fusions'][1]}) |")
    out.section("\n".join(rows), depths=results)
    out.write()


if __name__ == "__main__":
    main()
