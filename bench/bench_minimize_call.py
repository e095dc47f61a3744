"""The whole `minimize` call on a family of tiny problems, repeated: its fixed cost against hand-written loops.

    python bench/bench_minimize_call.py [--rounds 61] [--sizes 8x4,32x8] [--steps 2000] [--json PATH]   # ~2 min on 2 cores

Problems: 2,000 Adam(1e-3) steps of ``mean((tanh(x @ w0) @ w1 - y) ** 2)``, a 4-W-1 tanh MLP on a
fixed batch of B rows, for B x W in `SIZES` (batch 8 to 256, hidden width 4 to 64; 32 x 8 is issue
40's). Each variant is one call from the caller's params and data (arguments, never closed over) to
results on the host, timed as wall time after a warm-up call (every variant's executables are built):

* ``minimize``:      ``loopfuse.minimize(loss, params, data, adam, steps=2000)`` (default backend),
                     the loss history on the host;
* ``minimize_k100``: the same with ``backend=CompiledLoop(steps=100)``: 20 device calls of 100 steps;
* ``by_hand``:       minimize's own program called by hand, no driver: its cached step's ``loop(2000)``
                     started from the initial state inside the program (``init=``, one device call), the
                     history moved to the host (what minimize's whole call would cost with no host work of
                     its own);
* ``fori_loop``:     ``jax.jit`` of a ``lax.fori_loop`` of the same step, the loss history as an output,
                     then moved to the host (what the Solution holds);
* ``fori_apart``:    the same fori_loop from a state made by a jitted initial-state call of its own (what
                     a second device call costs: minimize made one until it started its loop from the
                     params);
* ``while_loop``:    ``jax.jit`` of a ``lax.while_loop`` of the same step that also stops after a
                     non-finite loss (minimize's work: ``stop_on_nonfinite=True``), returning the history
                     and the steps run; the history's rows run moved to the host;
* ``optimistix``:    ``optx.minimise(loss, optx.OptaxMinimiser(adam, rtol=0, atol=0), params, data,
                     max_steps=2000, throw=False)`` (jitted by optimistix; no loss history).

Rounds interleave the variants of one problem (bench/harness.py): per-variant medians with min-max, and
the ratio of the medians, the reference's time over minimize's (>= 1.0: minimize is as fast or faster).
Targets: every problem >= 1.0x of the fori_loop and of the while_loop, and >= 1.2x of optimistix
(figure "minimize_call"). ``--steps N``: N steps per solve instead, the fixed cost of a short solve (figure
"minimize_call_N_steps"; no target of its own).

Where the time goes, per problem (the same rounds): the calling thread's CPU time per call (the host's
own work: Python, dispatch, copies; the device loop runs on XLA's threads), and the device loops alone:
microseconds per step of minimize's own loop (its cached program's ``loop(2000)``, the host checking the
losses after it; and the same loop stopping on a non-finite loss, as ``CompiledLoop(steps=100)`` runs it)
and of the jitted fori_loop and while_loop, each called on its state without reading anything back.
"""
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

STEPS = 2000
OPT = optax.adam(1e-3)
SIZES = ((8, 4), (16, 8), (32, 8), (8, 64), (64, 16), (128, 32), (256, 4), (256, 64))   # (batch, width)
TARGETS = {"fori_loop": 1.0, "while_loop": 1.0, "optimistix": 1.2}


def loss(params, data):
    return jnp.mean((jnp.tanh(data["x"] @ params["w0"]) @ params["w1"] - data["y"]) ** 2)


def problem(batch: int, width: int, seed: int = 0):
    """(params, data) of a 4-`width`-1 MLP on `batch` rows, as device arrays."""
    rng = np.random.default_rng(seed)
    params = {"w0": rng.normal(size=(4, width)) / 2, "w1": rng.normal(size=(width, 1)) / np.sqrt(width)}
    data = {"x": rng.normal(size=(batch, 4)), "y": rng.normal(size=(batch, 1))}
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), (params, data))


def step(state, data):
    """minimize's step: value and gradient, Adam, the loss."""
    params, opt_state = state
    value, grads = jax.value_and_grad(loss)(params, data)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), value


def _fori(state, data, unroll: int = 1):
    """``(params, loss history)`` after `STEPS` steps from `state` in a fori_loop (`unroll` steps per iteration)."""
    def body(i, carry):
        state, losses = carry
        state, value = step(state, data)
        return state, losses.at[i].set(value)
    (params, _), losses = jax.lax.fori_loop(0, STEPS, body, (state, jnp.zeros(STEPS)), unroll=unroll)
    return params, losses


@partial(jax.jit, static_argnames="unroll")
def fori_run(params, data, unroll: int = 1):
    """``(params, data) -> (params, loss history)``: the jitted fori_loop, its initial state computed inside."""
    return _fori((params, OPT.init(params)), data, unroll)


initial_state = jax.jit(lambda params: jax.tree_util.tree_map(jnp.copy, (params, OPT.init(params))))
fori_from = jax.jit(_fori, donate_argnums=0)    # the same loop from a state made by another call


@jax.jit
def while_run(params, data):
    """``(params, data) -> (params, loss history, steps run)``: the jitted while_loop, stopping after a
    non-finite loss (rows of steps not run are NaN)."""
    def body(carry):
        i, state, losses, _ = carry
        state, value = step(state, data)
        return i + 1, state, losses.at[i].set(value), jnp.isfinite(value)
    i, (params, _), losses, _ = jax.lax.while_loop(lambda c: (c[0] < STEPS) & c[3], body,
                                                   (0, (params, OPT.init(params)), jnp.full(STEPS, jnp.nan), True))
    return params, losses, i


def fori_solve(params, data):
    params, losses = fori_run(params, data)
    return jax.block_until_ready(params), np.asarray(losses)


def fori_apart_solve(params, data):
    """The fori_loop fed by a jitted initial-state call of its own (two device calls)."""
    params, losses = fori_from(initial_state(params), data)
    return jax.block_until_ready(params), np.asarray(losses)


def while_solve(params, data):
    params, losses, ran = while_run(params, data)
    return jax.block_until_ready(params), np.asarray(losses)[:int(ran)]


def optimistix_solve():
    import optimistix as optx
    solver = optx.OptaxMinimiser(OPT, rtol=0.0, atol=0.0)

    def solve(params, data):
        return jax.block_until_ready(optx.minimise(loss, solver, params, data, max_steps=STEPS, throw=False).value)
    return solve


def minimize_programs():
    """``(init, Step)`` of minimize's solve of `loss` with `OPT`: its own cached programs, as it builds them."""
    from loopfuse.drivers.solve import _program
    return _program(loss, True, OPT, loopfuse.CompiledLoop(), None)


def by_hand_solve():
    """minimize's loop(2000) from its init, called directly (`minimize_programs`)."""
    init, program = minimize_programs()
    loop = program.loop(STEPS, init=init)

    def solve(params, data):
        state, aux = loop(params, data)
        return state[0], np.asarray(aux["loss"])
    return solve


def minimize_solve(backend=None):
    keywords = {} if backend is None else {"backend": backend}

    def solve(params, data):
        sol = loopfuse.minimize(loss, params, data, OPT, steps=STEPS, **keywords)
        return sol.params, sol.loss_history
    return solve


def device_us_per_step(params, data, rounds: int) -> dict:
    """{loop: median us per step}: minimize's own device loops (its cached program's ``loop(2000)`` from its
    init, which it runs, the host checking the losses after it, and the same loop stopping on a non-finite loss,
    on the initial state) and the
    jitted fori_loop and while_loop, each called on its state without reading anything back, interleaved rounds;
    and the fori_loop with two steps per iteration (``unroll=2``, faster where XLA fuses across the two steps,
    which changes the results' last bits: `unrolled_bitwise`)."""
    init, program = minimize_programs()
    loop, stopping = program.loop(STEPS, init=init), program.loop(STEPS, stop_on_nonfinite=True)
    calls = {f"minimize's loop({STEPS})": lambda: loop(params, data)[0],
             f"loop({STEPS}) with the stop": lambda: stopping(init(params, data), data)[0],
             "fori_loop": lambda: fori_run(params, data)[0], "while_loop": lambda: while_run(params, data)[0],
             "fori_loop, unroll=2": lambda: fori_run(params, data, unroll=2)[0]}
    for call in calls.values():
        jax.block_until_ready(call())
    got = harness.interleave({name: (lambda call=call: harness.clocked(call)[0]) for name, call in calls.items()}, rounds)
    return {name: 1e6 * statistics.median(t) / STEPS for name, t in got.items()}


def same(a, b) -> bool:
    """Whether two (params, history) results have the same bits."""
    return all(x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def main() -> None:
    global STEPS
    ap = harness.parser(__doc__, rounds=61)
    ap.add_argument("--sizes", default=",".join(f"{b}x{w}" for b, w in SIZES), help="problems, BATCHxWIDTH,...")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per solve (the targets are 2,000's)")
    ns = ap.parse_args()
    STEPS = ns.steps
    if ns.quick:
        ns.rounds = 2
    sizes = [tuple(map(int, s.split("x"))) for s in ns.sizes.split(",")]
    out = harness.Report("minimize_call" if STEPS == 2000 else f"minimize_call_{STEPS}_steps", ns)
    variants = {"minimize": minimize_solve(), "minimize_k100": minimize_solve(loopfuse.CompiledLoop(steps=100)),
                "by_hand": by_hand_solve(), "fori_loop": fori_solve, "fori_apart": fori_apart_solve, "while_loop": while_solve,
                "optimistix": optimistix_solve()}
    rows, host, device, bitwise, unrolled = [], {}, {}, {}, {}
    for batch, width in sizes:
        name = f"{batch} x {width}"
        params, data = problem(batch, width)
        results = {v: solve(params, data) for v, solve in variants.items()}     # also builds every executable
        for other in ("minimize_k100", "by_hand"):        # the chunking and the driver never change results
            if not same(results["minimize"], results[other]):
                raise AssertionError(f"{name}: minimize's params or loss history differ from {other}'s")
        bitwise[name] = {ref: same(results["minimize"], results[ref]) for ref in ("fori_loop", "while_loop")}
        clocks = harness.interleave({v: (lambda solve=solve: harness.clocked(lambda: solve(params, data), time.thread_time))
                                     for v, solve in variants.items()}, ns.rounds)
        times = {v: [1e3 * wall for wall, _ in c] for v, c in clocks.items()}
        host[name] = {v: 1e6 * statistics.median(cpu for _, cpu in c) for v, c in clocks.items()}
        device[name] = device_us_per_step(params, data, 3 if ns.quick else max(5, ns.rounds // 4))
        unrolled[name] = same(fori_run(params, data), fori_run(params, data, unroll=2))
        row = dict(problem=name, times={v: harness.summary(t) for v, t in times.items()}, ratios={})
        for ref in TARGETS:
            row["ratios"][ref] = harness.compare(times["minimize"], times[ref], higher_is_better=False)
        for other in ("minimize_k100", "by_hand", "fori_apart"):
            row["ratios"][other] = harness.compare(times["minimize"], times[other], higher_is_better=False)
        row["ratios"]["fori_apart vs fori_loop"] = harness.compare(times["fori_apart"], times["fori_loop"],
                                                                   higher_is_better=False)
        rows.append(row)
        out.save()
        print(name, {v: round(t["median"], 2) for v, t in row["times"].items()},
              {r: round(c["ratio"], 3) for r, c in row["ratios"].items()}, flush=True)

    names = list(variants)
    lines = [f"Whole call, wall ms: median (min–max) over {ns.rounds} interleaved rounds per problem "
             "(batch x width)", "", "| problem | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {r['problem']} | " + " | ".join(
        f"{r['times'][v]['median']:.2f} ({r['times'][v]['min']:.2f}–{r['times'][v]['max']:.2f})" for v in names) + " |"
        for r in rows]
    lines += ["", "Reference / minimize, ratio of medians (>= 1.0: minimize as fast or faster); "
              "target per problem: " + ", ".join(f">= {t}x of {ref}" for ref, t in TARGETS.items()), "",
              "| problem | " + " | ".join(f"vs {ref}" for ref in TARGETS) + " | vs minimize_k100 | vs by_hand | "
              "vs fori_apart | fori_loop / fori_apart | minimize bitwise = fori_loop, while_loop |",
              "|---|" + "---|" * (len(TARGETS) + 5)]
    for r in rows:
        cells = [f"{c['ratio']:.2f}x (±{100 * c['spread']:.0f}%)" for c in r["ratios"].values()]
        cells = [cell + ("" if ref not in TARGETS else ": met" if r["ratios"][ref]["ratio"] >= TARGETS[ref]
                         else ": **missed**") for cell, ref in zip(cells, r["ratios"])]
        lines.append(f"| {r['problem']} | " + " | ".join(cells) + " | "
                     + ", ".join(str(b) for b in bitwise[r["problem"]].values()) + " |")
    lines += ["", "Host side: the calling thread's CPU time per call, median us (the device loops run on XLA's threads)",
              "", "| problem | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {p} | " + " | ".join(f"{h[v]:,.0f}" for v in names) + " |" for p, h in host.items()]
    loops = list(next(iter(device.values())))
    lines += ["", f"Device side: us per step of each device loop alone (one call of {STEPS:,} steps, nothing read back; "
              "median of interleaved rounds)", "", "| problem | " + " | ".join(loops) + " | unroll=2 bitwise = fori_loop |",
              "|---|" + "---:|" * len(loops) + "---|"]
    lines += [f"| {p} | " + " | ".join(f"{d[v]:.2f}" for v in loops) + f" | {unrolled[p]} |" for p, d in device.items()]
    out.section("\n".join(lines) + "\n", problems=rows, host_cpu_us=host, device_us_per_step=device,
                bitwise=bitwise, unrolled_bitwise=unrolled)
    out.write()


if __name__ == "__main__":
    main()
