"""Stopping inside the device loop: what `until` saves, and what it costs when it never fires (figure "until").

    python bench/bench_until.py [--rounds 9] [--json PATH]       # ~2 min on 2 cores

The problem is bench_loop's medium one (Adam-trained MLP 64-256-1, batch 128). Two figures:

* early stop: ``loop(1000, until=loss <= threshold)``, the threshold being the lowest loss of the
  first 180 steps of a reference run, against the full ``loop(1000)``; every call starts from the
  same fresh state, so every round runs the same steps. Target: time <= 1.05 x steps run / 1000.
* overhead: ``loop(100)`` with a predicate that never fires (loss < 0) and with
  ``stop_on_nonfinite=True`` against the plain ``loop(100)``, 10 calls per round, state carried.
  Target: <= 5% slower. The compiled executables' peak memory is listed too (deterministic).

Interleaved rounds, medians with min-max and ratios of medians (bench/harness.py), in wall time and
in this process's CPU time (less sensitive to other load).
"""
import sys
from pathlib import Path

import jax
import numpy as np

import loopfuse

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from bench_loop import SIZES, init_state, make_batch, train_step  # noqa: E402

LAYERS, BATCH = SIZES["medium"]["layers"], SIZES["medium"]["batch"]
LONG, STOP_AT = 1000, 180      # the early-stop figure: loop(LONG), converging at step STOP_AT
K, CALLS = 100, 10             # the overhead figure: loop(K), CALLS calls per round
OVERHEAD_TARGET = 1.05         # a stopping loop's time / the plain loop's (per step run)
CLOCKS = ("wall", "cpu")       # wall time, and this process's CPU time (less sensitive to other load)


def fresh_state():
    return jax.block_until_ready(init_state(LAYERS))


def timed_call(loop, state, batch, calls=1):
    """((wall seconds, process CPU seconds), final state, the rest of the last call's result)."""
    out = {}

    def run():
        x = state
        for _ in range(calls):
            x, *out["rest"] = loop(x, batch)
        out["state"] = x
        return x, out["rest"]
    seconds = harness.clocked(run)
    return seconds, out["state"], out["rest"]


def rounds(variants: dict, n: int, run) -> dict:
    """{clock: {name: [seconds per round]}} over interleaved rounds; `run(name, fn) -> (wall, cpu)`."""
    got = harness.interleave({name: (lambda name=name: run(name, variants[name])) for name in variants}, n)
    return {clock: {name: [t[i] for t in got[name]] for name in variants} for i, clock in enumerate(CLOCKS)}


def summaries(times: dict) -> dict:
    return {c: {k: harness.summary(v) for k, v in t.items()} for c, t in times.items()}


def early_stop(batch, n_rounds) -> dict:
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    full = step.loop(LONG)
    _, ref = full(fresh_state(), batch)
    losses = np.asarray(ref["loss"])
    threshold = float(losses[:STOP_AT].min())
    stopping = step.loop(LONG, until=lambda state, aux: aux["loss"] <= threshold)
    _, aux, steps, _ = stopping(fresh_state(), batch)  # compile, and the steps it runs
    steps = int(steps)
    np.testing.assert_array_equal(np.asarray(aux["loss"])[:steps], losses[:steps])

    def run(name, loop):
        return timed_call(loop, fresh_state(), batch)[0]

    times = rounds({"loop(1000)": full, "loop(1000, until=...)": stopping}, n_rounds, run)
    ratio = {c: 1 / harness.compare(t["loop(1000, until=...)"], t["loop(1000)"], False)["ratio"]
             for c, t in times.items()}
    return dict(steps_run=steps, threshold=threshold, seconds=summaries(times), ratio=ratio, ideal=steps / LONG,
                met={c: r <= OVERHEAD_TARGET * steps / LONG for c, r in ratio.items()})


def overhead(batch, n_rounds) -> dict:
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    variants = {"loop(100)": step.loop(K),
                "loop(100, until=never)": step.loop(K, until=lambda state, aux: aux["loss"] < 0),
                "loop(100, stop_on_nonfinite=True)": step.loop(K, stop_on_nonfinite=True)}
    states = {}
    for name, loop in variants.items():  # compile and warm up; each variant keeps training its own state
        _, states[name], rest = timed_call(loop, fresh_state(), batch)
        assert len(rest) == 1 or int(rest[1]) == K, f"{name} stopped early"

    def run(name, loop):
        seconds, states[name], _ = timed_call(loop, states[name], batch, CALLS)
        return seconds

    times = rounds(variants, n_rounds, run)
    state = fresh_state()
    return dict(peak_bytes={k: loop.memory_stats(state, batch).peak for k, loop in variants.items()},
                seconds=summaries(times),
                vs_plain={c: {k: harness.compare(v, t["loop(100)"], False) for k, v in t.items() if k != "loop(100)"}
                          for c, t in times.items()})


def ms(s: dict) -> str:
    return f"{s['median'] * 1e3:.1f} ms ({s['min'] * 1e3:.1f}–{s['max'] * 1e3:.1f})"


def report(early, over, n_rounds) -> str:
    s, r = early["seconds"], early["ratio"]
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    lines = [
        f"MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}, Adam; {n_rounds} interleaved rounds; times: median "
        "(min–max); wall = wall-clock time, cpu = this process's CPU time.\n",
        "#### Early stop\n",
        "| variant | steps run | wall | cpu |\n|---|---:|---:|---:|",
        f"| loop(1000) | 1000 | {ms(s['wall']['loop(1000)'])} | {ms(s['cpu']['loop(1000)'])} |",
        f"| loop(1000, until=loss <= lowest loss of steps 1..{STOP_AT}) | {early['steps_run']} "
        f"| {ms(s['wall']['loop(1000, until=...)'])} | {ms(s['cpu']['loop(1000, until=...)'])} |\n",
        f"Time ratio of medians: wall {r['wall']:.1%}, cpu {r['cpu']:.1%} (steps ratio {early['ideal']:.1%}; target <= "
        f"{OVERHEAD_TARGET * early['ideal']:.1%}, the steps ratio plus 5%): wall {verdict(early['met']['wall'])}, "
        f"cpu {verdict(early['met']['cpu'])}\n",
        f"#### Overhead of a predicate that never fires (loop({K}), {CALLS} calls per round)\n",
        "| variant | wall | speed vs plain loop, wall | speed vs plain loop, cpu | peak memory |\n"
        "|---|---:|---:|---:|---:|",
    ]
    for name in over["peak_bytes"]:
        o = [over["vs_plain"][c].get(name) for c in CLOCKS]
        lines.append(f"| {name} | {ms(over['seconds']['wall'][name])} | "
                     + " | ".join("—" if x is None else harness.ratio_text(x) for x in o)
                     + f" | {over['peak_bytes'][name]:,} B |")
    for c in CLOCKS:
        worst = min(over["vs_plain"][c].values(), key=lambda x: x["ratio"])
        cost = 1 / worst["ratio"] - 1
        result = verdict(cost <= OVERHEAD_TARGET - 1) if worst["measured"] else harness.ratio_text(worst)
        lines.append(f"\n{c}: worst overhead (ratio of medians) {cost:+.1%} (target <= +{OVERHEAD_TARGET - 1:.0%}): {result}")
    return "\n".join(lines) + "\n"


def main():
    args = harness.parser(__doc__, rounds=9).parse_args()
    out = harness.Report("until", args)
    n = 2 if args.quick else args.rounds
    batch = make_batch(LAYERS, BATCH)
    early, over = early_stop(batch, n), overhead(batch, n)
    out.section(report(early, over, n), early_stop=early, overhead=over)
    out.write()


if __name__ == "__main__":
    main()
