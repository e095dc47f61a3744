"""Compile time at scale and the flatten-update pass: an Adam step over many parameter leaves.

    python bench/bench_compile.py [--leaves 1000] [--out bench/out]
    python bench/bench_compile.py --trace-only --leaves 300 1000 [--rounds 5]

Measures, in one run: `jax.jit(step).lower(...).compile()` wall time; loopfuse's trace + passes
(each pass timed) + XLA for the default pipeline and with `flatten-update` added; and the
per-step speed of each compiled step. Writes compile.md and compile.json into --out.

Trace time (always measured, alone with --trace-only): loopfuse's trace stage against
`jax.jit(step).lower(...)` of the same step, interleaved rounds in one warm process, each round
on a fresh function object (so neither reuses a cached trace); medians of wall and CPU time.
Writes trace.md and trace.json.
"""
import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse
from loopfuse.trace import trace


def problem(leaves: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(1, 33)), int(rng.integers(1, 33))) for _ in range(leaves)]
    params = {f"p{i:04d}": jnp.asarray(rng.normal(size=s).astype(np.float32)) for i, s in enumerate(shapes)}
    targets = {k: jnp.asarray(rng.normal(size=v.shape).astype(np.float32)) for k, v in params.items()}
    opt = optax.adam(1e-3)

    def loss(p, t):
        return sum(jnp.mean((p[k] - t[k]) ** 2) for k in p)

    def train_step(state, batch):
        p, o = state
        value, grads = jax.value_and_grad(loss)(p, batch)
        updates, o = opt.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), value

    return train_step, (params, opt.init(params)), targets


def steps_per_second(call, state, batch, n: int) -> float:
    state, _ = call(state, batch)  # warm
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(n):
        state, _ = call(state, batch)
    jax.block_until_ready(state)
    return n / (time.perf_counter() - t0)


def fresh(tree):
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def timed(f) -> tuple[float, float]:
    """(wall, CPU) seconds of f()."""
    t0, c0 = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - t0, time.process_time() - c0


def trace_times(leaves: int, rounds: int) -> dict:
    """Medians over interleaved rounds of jax.jit(fn).lower and loopfuse's trace, fresh fn each round."""
    step, state, batch = problem(leaves)
    runs = {"jax.jit(fn).lower": lambda fn: jax.jit(fn).lower(state, batch),
            "loopfuse trace": lambda fn: trace(fn, state, batch, {}, None)}
    fresh_fn = lambda: lambda s, b: step(s, b)  # a new function object: jax cannot reuse its trace
    for run in runs.values():  # warm jax's own caches (primitive lowering rules, optax's jitted helpers)
        run(fresh_fn())
    times = {name: [] for name in runs}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            fn = fresh_fn()
            times[name].append(timed(lambda: runs[name](fn)))
    med = {name: (float(np.median([w for w, _ in t])), float(np.median([c for _, c in t])))
           for name, t in times.items()}
    (jw, jc), (lw, lc) = med["jax.jit(fn).lower"], med["loopfuse trace"]
    return {"leaves": leaves, "rounds": rounds, "jax_wall_s": jw, "jax_cpu_s": jc, "loopfuse_wall_s": lw,
            "loopfuse_cpu_s": lc, "wall_ratio": lw / jw, "cpu_ratio": lc / jc}


def trace_report(rows: list, out: Path) -> None:
    lines = ["| leaves | jax.jit(fn).lower wall s (CPU s) | loopfuse trace wall s (CPU s) | ratio wall (CPU) | target |",
             "|---|---|---|---|---|"]
    for r in rows:
        verdict = "PASS" if r["cpu_ratio"] <= 1.2 and r["wall_ratio"] <= 1.2 else "MISS"
        lines.append(f"| {r['leaves']} | {r['jax_wall_s']:.2f} ({r['jax_cpu_s']:.2f}) | "
                     f"{r['loopfuse_wall_s']:.2f} ({r['loopfuse_cpu_s']:.2f}) | "
                     f"{r['wall_ratio']:.2f}x ({r['cpu_ratio']:.2f}x) | <= 1.2x: {verdict} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.md").write_text("\n".join(lines) + "\n")
    (out / "trace.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[1000])
    ap.add_argument("--steps", type=int, default=50, help="steps timed per variant")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the trace comparison")
    ap.add_argument("--trace-only", action="store_true", help="only compare trace times")
    ap.add_argument("--out", default="bench/out")
    ns = ap.parse_args()
    trace_report([trace_times(n, ns.rounds) for n in ns.leaves], Path(ns.out))
    if ns.trace_only:
        return
    ns.leaves = ns.leaves[-1]
    fn, state, batch = problem(ns.leaves)
    rows = {}

    t0 = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=0).lower(state, batch).compile()
    rows["jax.jit"] = {"compile_s": time.perf_counter() - t0,
                       "steps_per_s": steps_per_second(jitted, fresh(state), batch, ns.steps)}

    for name, passes in [("loopfuse", None), ("loopfuse + flatten-update", ["simplify", "flatten-update"])]:
        step = loopfuse.compile_step(fn, passes=passes)
        t0 = time.perf_counter()
        seconds = step.compiled(state, batch).seconds
        total = time.perf_counter() - t0
        pass_s = {k: v for k, v in seconds.items() if k not in ("trace", "xla")}
        rows[name] = {"compile_s": total, "trace_s": seconds["trace"], "xla_s": seconds["xla"],
                      "passes_s": sum(pass_s.values()), "per_pass_s": pass_s,
                      "steps_per_s": steps_per_second(step, fresh(state), batch, ns.steps)}

    base = rows["jax.jit"]
    lines = [f"Adam step over {ns.leaves} parameter leaves (shapes 1..32 x 1..32), {platform.processor() or platform.machine()}, "
             f"jax {jax.__version__}", "",
             "| variant | compile s | vs jax.jit | trace s | passes s (share) | XLA s | steps/s | speed vs jax.jit |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        share = f"{r['passes_s']:.3f} ({100 * r['passes_s'] / r['compile_s']:.1f}%)" if "passes_s" in r else "-"
        trace_s, xla_s = (f"{r[k]:.2f}" if k in r else "-" for k in ("trace_s", "xla_s"))
        lines.append(f"| {name} | {r['compile_s']:.2f} | {r['compile_s'] / base['compile_s']:.2f}x | "
                     f"{trace_s} | {share} | {xla_s} | "
                     f"{r['steps_per_s']:.1f} | {r['steps_per_s'] / base['steps_per_s']:.2f}x |")
    lines += ["", "Passes / XLA: " + ", ".join(f"{name} {r['passes_s'] / r['xla_s']:.1%}"
                                               for name, r in rows.items() if "xla_s" in r)]
    lines += ["", "Per pass (seconds): " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["per_pass_s"].items())
        for name, r in rows.items() if "per_pass_s" in r)]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile.md").write_text("\n".join(lines) + "\n")
    (out / "compile.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
