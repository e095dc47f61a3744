"""The Lotka-Volterra fit (examples/lotka_volterra.py) side by side: loopfuse against jax.jit, lax.scan, optimistix.

    python bench/bench_odefit.py [--rounds 3] [--json PATH]     # ~5 min on 2 cores

Two phases of the example's recipe, each a separate table:

* Adam (2e-2), `ADAM_STEPS` steps from the example's start: loopfuse ``minimize`` (CompiledLoop), a
  hand-written loop of a ``jax.jit`` step, a ``jax.jit(lax.scan)`` loop, and optimistix's
  ``OptaxMinimiser`` (rtol = atol = 0, so it runs all steps; ``throw=False``).
* L-BFGS (``optax.lbfgs``, its zoom line search in the step), `LBFGS_STEPS` steps from the Adam
  result: the same four, with optimistix's ``BFGS`` (rtol = atol = 1e-6: it stops on its own
  criterion, at most 256 steps) in place of OptaxMinimiser.

Every contender takes the data as an argument. Per contender: steps/s (steps / run time, compile
excluded), the wall time of a whole repeated call (loopfuse's minimize keeps its programs: a repeated
call compiles nothing), the first call (loopfuse: measured; the others: compile + a run), compile
time (jax's lower + compile; minimize's compile_seconds), peak memory of the compiled executable,
the final loss, and the steps and time to reach within 1% of the best loss any contender of the
phase found (time = steps to it / steps/s; optimistix records no history: its whole run, an upper
bound, if its final loss is within 1%).
Rounds are interleaved (every contender once per round, the order alternating); figures are medians
with the min-max spread (bench/harness.py: figure "odefit").
"""
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimistix as optx

import loopfuse
from loopfuse import MemoryStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
from problems import fresh  # noqa: E402
import lotka_volterra as lv  # noqa: E402  (the example's problem, loss and optimizers)

ADAM_STEPS, LBFGS_STEPS, CHUNK = 300, 30, 100
# the scan returns only the params: jax warns that the donated optimizer state has no output to reuse
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
WITHIN = 1.01


def now() -> float:
    return time.perf_counter()


def aot(fn, *args, donate=()):
    """``jax.jit(fn)`` compiled for `args`: (executable, compile seconds)."""
    t0 = now()
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    return compiled, now() - t0


def minimize_step(optimizer, line_search: bool):
    """What minimize runs per step (value and gradient, the update, with the loss for a line search)."""
    def step(state, data):
        params, opt_state = state
        value, grad = jax.value_and_grad(lv.loss)(params, data)
        extra = {"value": value, "grad": grad, "value_fn": lambda p: lv.loss(p, data)} if line_search else {}
        updates, opt_state = optimizer.update(grad, opt_state, params, **extra)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}
    return step


def python_loop(step, state, data, steps):
    losses = []
    for _ in range(steps):
        state, aux = step(state, data)
        losses.append(aux["loss"])
    return state[0], jnp.stack(losses)


def scan_loop(step, steps):
    def loop(state, data):
        (params, _), aux = jax.lax.scan(lambda c, _: step(c, data), state, None, length=steps)
        return params, aux["loss"]
    return loop


class Contender(NamedTuple):
    """One way to run a phase: ``setup()`` compiles ({compile_s, memory, and first_call_s where the
    first call is what compiles}); ``run()`` one solve ({params, losses (None: no history), steps,
    run_s, and wall_s where the call does more than the run})."""

    setup: Callable[[], dict]
    run: Callable[[], dict]


def contenders(optimizer, line_search: bool, steps: int, chunk: int, start, data, optimistix_solver,
               optimistix_steps: int) -> dict:
    """loopfuse minimize, a jax.jit step in a Python loop, jax.jit(lax.scan), optimistix: `steps` of
    `optimizer` from `start` (optimistix: `optimistix_solver`, at most `optimistix_steps`)."""
    step = minimize_step(optimizer, line_search)
    state0 = lambda: fresh((start, optimizer.init(start)))

    def minimize_solve():
        t0 = now()
        sol = loopfuse.minimize(lv.loss, start, data=data, optimizer=optimizer, steps=steps,
                                backend=loopfuse.CompiledLoop(steps=chunk))
        return sol, now() - t0

    def minimize_setup():      # the first call compiles (later ones reuse its programs); memory: its chunk program
        sol, first_call = minimize_solve()
        memory = loopfuse.compile_step(step, keep_aux=("loss",)).loop(chunk).memory_stats(state0(), data)
        return dict(compile_s=sol.compile_seconds, first_call_s=first_call, memory=memory)

    def minimize_run():
        sol, wall = minimize_solve()
        return dict(params=sol.params, losses=sol.loss_history, steps=sol.steps, run_s=sol.steps / sol.steps_per_second,
                    wall_s=wall)

    def aot_contender(fn, run):
        box = {}

        def setup():
            box["fn"], seconds = aot(fn, state0(), data, donate=(0,))
            return dict(compile_s=seconds, memory=MemoryStats.from_analysis(box["fn"].memory_analysis()))

        def timed():
            t0 = now()
            params, losses = jax.block_until_ready(run(box["fn"], state0()))
            return dict(params=params, losses=np.asarray(losses), steps=steps, run_s=now() - t0)
        return Contender(setup, timed)

    return {f"loopfuse minimize (CompiledLoop(steps={chunk}))": Contender(minimize_setup, minimize_run),
            "jax.jit step, Python loop": aot_contender(step, lambda f, s: python_loop(f, s, data, steps)),
            "jax.jit(lax.scan)": aot_contender(scan_loop(step, steps), lambda f, s: f(s, data)),
            f"optimistix {type(optimistix_solver).__name__}": optimistix_contender(
                optimistix_solver, start, data, optimistix_steps)}


def optimistix_contender(solver, start, data, max_steps) -> Contender:
    box = {}

    def solve(y0, data):
        sol = optx.minimise(lv.loss, solver, y0, args=data, max_steps=max_steps, throw=False)
        return sol.value, sol.stats["num_steps"]

    def setup():
        box["fn"], seconds = aot(solve, start, data)
        return dict(compile_s=seconds, memory=MemoryStats.from_analysis(box["fn"].memory_analysis()))

    def run():
        t0 = now()
        params, steps = jax.block_until_ready(box["fn"](start, data))
        return dict(params=params, losses=None, steps=int(steps), run_s=now() - t0)
    return Contender(setup, run)


def phase(runners: dict, data, rounds: int) -> dict:
    """Set every contender up, run `rounds` interleaved rounds, summarize."""
    setups = {name: c.setup() for name, c in runners.items()}
    runs = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            runs[name].append(runners[name].run())
    loss = jax.jit(lv.loss)
    final = {name: float(loss(rs[0]["params"], data)) for name, rs in runs.items()}
    best = min(final.values())
    rows = {}
    for name, rs in runs.items():
        first, setup = rs[0], setups[name]
        run_s = [r["run_s"] for r in rs]
        steps_per_s = [r["steps"] / r["run_s"] for r in rs]
        if first["losses"] is not None:
            hits = np.flatnonzero(np.append(first["losses"][1:], final[name]) <= WITHIN * best)  # loss after step i+1
            to_target = int(hits[0]) + 1 if hits.size else None
        else:
            to_target = first["steps"] if final[name] <= WITHIN * best else None
        wall = [r.get("wall_s", r["run_s"]) for r in rs]
        rows[name] = dict(
            steps=first["steps"], final_loss=final[name], steps_per_s=spread(steps_per_s), run_s=spread(run_s),
            wall_s=spread(wall), compile_s=setup["compile_s"],
            first_call_s=setup.get("first_call_s", setup["compile_s"] + statistics.median(run_s)),
            peak_bytes=setup["memory"].peak,
            temp_bytes=setup["memory"].temp, steps_to_target=to_target,
            seconds_to_target=None if to_target is None else to_target / statistics.median(steps_per_s),
            history=first["losses"] is not None, log_params=np.asarray(first["params"]).tolist())
    return dict(best_loss=best, rows=rows)


def spread(xs) -> dict:
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs))


def fmt(s: dict, scale=1.0, digits=0) -> str:
    m, lo, hi = (scale * s[k] for k in ("median", "min", "max"))
    return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def table(title: str, result: dict) -> list[str]:
    lines = [f"### {title}\n", f"best final loss {result['best_loss']:.6g}; target: within 1% of it\n",
             "| contender | steps | final loss | steps/s | run (ms) | repeated call (ms) | first call (s) "
             "| compile (s) | peak memory | steps to 1% | time to 1% (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["rows"].items():
        bound = "" if r["history"] else "<= "      # no history: the whole run is an upper bound
        target = "not reached" if r["steps_to_target"] is None else f"{bound}{r['steps_to_target']}"
        seconds = "-" if r["seconds_to_target"] is None else f"{bound}{1e3 * r['seconds_to_target']:,.0f}"
        lines.append(
            f"| {name} | {r['steps']} | {r['final_loss']:.6g} | {fmt(r['steps_per_s'])} | {fmt(r['run_s'], 1e3)} "
            f"| {fmt(r['wall_s'], 1e3)} | {r['first_call_s']:.2f} | {r['compile_s']:.2f} "
            f"| {r['peak_bytes'] / 1024:,.0f} KiB | {target} | {seconds} |")
    return lines + [""]


def main():
    ap = harness.parser(__doc__, rounds=3)
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
    out = harness.Report("odefit", args)
    data = lv.observations()
    start = jnp.log(jnp.asarray(lv.START))
    adam = phase(contenders(lv.ADAM, False, ADAM_STEPS, CHUNK, start, data,
                            optx.OptaxMinimiser(lv.ADAM, rtol=0.0, atol=0.0), ADAM_STEPS), data, args.rounds)
    polish_from = jnp.asarray(adam["rows"]["jax.jit(lax.scan)"]["log_params"], jnp.float32)   # bitwise its result
    lbfgs = phase(contenders(lv.LBFGS, True, LBFGS_STEPS, LBFGS_STEPS, polish_from, data,
                             optx.BFGS(rtol=1e-6, atol=1e-6), 256), data, args.rounds)
    out.section("\n".join([f"{args.rounds} interleaved rounds; median (min-max).\n",
                           *table(f"Adam (2e-2), {ADAM_STEPS} steps from the example's start", adam)]), adam=adam)
    out.section("\n".join(table(f"L-BFGS, {LBFGS_STEPS} steps from the Adam result (optimistix BFGS: to its "
                                "rtol=atol=1e-6)", lbfgs)), lbfgs=lbfgs)
    out.write()

if __name__ == "__main__":
    main()
