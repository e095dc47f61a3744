"""pack-state: loop(K) speed and compile time with and without the pass, against a hand-written
donated ``lax.scan`` of the same step (Adam over many small leaves, bench_compile.py's problem), and
the issue's hand-written ``ravel_pytree`` program (params and moments as flat vectors).

    python bench/bench_pack.py [--leaves 300 1000] [--loop 10] [--rounds 5] [--calls 20] [--variants 1 4] [--out bench/out]

One run per leaf count: compile each variant once (wall time of the whole compile: trace, passes
and XLA for loopfuse, lower and compile for the scan), check the final states against each other,
then interleaved rounds (order reversed every other round) of `--calls` calls each; medians of
steps/s. Writes pack.md and pack.json into --out; states the machine's load average.
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

import loopfuse
from bench_compile import fresh, problem


def variants(fn, k: int, ravel_fn) -> dict:
    """name -> (compile(state, batch) -> (call, seconds, the state it takes)); `ravel_fn` is the step on
    `ravel(state)`."""
    def jit_scan(step, prepare=lambda s: s):
        def build(state, batch):
            state = prepare(state)
            t0 = time.perf_counter()
            scan = lambda s, b: lax.scan(lambda c, _: step(c, b), s, None, length=k)  # noqa: E731
            call = jax.jit(scan, donate_argnums=0).lower(state, batch).compile()
            return call, time.perf_counter() - t0, state
        return build

    def with_loopfuse(passes):
        def build(state, batch):
            loop = loopfuse.compile_step(fn, passes=passes).loop(k)
            t0 = time.perf_counter()
            loop.compiled(state, batch)
            return loop, time.perf_counter() - t0, state
        return build

    return {"lax.scan (jax.jit, donated)": jit_scan(fn),
            "hand-written ravel_pytree lax.scan (jax.jit, donated)": jit_scan(ravel_fn, ravel),
            "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(["pack-state"]),
            "loopfuse loop + pack-state{flatten=true}": with_loopfuse(["pack-state{flatten=true}"])}


def ravel(state):
    """Adam's state with the params and each moment as one flat f32 vector (the issue's hand-written
    program): `ravel_pytree` of each."""
    params, (adam, *rest) = state
    return ravel_pytree(params)[0], (adam._replace(mu=ravel_pytree(adam.mu)[0], nu=ravel_pytree(adam.nu)[0]), *rest)


def ravel_step(params):
    """bench_compile's step on `ravel(state)`: the loss reads unravel(flat params), the gradient is
    taken with respect to the flat vector, optax updates the flat vectors."""
    unravel = ravel_pytree(params)[1]
    opt = optax.adam(1e-3)

    def loss(flat, t):
        p = unravel(flat)
        return sum(jnp.mean((p[k] - t[k]) ** 2) for k in p)

    def step(state, batch):
        flat, o = state
        value, grad = jax.value_and_grad(loss)(flat, batch)
        updates, o = opt.update(grad, o, flat)
        return (optax.apply_updates(flat, updates), o), value
    return step


def bitwise(a, b) -> bool:
    """The same bits in every state element (in leaf order: `ravel` keeps it)."""
    return np.asarray(ravel_pytree(a)[0]).tobytes() == np.asarray(ravel_pytree(b)[0]).tobytes()


def run(leaves: int, k: int, rounds: int, calls: int, only=None) -> dict:
    fn, state, batch = problem(leaves)
    built, finals, states = {}, {}, {}
    for n, (name, build) in enumerate(variants(fn, k, ravel_step(state[0])).items()):
        if only is not None and n not in only and n != 0:
            continue
        call, seconds, start = build(fresh(state), batch)
        s, _ = call(fresh(start), batch)
        built[name], finals[name], states[name] = {"call": call, "compile_s": seconds, "rates": []}, s, start
    names = list(built)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            call = built[name]["call"]
            t0 = time.perf_counter()
            for _ in range(calls):
                states[name], _ = call(states[name], batch)
            jax.block_until_ready(states[name])
            built[name]["rates"].append(calls * k / (time.perf_counter() - t0))
    ref = names[0]
    return {"leaves": leaves, "loop": k, "rows": {
        name: {"compile_s": b["compile_s"], "steps_per_s": float(np.median(b["rates"])),
               "bitwise_vs_scan": bitwise(finals[name], finals[ref])} for name, b in built.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--loop", type=int, default=10, help="K of loop(K) and of the scan")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    ap.add_argument("--variants", type=int, nargs="+", help="the rows to run, by number from 0 (the scan, "
                    "row 0, always runs)")
    ap.add_argument("--out", default="bench/out")
    ns = ap.parse_args()
    load = os.getloadavg()[0]
    results = [run(n, ns.loop, ns.rounds, ns.calls, ns.variants) for n in ns.leaves]
    lines = [f"Adam over N leaves (shapes 1..32 x 1..32), loop({ns.loop}), {platform.machine()}, {os.cpu_count()} cores, "
             f"jax {jax.__version__}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}; medians of {ns.rounds} "
             f"interleaved rounds of {ns.calls} calls", "",
             "| leaves | variant | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |",
             "|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        base = next(iter(res["rows"].values()))
        for name, r in res["rows"].items():
            lines.append(f"| {res['leaves']} | {name} | {r['compile_s']:.1f} | {r['compile_s'] / base['compile_s']:.2f}x | "
                         f"{r['steps_per_s']:.0f} | {r['steps_per_s'] / base['steps_per_s']:.2f}x | {r['bitwise_vs_scan']} |")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pack.md").write_text("\n".join(lines) + "\n")
    (out / "pack.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
