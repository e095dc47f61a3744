"""Compile time at scale and the flatten-update pass: an Adam step over many parameter leaves (figure "compile").

    python bench/bench_compile.py [--leaves 100] [--rounds 3] [--json PATH]      # ~4 min on 2 cores
    python bench/bench_compile.py --trace-only --leaves 100 300 [--rounds 5]    # figure "trace"

Trace time (always measured, alone with --trace-only): loopfuse's trace stage against
`jax.jit(step).lower(...)` of the same step, interleaved rounds in one warm process, each round
on a fresh function object (so neither reuses a cached trace); medians (min-max) of wall and CPU
time, ratios of medians.

Then, at the last --leaves, one compile each (no rounds: a compile of this size takes minutes on a
shared machine): `jax.jit(step).lower(...).compile()` wall time; loopfuse's trace + passes
(each pass timed) + XLA for the default pipeline and with `flatten-update` added; the number of
ops in each final module; and the per-step speed of each compiled step (interleaved rounds of
--steps steps).
"""
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse
from loopfuse.compile.pipeline import DEFAULT_PASSES
from loopfuse.compile.trace import trace

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
from problems import fresh  # noqa: E402


OPT = optax.adam(1e-3)


def loss(p, t):
    """The per-leaf MSE of params `p` against targets `t`, summed."""
    return sum(jnp.mean((p[k] - t[k]) ** 2) for k in p)


def adam_step(loss_fn):
    """``(params, adam state), batch -> (new state, loss)``: one Adam step on ``loss_fn(params, batch)``."""
    def train_step(state, batch):
        p, o = state
        value, grads = jax.value_and_grad(loss_fn)(p, batch)
        updates, o = OPT.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), value
    return train_step


def problem(leaves: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(1, 33)), int(rng.integers(1, 33))) for _ in range(leaves)]
    params = {f"p{i:04d}": jnp.asarray(rng.normal(size=s).astype(np.float32)) for i, s in enumerate(shapes)}
    targets = {k: jnp.asarray(rng.normal(size=v.shape).astype(np.float32)) for k, v in params.items()}
    return adam_step(loss), (params, OPT.init(params)), targets


def speeds(calls: dict, state, batch, steps: int, rounds: int) -> dict:
    """{name: [steps/s per round]}: `steps` chained steps of each call (its own state), interleaved rounds."""
    states = {name: fresh(state) for name in calls}

    def run(name):
        def once():
            x, t0 = states[name], time.perf_counter()
            for _ in range(steps):
                x, _ = calls[name](x, batch)
            states[name] = jax.block_until_ready(x)
            return steps / (time.perf_counter() - t0)
        return once
    for name in calls:  # warm up
        run(name)()
    return harness.interleave({name: run(name) for name in calls}, rounds)


def trace_times(leaves: int, rounds: int) -> dict:
    """Interleaved rounds of jax.jit(fn).lower and loopfuse's trace, a fresh fn each round."""
    step, state, batch = problem(leaves)
    runs = {"jax.jit(fn).lower": lambda fn: jax.jit(fn).lower(state, batch),
            "loopfuse trace": lambda fn: trace(fn, state, batch, {}, None)}
    fresh_fn = lambda: lambda s, b: step(s, b)  # noqa: E731  (a new function object: jax cannot reuse its trace)
    for run in runs.values():  # warm jax's own caches (primitive lowering rules, optax's jitted helpers)
        run(fresh_fn())
    got = harness.interleave({name: (lambda run=run: harness.clocked(lambda: (run(fresh_fn()), None)[1]))
                              for name, run in runs.items()}, rounds)
    wall, cpu = ({n: [t[i] for t in got[n]] for n in runs} for i in (0, 1))
    j, lf = "jax.jit(fn).lower", "loopfuse trace"
    return dict(leaves=leaves, rounds=rounds, wall={n: harness.summary(v) for n, v in wall.items()},
                cpu={n: harness.summary(v) for n, v in cpu.items()},
                wall_cost=harness.compare(wall[j], wall[lf], False), cpu_cost=harness.compare(cpu[j], cpu[lf], False))


def trace_report(rows: list) -> str:
    s = lambda x: f"{x['median']:.2f} ({x['min']:.2f}–{x['max']:.2f})"  # noqa: E731
    lines = ["Trace: seconds, median (min–max); loopfuse / jax time, ratio of medians (target <= 1.2x)", "",
             "| leaves | rounds | jax.jit(fn).lower wall s | CPU s | loopfuse trace wall s | CPU s | loopfuse / jax, wall "
             "| loopfuse / jax, CPU | target (CPU) |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        j, lf = "jax.jit(fn).lower", "loopfuse trace"
        cost = [c["ratio"] for c in (r["wall_cost"], r["cpu_cost"])]
        lines.append(f"| {r['leaves']} | {r['rounds']} | {s(r['wall'][j])} | {s(r['cpu'][j])} | {s(r['wall'][lf])} | "
                     f"{s(r['cpu'][lf])} | " + " | ".join(
                         f"{x:.2f}x" + ("" if c["measured"] else f" ({harness.ratio_text(c)})")
                         for x, c in zip(cost, (r["wall_cost"], r["cpu_cost"])))
                     + f" | {'PASS' if cost[1] <= 1.2 else 'MISS'} |")
    return "\n".join(lines) + "\n"


def op_count(text: str) -> int:
    """Operations in a printed module: lines with an ` = ` assignment or a `return`/`func.return`."""
    return sum(1 for line in text.splitlines() if " = " in line or line.strip().startswith(("return", "func.return",
                                                                                               "stablehlo.return")))


def main() -> None:
    ap = harness.parser(__doc__, rounds=3)
    ap.add_argument("--leaves", type=int, nargs="+", default=[100])
    ap.add_argument("--steps", type=int, default=50, help="steps timed per variant")
    ap.add_argument("--trace-only", action="store_true", help="only compare trace times")
    ns = ap.parse_args()
    if ns.quick:
        ns.leaves, ns.rounds, ns.steps = [10], 2, 5
    out = harness.Report("trace" if ns.trace_only else "compile", ns)
    traces = [trace_times(n, ns.rounds) for n in ns.leaves]
    out.section(trace_report(traces), trace=traces)
    if ns.trace_only:
        out.write()
        return
    leaves = ns.leaves[-1]
    fn, state, batch = problem(leaves)
    rows = {}
    t0 = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=0).lower(state, batch).compile()
    rows["jax.jit"] = {"compile_s": time.perf_counter() - t0, "ops": op_count(jax.jit(fn).lower(state, batch).as_text())}
    calls = {"jax.jit": jitted}
    for name, passes in [("loopfuse", None), ("loopfuse + flatten-update", [*DEFAULT_PASSES, "flatten-update"])]:
        step = loopfuse.compile_step(fn, passes=passes)
        t0 = time.perf_counter()
        seconds = step.compiled(state, batch).seconds
        total = time.perf_counter() - t0
        pass_s = {k: v for k, v in seconds.items() if k not in ("trace", "xla")}
        rows[name] = {"compile_s": total, "trace_s": seconds["trace"], "xla_s": seconds["xla"],
                      "passes_s": sum(pass_s.values()), "per_pass_s": pass_s,
                      "ops": op_count(step.lower(state, batch)["final"])}
        calls[name] = step
    rates = speeds(calls, state, batch, ns.steps, ns.rounds)
    for name, r in rows.items():
        r.update(steps_per_s=harness.summary(rates[name]),
                 vs_jit=harness.compare(rates[name], rates["jax.jit"], higher_is_better=True))
    base = rows["jax.jit"]
    lines = [f"Compile: Adam step over {leaves} parameter leaves (shapes 1..32 x 1..32), one compile each; steps/s: "
             f"{ns.rounds} interleaved rounds of {ns.steps} steps, median (min–max), ratio of medians", "",
             "| variant | compile s | vs jax.jit | trace s | passes s (share) | XLA s | ops in the final module | steps/s "
             "| speed vs jax.jit |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        share = f"{r['passes_s']:.3f} ({100 * r['passes_s'] / r['compile_s']:.1f}%)" if "passes_s" in r else "-"
        trace_s, xla_s = (f"{r[k]:.2f}" if k in r else "-" for k in ("trace_s", "xla_s"))
        lines.append(f"| {name} | {r['compile_s']:.2f} | {r['compile_s'] / base['compile_s']:.2f}x | "
                     f"{trace_s} | {share} | {xla_s} | {r['ops']:,} | "
                     f"{r['steps_per_s']['median']:,.1f} ({harness.spread_text(rates[name], '{:,.1f}')}) | "
                     f"{'1.00x (reference)' if name == 'jax.jit' else harness.ratio_text(r['vs_jit'])} |")
    lines += ["", "Passes / XLA: " + ", ".join(f"{name} {r['passes_s'] / r['xla_s']:.1%}"
                                               for name, r in rows.items() if "xla_s" in r)]
    lines += ["", "Per pass (seconds): " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["per_pass_s"].items())
        for name, r in rows.items() if "per_pass_s" in r)]
    out.section("\n".join(lines) + "\n", compile=rows)
    out.write()


if __name__ == "__main__":
    main()
