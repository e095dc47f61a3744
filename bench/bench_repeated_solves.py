"""Solves repeated over new data, the optimizer written inline as a script writes it (figure "repeated_solves").

    python bench/bench_repeated_solves.py [--rounds 7]   # ~1 min on 2 cores

Problem: 200 Adam(1e-2) steps of ``mean((tanh(x @ w0) @ w1 - y) ** 2)``, a 4-32-1 tanh MLP on 64 rows; each solve
gets new data of the same shapes (an argument, never closed over) and starts from the same params. Variants, each
one whole solve to results on the host:

* ``minimize, optimizer inline``:  ``minimize(loss, p0, data, optax.adam(1e-2), steps=200)``: a new optimizer
                                   object at every solve (minimize keys it by what it computes, `object_keys`);
* ``minimize, optimizer once``:    the same with one ``optax.adam(1e-2)`` made before the rounds;
* ``jax.jit fori_loop``:           a jitted function of (params, data) running the same steps in a
                                   ``lax.fori_loop``, its optimizer made once, the loss history an output.

After an untimed solve of each variant (its programs built), rounds interleave the variants (bench/harness.py);
per variant the median (min-max) milliseconds per solve, and the ratio of medians to the jitted loop's. Each
variant's params and history are checked bitwise equal to the others' on the last data.
"""
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
from problems import fori_solve  # noqa: E402

STEPS = 200


def loss(params, data):
    return jnp.mean((jnp.tanh(data["x"] @ params["w0"]) @ params["w1"] - data["y"]) ** 2)


def data_of(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": jnp.asarray(rng.normal(size=(64, 4)), jnp.float32),
            "y": jnp.asarray(rng.normal(size=(64, 1)), jnp.float32)}


def main() -> None:
    ap = harness.parser(__doc__, rounds=7)
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds = 2
    out = harness.Report("repeated_solves", ns)
    rng = np.random.default_rng(0)
    p0 = {"w0": jnp.asarray(rng.normal(size=(4, 32)) / 2, jnp.float32),
          "w1": jnp.asarray(rng.normal(size=(32, 1)) / 6, jnp.float32)}
    once = optax.adam(1e-2)

    by_hand = fori_solve(loss, once, STEPS)

    solves = {
        "minimize, optimizer inline": lambda d: _result(loopfuse.minimize(loss, p0, d, optax.adam(1e-2), steps=STEPS)),
        "minimize, optimizer once": lambda d: _result(loopfuse.minimize(loss, p0, d, once, steps=STEPS)),
        "jax.jit fori_loop": lambda d: jax.device_get(by_hand(p0, d)),
    }
    seeds = iter(range(1, 1 + 3 * (ns.rounds + 1)))
    last = {name: solve(data_of(0)) for name, solve in solves.items()}      # untimed: programs built
    timed = harness.interleave({name: (lambda name=name: harness.clocked(
        lambda: last.__setitem__(name, solves[name](data_of(next(seeds)))))[0]) for name in solves}, ns.rounds)
    final = data_of(10_000)
    results = [solve(final) for solve in solves.values()]
    same = all(np.array_equal(a, b) for r in results[1:] for a, b in zip(jax.tree_util.tree_leaves(results[0]),
                                                                        jax.tree_util.tree_leaves(r)))
    ms = {name: [1e3 * t for t in ts] for name, ts in timed.items()}
    lines = [f"ms per solve ({STEPS} Adam steps, new data each solve), median (min–max) of {ns.rounds} interleaved "
             f"rounds; ratio: the median over the jitted loop's; the three results bitwise equal: {same}", "",
             *harness.ratio_table(ms, "jax.jit fori_loop", "ms per solve", "{:,.2f}")]
    out.section("\n".join(lines) + "\n", ms_per_solve={n: harness.summary(t) for n, t in ms.items()}, bitwise=same)
    out.write()
    if not same:
        raise AssertionError("the variants' results differ")


def _result(sol) -> tuple:
    return sol.params, sol.loss_history


if __name__ == "__main__":
    main()
