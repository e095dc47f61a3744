"""minimize with until=: what a converged solve saves, and what the host-side stop check costs (figure "minimize_until").

    python bench/bench_minimize_until.py [--rounds 7] [--json PATH]     # ~2 min on 2 cores

The problem is bench_loop's medium one (Adam-trained MLP 64-256-1, batch 128). Two figures:

* early stop: ``minimize(steps=1000, backend=CompiledLoop(steps=100), until=loss <= threshold)``,
  the threshold being the lowest loss of the first 180 steps of a reference solve, against the
  same solve without `until`. Time = the solve loop (steps run / Solution.steps_per_second; every
  solve compiles first, outside it). Target: time <= 1.05 x steps run / 1000 (~18%). A control,
  ``minimize(steps=<steps run>)`` without `until`, separates the stop's cost from the per-solve one.
* host check: CompiledStep (one call per step) with the default ``stop_on_nonfinite=True``, which
  reads each step's loss on the host before the next step, against ``stop_on_nonfinite=False``
  (calls pipelined); the steps/s of both, no target.

Interleaved rounds (one solve each per round), medians with min-max, ratios of medians
(bench/harness.py).
"""
import sys
from pathlib import Path

import numpy as np

import loopfuse

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from bench_loop import OPT, SIZES, init_params, loss_fn, make_batch  # noqa: E402

LAYERS, BATCH = SIZES["medium"]["layers"], SIZES["medium"]["batch"]
LONG, STOP_AT, K = 1000, 180, 100    # minimize(steps=LONG) converging at step STOP_AT, loops of K steps
HOST_STEPS = 200                     # the host-check figure: CompiledStep solves of HOST_STEPS steps
TARGET = 1.05                        # a stopped solve's time / the full one's, per step run


def solve(batch, steps, backend, **kwargs) -> loopfuse.Solution:
    return loopfuse.minimize(loss_fn, init_params(LAYERS), batch, optimizer=OPT, steps=steps, backend=backend,
                             **kwargs)


def seconds(sol: loopfuse.Solution) -> float:
    return sol.steps / sol.steps_per_second


def time_ratio(a, b) -> float:
    """Median solve-loop time of solutions `a` over that of `b`."""
    return 1 / harness.compare([seconds(x) for x in a], [seconds(y) for y in b], False)["ratio"]


def early_stop(batch, n_rounds) -> dict:
    loop = loopfuse.CompiledLoop(steps=K)
    reference = solve(batch, LONG, loop)
    threshold = float(reference.loss_history[:STOP_AT].min())
    until = lambda params, loss: loss <= threshold
    n = int(np.argmax(reference.loss_history <= threshold)) + 1
    variants = {"full": lambda: solve(batch, LONG, loop), "until": lambda: solve(batch, LONG, loop, until=until),
                "control": lambda: solve(batch, n, loop)}
    sols = harness.interleave(variants, n_rounds)
    stopped = sols["until"][0]
    assert stopped.steps == n and stopped.retcode == "converged"
    np.testing.assert_array_equal(stopped.loss_history, reference.loss_history[:n])
    ratio, ideal = time_ratio(sols["until"], sols["full"]), n / LONG
    return dict(steps_run=n, retcode=stopped.retcode, threshold=threshold, ratio=ratio, ideal=ideal,
                met=ratio <= TARGET * ideal, control_ratio=time_ratio(sols["control"], sols["full"]),
                seconds={k: harness.summary([seconds(x) for x in v]) for k, v in sols.items()})


def host_check(batch, n_rounds) -> dict:
    step = loopfuse.CompiledStep()
    variants = {"stop_on_nonfinite=True": lambda: solve(batch, HOST_STEPS, step),
                "stop_on_nonfinite=False": lambda: solve(batch, HOST_STEPS, step, stop_on_nonfinite=False)}
    sols = harness.interleave(variants, n_rounds)
    rates = {k: [s.steps_per_second for s in v] for k, v in sols.items()}
    return dict(steps_per_s={k: harness.summary(v) for k, v in rates.items()},
                compare=harness.compare(rates["stop_on_nonfinite=True"], rates["stop_on_nonfinite=False"], True))


def ms(s: dict) -> str:
    return f"{s['median'] * 1e3:.1f} ms ({s['min'] * 1e3:.1f}–{s['max'] * 1e3:.1f})"


def report(early, host, n_rounds) -> str:
    s = early["seconds"]
    lines = [
        f"MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}, Adam; {n_rounds} interleaved rounds; times: median (min–max) "
        "of the solve loop (compile excluded), ratios of medians.\n",
        "#### Early stop\n",
        "| solve | steps run | retcode | solve loop |\n|---|---:|---|---:|",
        f"| minimize(steps={LONG}, CompiledLoop(steps={K})) | {LONG} | max_steps | {ms(s['full'])} |",
        f"| ... until=loss <= lowest loss of steps 1..{STOP_AT} | {early['steps_run']} | {early['retcode']} "
        f"| {ms(s['until'])} |",
        f"| control: minimize(steps={early['steps_run']}) | {early['steps_run']} | max_steps | {ms(s['control'])} |\n",
        f"Time ratio {early['ratio']:.1%} (steps ratio {early['ideal']:.1%}; target <= {TARGET * early['ideal']:.1%}): "
        f"{'PASS' if early['met'] else 'MISS'}; the control's ratio: {early['control_ratio']:.1%}\n",
        f"#### CompiledStep: the per-step host check ({HOST_STEPS} steps)\n",
        "| variant | steps/s, median (min–max) |\n|---|---:|",
        *[f"| {k} | {v['median']:,.0f} ({harness.spread_text(v['rounds'])}) |" for k, v in host["steps_per_s"].items()],
        f"\nSpeed, stop_on_nonfinite=True (the default) / False: {harness.ratio_text(host['compare'])}",
    ]
    return "\n".join(lines) + "\n"


def main():
    args = harness.parser(__doc__, rounds=7).parse_args()
    out = harness.Report("minimize_until", args)
    n = 2 if args.quick else args.rounds
    batch = make_batch(LAYERS, BATCH)
    early, host = early_stop(batch, n), host_check(batch, n)
    out.section(report(early, host, n), early_stop=early, host_check=host)
    out.write()


if __name__ == "__main__":
    main()
