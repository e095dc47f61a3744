"""The whole `minimize` call at the tiny size, repeated: its fixed cost against hand-written loops.

    python bench/bench_minimize_call.py [--rounds 21] [--out bench/out]

Problem: 2,000 Adam(1e-3) steps of a 4-8-1 tanh MLP on a fixed batch of 16 (tests/py/problems.py's
sizes). Each variant is one call from the caller's params and data (arguments, never closed over) to
results on the host, timed as wall time after a warm-up call (every variant's executables are built):

* ``minimize``:      ``loopfuse.minimize(loss, params, data, adam, steps=2000)`` (CompiledLoop(steps=100)),
                     the loss history on the host;
* ``minimize_k2000``: the same with ``backend=CompiledLoop(steps=2000)`` (one device call);
* ``fori_loop``:     ``jax.jit`` of a ``lax.fori_loop`` of the same step, the loss history as an output,
                     then moved to the host (what the Solution holds);
* ``optimistix``:    ``optx.minimise(loss, optx.OptaxMinimiser(adam, rtol=0, atol=0), params, data,
                     max_steps=2000, throw=False)`` (jitted by optimistix; no loss history).

Rounds interleave the variants (order alternating); ratios are medians of the per-round ratios of
the reference's time to minimize's (>= 1.0: minimize is as fast or faster). Targets: >= 1.0x of the
fori_loop, >= 1.2x of optimistix. Writes minimize_call.md / .json to --out.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "py"))
from problems import batch, mlp_loss, mlp_params  # noqa: E402

STEPS = 2000
OPT = optax.adam(1e-3)
TARGETS = {"fori_loop": 1.0, "optimistix": 1.2}


def fori_loop_solve():
    @jax.jit
    def run(params, data):
        def body(i, carry):
            p, s, losses = carry
            value, grads = jax.value_and_grad(mlp_loss)(p, data)
            updates, s = OPT.update(grads, s, p)
            return optax.apply_updates(p, updates), s, losses.at[i].set(value)
        params, _, losses = jax.lax.fori_loop(0, STEPS, body, (params, OPT.init(params), jnp.zeros(STEPS)))
        return params, losses

    def solve(params, data):
        params, losses = run(params, data)
        return jax.block_until_ready(params), np.asarray(losses)
    return solve


def optimistix_solve():
    import optimistix as optx
    solver = optx.OptaxMinimiser(OPT, rtol=0.0, atol=0.0)

    def solve(params, data):
        sol = optx.minimise(mlp_loss, solver, params, data, max_steps=STEPS, throw=False)
        return jax.block_until_ready(sol.value)
    return solve


def minimize_solve(backend):
    def solve(params, data):
        sol = loopfuse.minimize(mlp_loss, params, data, OPT, steps=STEPS, backend=backend)
        return sol.params, sol.loss_history
    return solve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    params, data = mlp_params(), batch()
    variants = {"minimize": minimize_solve(loopfuse.CompiledLoop()),
                "minimize_k2000": minimize_solve(loopfuse.CompiledLoop(steps=STEPS)),
                "fori_loop": fori_loop_solve(), "optimistix": optimistix_solve()}
    first = {}
    for name, solve in variants.items():
        t0 = time.perf_counter()
        solve(params, data)
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            variants[name](params, data)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    ratios = {f"{ours} vs {ref}": statistics.median(b / a for a, b in zip(times[ours], times[ref]))
              for ours in ("minimize", "minimize_k2000") for ref in TARGETS}
    lines = ["| variant | first call (ms) | median call (ms) |", "|---|---|---|"]
    lines += [f"| {n} | {1e3 * first[n]:.1f} | {1e3 * med[n]:.2f} |" for n in names]
    lines += ["", "| ratio (reference time / minimize time) | median | target |", "|---|---|---|"]
    for key, value in ratios.items():
        target = TARGETS[key.split(" vs ")[1]]
        lines.append(f"| {key} | {value:.2f}x | >= {target}x {'met' if value >= target else 'MISSED'} |")
    text = f"{args.rounds} rounds, {jax.devices()[0].device_kind}, jax {jax.__version__}\n\n" + "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "minimize_call.md").write_text(text + "\n")
    (args.out / "minimize_call.json").write_text(json.dumps({"first": first, "median": med, "ratios": ratios,
                                                             "times": times}, indent=1))


if __name__ == "__main__":
    main()
