"""A step call on an equinox model held as the state, against eqx.filter_jit's call (figure "static_leaves").

    python bench/bench_static_leaves.py [--rounds 15] [--calls 300]   # ~1 min on 2 cores

Problem: the Adam step of `tests/py/test_static_leaves.py` on its `eqx.nn.MLP` (2-8-8-1, tanh: the activation
function a leaf of the model), the batch of 16 rows an argument of every call. Variants, each one step per call
on the state it returned (donated where the variant donates), as a training loop runs it:

* ``loopfuse, model``:        ``compile_step(step)(state, batch)``, ``state = (model, opt_state)``: loopfuse holds
                              the activation as the state's structure (`static_leaves`), a Python pass per call;
* ``eqx.filter_jit``:         ``eqx.filter_jit(step, donate="all")(state, batch)``, what equinox users run;
* ``loopfuse, arrays only``:  ``compile_step`` of the same step on ``eqx.partition``'s arrays, the model's other
                              leaves closed over: jaxlib's C++ dispatcher with no Python pass (the floor).

Rounds interleave the variants (bench/harness.py); per variant the median (min-max) microseconds per call of
`--calls` calls, waited for at the end, and the ratio of medians to eqx.filter_jit's. The three states are
checked bitwise equal after the rounds (the same steps from the same start).
"""
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import test_static_leaves as problem  # noqa: E402


def main() -> None:
    ap = harness.parser(__doc__, rounds=15)
    ap.add_argument("--calls", type=int, default=300, help="calls per round and variant")
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds, ns.calls = 2, 20
    out = harness.Report("static_leaves", ns)
    batch = (problem.X, problem.Y)
    state = problem.start(problem.model())
    arrays, rest = eqx.partition(state, eqx.is_array)

    def arrays_step(s, b):
        new, aux = problem.step(eqx.combine(s, rest), b)
        return eqx.filter(new, eqx.is_array), aux
    calls = {"loopfuse, model": loopfuse.compile_step(problem.step),
             "eqx.filter_jit": eqx.filter_jit(problem.step, donate="all"),
             "loopfuse, arrays only": loopfuse.compile_step(arrays_step)}
    states = {"loopfuse, model": problem.fresh(state), "eqx.filter_jit": problem.fresh(state),
              "loopfuse, arrays only": problem.fresh(arrays)}
    rates, _ = harness.step_rates(calls, states, batch, 1, 5)          # warm: every executable built
    rates, _ = harness.step_rates(calls, states, batch, ns.rounds, ns.calls)
    us = {name: [1e6 / r for r in per_round] for name, per_round in rates.items()}
    same = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(
        *(jax.tree_util.tree_leaves(eqx.filter(states[n], eqx.is_array)) for n in calls)))
    lines = [f"us per call, median (min–max) of {ns.rounds} interleaved rounds of {ns.calls} calls; "
             f"ratio: the median over eqx.filter_jit's (< 1: faster); the three states bitwise equal: {same}", "",
             *harness.ratio_table(us, "eqx.filter_jit", "us per call")]
    out.section("\n".join(lines) + "\n", us_per_call={n: harness.summary(t) for n, t in us.items()}, bitwise=same)
    out.write()
    if not same:
        raise AssertionError("the variants' states differ")


if __name__ == "__main__":
    main()
