"""Rolled layers (``compile_step(..., memory_budget=b)``) against jax.jit of the model as written and
of its hand-written stacked scan with ``jax.checkpoint`` (figure "layers", or "layers_<model>_<L>").

    python bench/bench_layers.py [--model gpt|nnx] [--layers 8] [--rounds 5] [--compile-rounds 3] [--quick]

Models: ``gpt`` is issue 31's GPT-style model (tests/py/transformer.py: a Python loop over a list of
block parameter dicts, width 256, 8 heads, 128 tokens, batch 16, vocab 512, AdamW); ``nnx`` is
bench_gpt.py's flax nnx model (blocks in an ``nnx.List``, width 256, 4 heads, 4 x 32 tokens, vocab 256).
Every variant runs one step per call, the state donated, the tokens an argument:

* jax.jit of the step as written (the reference: what loopfuse runs without a memory budget);
* jax.jit of the hand-written rewrite: blocks stacked, ``lax.scan`` over ``jax.checkpoint(block,
  policy=nothing_saveable)``;
* loopfuse with ``memory_budget`` 0.0 on the state as it is (stacked and unstacked inside each call),
  and 0.0, 0.5 and 1.0 on the state kept stacked between calls (``loopfuse.pack(state, layers=True)``).

Temporaries are XLA's (the compiled executables' memory stats). Compile time as bench_pack.py
measures it (harness.compile_rounds: a warm-up, then interleaved rounds each compiling every variant
from nothing; loopfuse's includes the trace, the passes, XLA and, for a packed state, the packing).
Steps/s: interleaved rounds of `--calls` calls each, medians. The loss after 3 steps is compared
with jax.jit's, relative.
"""
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import transformer  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402

STEPS = 3        # steps before the loss is compared


def model(name: str, layers: int, quick: bool):
    """(step, state, tokens, scan twin (step, state) or None) of model `name` with `layers` blocks."""
    if name == "gpt":
        size = {**(transformer.TINY if quick else transformer.ISSUE), "layers": layers}
        step, state, tokens = transformer.gpt(**size)
        scan_step, scan_state, _ = transformer.gpt_scan(**size)
        return step, state, tokens, (scan_step, scan_state)
    size = dict(dict(width=16, heads=2, seq=8, vocab=32, batch=2) if quick else
                dict(width=256, heads=4, seq=32, vocab=256, batch=4), layers=layers)
    step, state, tokens = transformer.nnx_gpt(**size)
    scan_step, scan_state, _ = transformer.nnx_gpt_scan(**size)
    return step, state, tokens, (scan_step, scan_state)


def builders(step, state, scan) -> dict:
    """name -> build() -> ((call, the state it takes), {part: seconds}): a compile from nothing."""
    def jit(fn, s):
        def build(tokens):
            call, parts = harness.jit_compile(fn, s, tokens)
            return (call, s), parts
        return build

    def rolled(budget, packed):
        def build(tokens):
            parts, s = {}, state
            if packed:
                t0 = time.perf_counter()
                s = loopfuse.pack(state, layers=True)
                parts["pack"] = time.perf_counter() - t0
            call = loopfuse.compile_step(harness.fresh_fn(step), keep_aux=("loss",), memory_budget=budget)
            parts.update(call.compiled(s, tokens).seconds)
            return (call, s), parts
        return build

    out = {"jax.jit, as written": jit(step, state)}
    if scan is not None:
        out["jax.jit, stacked scan + checkpoint(nothing_saveable)"] = jit(*scan)
    out.update({"loopfuse memory_budget=0.0, state as a pytree": rolled(0.0, False),
                "loopfuse memory_budget=0.0, state packed (layers=True)": rolled(0.0, True),
                "loopfuse memory_budget=0.5, state packed (layers=True)": rolled(0.5, True),
                "loopfuse memory_budget=1.0 (the step as traced)": rolled(1.0, False)})
    return out


def temporaries(call, state, tokens) -> int:
    if isinstance(call, loopfuse.Step):
        return call.memory_stats(state, tokens).temp
    return call.memory_analysis().temp_size_in_bytes


def loss_after(call, state, tokens, steps: int) -> float:
    s = fresh(state)
    for _ in range(steps):
        s, aux = call(s, tokens)
    return float(aux["loss"])


def main() -> None:
    ap = harness.parser(__doc__, rounds=5, compile_rounds=3)
    ap.add_argument("--model", choices=["gpt", "nnx"], default="gpt")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: gpt 8, nnx 12)")
    ap.add_argument("--calls", type=int, default=3, help="calls of one step per round")
    ns = ap.parse_args()
    ns.layers = ns.layers or (8 if ns.model == "gpt" else 12)
    if ns.quick:
        vars(ns).update(layers=3, rounds=2, compile_rounds=1, calls=2)
    name = "layers" if (ns.model, ns.layers) == ("gpt", 8) else f"layers_{ns.model}_{ns.layers}"
    out = harness.Report(name, ns)
    harness.no_compile_cache()
    step, state, tokens, scan = model(ns.model, ns.layers, ns.quick)
    warm = model(ns.model, 2, True)     # jax's, flax's and XLA's one-time costs, untimed
    for build in builders(*warm[:2], warm[3]).values():
        (call, s), _ = build(warm[2])
        jax.block_until_ready(call(fresh(s), warm[2]))
    harness.warm_trace(step, state, tokens)
    timed = harness.compile_rounds({n: (lambda b=b: b(tokens)) for n, b in builders(step, state, scan).items()},
                                   ns.compile_rounds)
    names, reference = list(timed), next(iter(timed))
    calls = {n: t["built"][0] for n, t in timed.items()}
    starts = {n: t["built"][1] for n, t in timed.items()}
    temps = {n: temporaries(calls[n], starts[n], tokens) for n in names}
    losses = {n: loss_after(calls[n], starts[n], tokens, STEPS) for n in names}
    rates, _ = harness.step_rates({n: calls[n] for n in names}, {n: fresh(starts[n]) for n in names}, tokens,
                                  ns.rounds, ns.calls)
    reports = {n: calls[n].compiled(starts[n], tokens).reports.get("roll-layers", "") for n in names
               if isinstance(calls[n], loopfuse.Step)}

    leaves = jax.tree_util.tree_leaves(state)
    state_mib = sum(x.size * x.dtype.itemsize for x in leaves) / 2**20
    lines = [f"{ns.model}, {ns.layers} blocks ({'tiny, --quick' if ns.quick else 'full size'}); state {state_mib:,.1f} MiB "
             f"(params and AdamW moments); one step per call, donated; temporaries from the compiled executables; "
             f"compile: median of {ns.compile_rounds} interleaved rounds after a warm-up, vs jax.jit the median "
             f"(min–max) of per-round ratios; steps/s: medians (min–max) of {ns.rounds} interleaved rounds of "
             f"{ns.calls} calls; loss after {STEPS} steps relative to jax.jit's", "",
             "| variant | temporaries MiB | vs jax.jit | compile s | vs jax.jit | steps/s | vs jax.jit | loss rel. diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = {}
    for n in names:
        stats = harness.compile_stats(timed[n], timed[reference])
        c = harness.compare(rates[n], rates[reference], higher_is_better=True)
        diff = abs(losses[n] - losses[reference]) / abs(losses[reference])
        rows[n] = dict(temp=temps[n], compile=stats, steps_per_s=harness.summary(rates[n]), loss=losses[n],
                       loss_rel_diff=diff, report=reports.get(n))
        lines.append(f"| {n} | {harness.mib(temps[n])} | {temps[n] / temps[reference]:.2f}x | "
                     f"{stats['seconds']['median']:.1f} | {harness.paired_text(stats['vs_reference'], n == reference)} | "
                     f"{np.median(rates[n]):.2f} ({harness.spread_text(rates[n], '{:.2f}')}) | "
                     f"{'—' if n == reference else harness.ratio_text(c)} | {diff:.1e} |")
    lines += ["", "Where the compile time goes: medians over the rounds, seconds (jax.jit: trace = `.lower()`, "
              "XLA = `.compile()`).", "", "| variant " + harness.PARTS_HEADER, "|---|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {n} " + harness.parts_cells(rows[n]["compile"]) for n in names]
    lines += ["", "What roll-layers reported:", ""]
    lines += [f"- {n}: {reports[n] or 'nothing (memory_budget 1.0 leaves the step as traced: the pass does not run)'}"
              for n in reports]
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
