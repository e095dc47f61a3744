"""minimize with until=: what a converged solve saves, and what the host-side stop check costs.

    python bench/bench_minimize_until.py [--rounds 7] [--out bench/out]

The problem is bench_loop's medium one (Adam-trained MLP 64-256-1, batch 128). Two figures:

* early stop: ``minimize(steps=1000, backend=CompiledLoop(steps=100), until=loss <= threshold)``,
  the threshold being the lowest loss of the first 180 steps of a reference solve, against the
  same solve without `until`. Time = the solve loop (steps run / Solution.steps_per_second; every
  solve compiles first, outside it). Target: time <= 1.05 x steps run / 1000 (~18%). A control,
  ``minimize(steps=<steps run>)`` without `until`, separates the stop's cost from the per-solve one.
* host check: CompiledStep (one call per step) with the default ``stop_on_nonfinite=True``, which
  reads each step's loss on the host before the next step, against ``stop_on_nonfinite=False``
  (calls pipelined); the steps/s of both, no target.

Variants are timed round-robin (one solve each per round, the order alternating); each ratio is
the median over rounds of the ratio measured in the same round. Writes minimize_until.md / .json.
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import loopfuse
from bench_loop import OPT, SIZES, init_params, loss_fn, machine, make_batch

LAYERS, BATCH = SIZES["medium"]["layers"], SIZES["medium"]["batch"]
LONG, STOP_AT, K = 1000, 180, 100    # minimize(steps=LONG) converging at step STOP_AT, loops of K steps
HOST_STEPS = 200                     # the host-check figure: CompiledStep solves of HOST_STEPS steps
TARGET = 1.05                        # a stopped solve's time / the full one's, per step run


def solve(batch, steps, backend, **kwargs) -> loopfuse.Solution:
    return loopfuse.minimize(loss_fn, init_params(LAYERS), batch, optimizer=OPT, steps=steps, backend=backend,
                             **kwargs)


def seconds(sol: loopfuse.Solution) -> float:
    return sol.steps / sol.steps_per_second


def rounds(variants: dict, n: int) -> dict:
    """{name: [Solution per round]}: every variant once per round, in alternating order."""
    out, names = {name: [] for name in variants}, list(variants)
    for r in range(n):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(variants[name]())
    return out


def paired(a, b) -> float:
    return statistics.median(seconds(x) / seconds(y) for x, y in zip(a, b))


def early_stop(batch, n_rounds) -> dict:
    loop = loopfuse.CompiledLoop(steps=K)
    reference = solve(batch, LONG, loop)
    threshold = float(reference.loss_history[:STOP_AT].min())
    until = lambda params, loss: loss <= threshold
    n = int(np.argmax(reference.loss_history <= threshold)) + 1
    variants = {"full": lambda: solve(batch, LONG, loop), "until": lambda: solve(batch, LONG, loop, until=until),
                "control": lambda: solve(batch, n, loop)}
    sols = rounds(variants, n_rounds)
    stopped = sols["until"][0]
    assert stopped.steps == n and stopped.retcode == "converged"
    np.testing.assert_array_equal(stopped.loss_history, reference.loss_history[:n])
    ratio, ideal = paired(sols["until"], sols["full"]), n / LONG
    return dict(steps_run=n, retcode=stopped.retcode, threshold=threshold, ratio=ratio, ideal=ideal,
                met=ratio <= TARGET * ideal, control_ratio=paired(sols["control"], sols["full"]),
                seconds={k: statistics.median(map(seconds, v)) for k, v in sols.items()})


def host_check(batch, n_rounds) -> dict:
    step = loopfuse.CompiledStep()
    variants = {"stop_on_nonfinite=True": lambda: solve(batch, HOST_STEPS, step),
                "stop_on_nonfinite=False": lambda: solve(batch, HOST_STEPS, step, stop_on_nonfinite=False)}
    sols = rounds(variants, n_rounds)
    return dict(steps_per_s={k: statistics.median(s.steps_per_second for s in v) for k, v in sols.items()},
                ratio=paired(sols["stop_on_nonfinite=True"], sols["stop_on_nonfinite=False"]))


def report(info, early, host, n_rounds) -> str:
    s = early["seconds"]
    lines = [
        "# bench_minimize_until results\n",
        ", ".join(f"{k}: {v}" for k, v in info.items()) + "\n",
        f"MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}, Adam; {n_rounds} interleaved rounds; times are medians "
        "of the solve loop (compile excluded), ratios medians of per-round ratios.\n",
        "## Early stop\n",
        "| solve | steps run | retcode | solve loop (median) |\n|---|---:|---|---:|",
        f"| minimize(steps={LONG}, CompiledLoop(steps={K})) | {LONG} | max_steps | {s['full'] * 1e3:.1f} ms |",
        f"| ... until=loss <= lowest loss of steps 1..{STOP_AT} | {early['steps_run']} | {early['retcode']} "
        f"| {s['until'] * 1e3:.1f} ms |",
        f"| control: minimize(steps={early['steps_run']}) | {early['steps_run']} | max_steps "
        f"| {s['control'] * 1e3:.1f} ms |\n",
        f"time ratio {early['ratio']:.1%} (steps ratio {early['ideal']:.1%}; target <= {TARGET * early['ideal']:.1%}): "
        f"{'PASS' if early['met'] else 'MISS'}; the control's ratio: {early['control_ratio']:.1%}\n",
        f"## CompiledStep: the per-step host check ({HOST_STEPS} steps)\n",
        "| variant | steps/s (median) |\n|---|---:|",
        *[f"| {k} | {v:,.0f} |" for k, v in host["steps_per_s"].items()],
        f"\ntime ratio (True / False): {host['ratio']:.2f}",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="bench/out", type=Path)
    args = ap.parse_args()
    info, t0 = machine(), time.perf_counter()
    batch = make_batch(LAYERS, BATCH)
    early = early_stop(batch, args.rounds)
    host = host_check(batch, args.rounds)
    info.update(wall_s=round(time.perf_counter() - t0, 1), loadavg_1min_end=round(os.getloadavg()[0], 2),
                command=f"python bench/bench_minimize_until.py --rounds {args.rounds}")
    text = report(info, early, host, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "minimize_until.md").write_text(text)
    (args.out / "minimize_until.json").write_text(json.dumps(dict(machine=info, early_stop=early, host_check=host),
                                                             indent=2))
    print(text + f"\nwrote {args.out}/minimize_until.md, minimize_until.json")


if __name__ == "__main__":
    main()
