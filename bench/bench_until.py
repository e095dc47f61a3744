"""Stopping inside the device loop: what `until` saves, and what it costs when it never fires.

    python bench/bench_until.py [--rounds 15] [--out bench/out]

The problem is bench_loop's medium one (Adam-trained MLP 64-256-1, batch 128). Two figures:

* early stop: ``loop(1000, until=loss <= threshold)``, the threshold being the lowest loss of the
  first 180 steps of a reference run, against the full ``loop(1000)``; every call starts from the
  same fresh state, so every round runs the same steps. Target: time <= 1.05 x steps run / 1000
  (~18%).
* overhead: ``loop(100)`` with a predicate that never fires (loss < 0) and with
  ``stop_on_nonfinite=True`` against the plain ``loop(100)``, 10 calls per round, state carried.
  Target: <= 5% slower. The compiled executables' peak memory is listed too (deterministic).

Variants are timed round-robin (one call each per round, the order alternating), and each ratio
is the median over rounds of the ratio measured in the same round. Writes until.md / until.json.
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np

import loopfuse
from bench_loop import SIZES, init_state, machine, make_batch, train_step

LAYERS, BATCH = SIZES["medium"]["layers"], SIZES["medium"]["batch"]
LONG, STOP_AT = 1000, 180      # the early-stop figure: loop(LONG), converging at step STOP_AT
K, CALLS = 100, 10             # the overhead figure: loop(K), CALLS calls per round
OVERHEAD_TARGET = 1.05         # a stopping loop's time / the plain loop's (per step run)
CLOCKS = ("wall", "cpu")       # wall time, and this process's CPU time (less sensitive to other load)


def fresh_state():
    return jax.block_until_ready(init_state(LAYERS))


def timed_call(loop, state, batch, calls=1):
    """((wall seconds, process CPU seconds), final state, the rest of the last call's result)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        state, *rest = loop(state, batch)
    jax.block_until_ready((state, rest))
    return (time.perf_counter() - t0, time.process_time() - c0), state, rest


def rounds(variants: dict, n: int, run) -> dict:
    """{clock: {name: [seconds per round]}}: `run(name, fn) -> (wall, cpu)` for every variant
    once per round, in alternating order."""
    times = {clock: {name: [] for name in variants} for clock in CLOCKS}
    names = list(variants)
    for r in range(n):
        for name in (names if r % 2 == 0 else names[::-1]):
            for clock, seconds in zip(CLOCKS, run(name, variants[name])):
                times[clock][name].append(seconds)
    return times


def paired(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def medians(times: dict) -> dict:
    return {clock: {k: statistics.median(v) for k, v in t.items()} for clock, t in times.items()}


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
        state = fresh_state()
        return timed_call(loop, state, batch)[0]

    times = rounds({"loop(1000)": full, "loop(1000, until=...)": stopping}, n_rounds, run)
    ratio = {c: paired(t["loop(1000, until=...)"], t["loop(1000)"]) for c, t in times.items()}
    return dict(steps_run=steps, threshold=threshold, seconds=medians(times), ratio=ratio, ideal=steps / LONG,
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
                steps_per_s={k: K * CALLS / s for k, s in medians(times)["wall"].items()},
                overhead={c: {k: paired(v, t["loop(100)"]) - 1 for k, v in t.items() if k != "loop(100)"}
                          for c, t in times.items()},
                target=OVERHEAD_TARGET - 1)


def report(info, early, over, n_rounds) -> str:
    s, r = early["seconds"], early["ratio"]
    verdict = lambda ok: "PASS" if ok else "MISS"
    lines = [
        "# bench_until results\n",
        ", ".join(f"{k}: {v}" for k, v in info.items()) + "\n",
        f"MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}, Adam; {n_rounds} interleaved rounds; times are medians, "
        "ratios medians of per-round ratios; wall = wall-clock time, cpu = this process's CPU time.\n",
        "## Early stop\n",
        "| variant | steps run | wall (median) | cpu (median) |\n|---|---:|---:|---:|",
        f"| loop(1000) | 1000 | {s['wall']['loop(1000)'] * 1e3:.1f} ms | {s['cpu']['loop(1000)'] * 1e3:.1f} ms |",
        f"| loop(1000, until=loss <= lowest loss of steps 1..{STOP_AT}) | {early['steps_run']} "
        f"| {s['wall']['loop(1000, until=...)'] * 1e3:.1f} ms | {s['cpu']['loop(1000, until=...)'] * 1e3:.1f} ms |\n",
        f"time ratio: wall {r['wall']:.1%}, cpu {r['cpu']:.1%} (steps ratio {early['ideal']:.1%}; target <= "
        f"{OVERHEAD_TARGET * early['ideal']:.1%}, the steps ratio plus 5%): wall {verdict(early['met']['wall'])}, "
        f"cpu {verdict(early['met']['cpu'])}\n",
        f"## Overhead of a predicate that never fires (loop({K}), {CALLS} calls per round)\n",
        "| variant | steps/s (wall, median) | wall vs plain loop | cpu vs plain loop | peak memory |\n"
        "|---|---:|---:|---:|---:|",
    ]
    for name, sps in over["steps_per_s"].items():
        o = [over["overhead"][c].get(name) for c in CLOCKS]
        lines.append(f"| {name} | {sps:,.0f} | " + " | ".join("—" if x is None else f"{x:+.1%}" for x in o)
                     + f" | {over['peak_bytes'][name]:,} B |")
    for c in CLOCKS:
        worst = max(over["overhead"][c].values())
        lines.append(f"\n{c}: worst overhead {worst:+.1%} (target <= +{OVERHEAD_TARGET - 1:.0%}): "
                     f"{verdict(worst <= OVERHEAD_TARGET - 1)}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="bench/out", type=Path)
    args = ap.parse_args()
    info, t0 = machine(), time.perf_counter()
    batch = make_batch(LAYERS, BATCH)
    early = early_stop(batch, args.rounds)
    over = overhead(batch, args.rounds)
    info.update(wall_s=round(time.perf_counter() - t0, 1), loadavg_1min_end=round(os.getloadavg()[0], 2),
                command=f"python bench/bench_until.py --rounds {args.rounds}")
    text = report(info, early, over, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "until.md").write_text(text)
    (args.out / "until.json").write_text(json.dumps(dict(machine=info, early_stop=early, overhead=over), indent=2))
    print(text + f"\nwrote {args.out}/until.md, until.json")


if __name__ == "__main__":
    main()
