"""A flax nnx GPT-style model with many small leaves: loop(K) with and without pack-state, and on a
state kept packed between calls (``loopfuse.pack``), against a hand-written donated ``lax.scan`` of
the same step (figure "gpt").

    python bench/bench_gpt.py [--layers 12] [--width 256] [--loop 5] [--rounds 5] [--compile-rounds 3] [--quick]

The model: token and position embeddings, `--layers` pre-LayerNorm blocks (nnx.MultiHeadAttention
with a causal mask, a 4x GELU MLP; every Linear with a bias), a final LayerNorm and a linear head;
next-token cross-entropy, AdamW. Its state is the nnx parameter `State` (split once) and the optax
state: per block 12 parameter leaves, 8 of them biases and LayerNorm scales/biases of <= 4 x width
elements, which pack-state (default threshold 4,096 elements) carries in one flat buffer with their
moments, while the weight matrices stay separate. The packed-between-calls rows pack the state once
(`loopfuse.pack`, timed as part of their compile) and loop on it, with the default passes and with
`pack-state{flatten=true}` (not bitwise: its row gives the largest relative difference), and with
every leaf packed (`max_leaf_elements=2**22`: the weight matrices and embeddings too), the row
that measures the threshold's point: large leaves stay separate so the step reads them in place.

Compile time as bench_pack.py measures it (bench/harness.py's `compile_rounds`): an untimed warm-up
builds and calls every variant on the --quick model and traces and lowers the step once at this
size, then `--compile-rounds` interleaved rounds each compile every variant from nothing (a fresh
function object, no persistent compile cache); medians of the wall time and of its parts, the ratio to the
scan as the median of per-round ratios. The last round's compile of each variant then runs: its
first call's state is compared with the scan's, then interleaved rounds (bench/harness.py) of one
call of K steps each, the state chained: medians and ratios of steps/s.
"""
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
from problems import fresh  # noqa: E402
from transformer import nnx_gpt as problem  # noqa: E402

PACKED = ["pack-state"]


def builders(step, k: int) -> dict:
    """name -> build(state, batch) -> ((call, the state it takes), {part: seconds}): a compile from
    nothing (a fresh function object each time)."""
    def jit_scan(state, tokens):
        scan = lambda s, t: lax.scan(lambda c, _: step(c, t), s, None, length=k)  # noqa: E731
        call, parts = harness.jit_compile(scan, state, tokens)
        return (call, state), parts

    def with_loopfuse(passes, pack=None):
        return lambda state, tokens: harness.loopfuse_compile(step, state, tokens, steps=k, passes=passes, pack=pack)

    return {"lax.scan (jax.jit, donated)": jit_scan, "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(PACKED),
            "loopfuse loop, state packed between calls (loopfuse.pack)": with_loopfuse(None, {}),
            "loopfuse loop, state packed between calls + pack-state{flatten=true}":
                with_loopfuse(["pack-state{flatten=true}"], {}),
            "loopfuse loop, every leaf packed between calls (max_leaf_elements=2**22)":
                with_loopfuse(None, {"max_leaf_elements": 2**22})}


QUICK = dict(layers=1, width=16, heads=2, seq=8, vocab=32, batch=2)


def main() -> None:
    ap = harness.parser(__doc__, rounds=5, compile_rounds=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--loop", type=int, default=5, help="K of loop(K) and of the scan")
    ns = ap.parse_args()
    if ns.quick:
        vars(ns).update(QUICK, loop=2, rounds=2, compile_rounds=2)
    out = harness.Report("gpt", ns)
    harness.no_compile_cache()
    size = {k: getattr(ns, k) for k in QUICK}
    step, state, tokens = problem(**size)
    leaves = jax.tree_util.tree_leaves(state)
    small = sum(1 for x in leaves if x.ndim and x.size <= 4096)

    warm_step, warm_state, warm_tokens = problem(**QUICK)   # jax's, flax's and XLA's one-time costs, untimed
    for build in builders(warm_step, ns.loop).values():
        (call, start), _ = build(warm_state, warm_tokens)
        jax.block_until_ready(call(fresh(start), warm_tokens))
    harness.warm_trace(step, state, tokens)
    builds = {name: (lambda build=build: build(state, tokens)) for name, build in builders(step, ns.loop).items()}
    timed = harness.compile_rounds(builds, ns.compile_rounds)
    names, reference = list(timed), next(iter(timed))
    calls = {name: t["built"][0] for name, t in timed.items()}
    states = {name: fresh(t["built"][1]) for name, t in timed.items()}
    finals = {name: calls[name](fresh(states[name]), tokens)[0] for name in names}

    def one_call(name):
        def run():
            t0 = time.perf_counter()
            states[name], _ = calls[name](states[name], tokens)
            jax.block_until_ready(states[name])
            return ns.loop / (time.perf_counter() - t0)
        return run
    rates = harness.interleave({name: one_call(name) for name in names}, ns.rounds)

    lines = [f"{ns.layers} layers, width {ns.width}, {ns.heads} heads, {ns.batch} x {ns.seq} tokens, vocab {ns.vocab}, "
             f"AdamW: {len(leaves)} state leaves, {small} of them tensors of <= 4,096 elements; loop({ns.loop}); "
             f"compile: median of {ns.compile_rounds} interleaved rounds after a warm-up, vs scan the median "
             f"(min–max) of per-round ratios (< 1: compiles faster); steps/s: medians (min–max) of {ns.rounds} "
             "interleaved rounds of one call", "",
             "| variant | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |",
             "|---|---:|---:|---:|---:|---|"]
    rows = {}
    for name in names:
        c = harness.compare(rates[name], rates[reference], higher_is_better=True)
        stats = harness.compile_stats(timed[name], timed[reference])
        rows[name] = dict(compile_s=stats["seconds"]["median"], compile=stats, steps_per_s=harness.summary(rates[name]),
                          **harness.state_match(finals[name], finals[reference]))
        lines.append(f"| {name} | {rows[name]['compile_s']:.1f} | "
                     f"{harness.paired_text(stats['vs_reference'], name == reference)} | "
                     f"{np.median(rates[name]):.1f} ({harness.spread_text(rates[name], '{:.1f}')}) | "
                     f"{'—' if name == reference else harness.ratio_text(c)} | {harness.match_text(rows[name])} |")
    lines += ["", "Where the compile time goes: medians over the rounds, seconds (jax.jit: trace = `.lower()`, "
              "XLA = `.compile()`; pack: `loopfuse.pack`; other: the rest of the wall time).", "",
              "| variant " + harness.PARTS_HEADER, "|---|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {name} " + harness.parts_cells(rows[name]["compile"]) for name in names]
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
