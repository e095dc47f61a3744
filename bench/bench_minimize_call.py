"""The whole `minimize` call at the tiny size, repeated: its fixed cost against hand-written loops.

    python bench/bench_minimize_call.py [--rounds 101] [--json PATH]     # ~15 s on 2 cores

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

Two rows that split the call, not references: ``loops_only``, minimize's own 20 device loops
(its cached program, chained with ``loop.after`` as minimize runs them) from its initial state to
the final params, nothing read back; ``fori_device``, the fori_loop call without moving the loss
history to the host.

Rounds interleave the variants (bench/harness.py): per-variant medians with min-max, and the ratio
of the medians, the reference's time over minimize's (>= 1.0: minimize is as fast or faster).
Targets: >= 1.0x of the fori_loop, >= 1.2x of optimistix (figure "minimize_call").

Two tables say where the time goes (the same rounds): the host side, per variant this process's CPU
time over the wall time (1.0: its threads never ran at once, the host's work and the device loops'
took turns) and the return of one device call chained after another (minimize's loop of 100 steps
against jax.jit's fori_loop of 100 of the same steps); the device side, microseconds per step of
loopfuse's `loop(K)` and of jax.jit's `lax.scan` of K steps at K = 128, 129 and 2000 (a history of
more than 512 bytes, `runtime.SEQUENTIAL_BYTES`, which loopfuse writes in blocks).
"""
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "py"))
import harness  # noqa: E402
from problems import batch, mlp_loss, mlp_params  # noqa: E402

STEPS = 2000
OPT = optax.adam(1e-3)
TARGETS = {"fori_loop": 1.0, "optimistix": 1.2}


def fori_loop_run():
    """The jitted fori_loop: ``(params, data) -> (params, loss history)``, on the device."""
    @jax.jit
    def run(params, data):
        def body(i, carry):
            p, s, losses = carry
            value, grads = jax.value_and_grad(mlp_loss)(p, data)
            updates, s = OPT.update(grads, s, p)
            return optax.apply_updates(p, updates), s, losses.at[i].set(value)
        params, _, losses = jax.lax.fori_loop(0, STEPS, body, (params, OPT.init(params), jnp.zeros(STEPS)))
        return params, losses
    return run


def fori_loop_solve():
    run = fori_loop_run()

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


def loops_only():
    from loopfuse.solve import _cached_program
    backend = loopfuse.CompiledLoop()
    init, program = _cached_program(mlp_loss, True, OPT, backend, None)
    loop = program.loop(backend.steps, stop_on_nonfinite=True)

    def solve(params, data):
        state, stopped = init(params, data), None
        for _ in range(STEPS // backend.steps):
            state, _, _, stopped = loop(state, data) if stopped is None else loop.after(stopped, state, data)
        return jax.block_until_ready(state)
    return solve


def fori_device():
    run = fori_loop_run()
    return lambda params, data: jax.block_until_ready(run(params, data))


def step(state, data):
    """minimize's step, as a loop of it runs it: value and gradient, Adam, the loss as aux."""
    params, opt_state = state
    value, grads = jax.value_and_grad(mlp_loss)(params, data)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": value}


def chained_return_us(calls: int = 40) -> dict:
    """Median microseconds to the return of one device call of 100 steps chained after another (its
    state not ready): minimize's loop (as it dispatches them, `loop.after`) and jax.jit's fori_loop."""
    from loopfuse.solve import _cached_program
    init, program = _cached_program(mlp_loss, True, OPT, loopfuse.CompiledLoop(), None)
    loop = program.loop(100, stop_on_nonfinite=True)

    @jax.jit
    def fori(state, data):
        def body(i, carry):
            s, losses = carry
            s, aux = step(s, data)
            return s, losses.at[i].set(aux["loss"])
        return jax.lax.fori_loop(0, 100, body, (state, jnp.zeros(100)))
    fori = jax.jit(fori, donate_argnums=0)
    calls_of = {"loopfuse loop(100)": lambda s, stopped: loop.after(stopped, s, batch())[::3],
                "jax.jit fori_loop(100)": lambda s, stopped: (fori(s, batch())[0], stopped)}
    out = {}
    for name, call in calls_of.items():
        state, stopped, times = init(mlp_params(), batch()), np.False_, []
        state, stopped = call(state, stopped)
        for _ in range(calls):
            t0 = time.perf_counter()
            state, stopped = call(state, stopped)
            times.append(time.perf_counter() - t0)
        jax.block_until_ready(state)
        out[name] = 1e6 * statistics.median(times)
    return out


def per_step_us(ks=(128, 129, 2000), steps: int = 4000, rounds: int = 9) -> dict:
    """{(variant, K): median us per step}: `steps` steps as chained calls of loopfuse's loop(K) and of
    jax.jit's lax.scan of K steps (donated), interleaved rounds."""
    variants = {}
    for k in ks:
        variants[("loopfuse loop", k)] = loopfuse.compile_step(step).loop(k)
        variants[("jax.jit lax.scan", k)] = jax.jit(lambda s, d, k=k: jax.lax.scan(lambda c, _: step(c, d), s, None,
                                                                                  length=k), donate_argnums=0)
    states = {v: (mlp_params(), OPT.init(mlp_params())) for v in variants}

    def run(v):
        def once():
            t0 = time.perf_counter()
            for _ in range(-(-steps // v[1])):
                states[v] = variants[v](states[v], batch())[0]
            jax.block_until_ready(states[v])
            return 1e6 * (time.perf_counter() - t0) / (-(-steps // v[1]) * v[1])
        return once
    for v in variants:
        run(v)()
    return {v: statistics.median(t) for v, t in harness.interleave({v: run(v) for v in variants}, rounds).items()}


def minimize_solve(backend):
    def solve(params, data):
        sol = loopfuse.minimize(mlp_loss, params, data, OPT, steps=STEPS, backend=backend)
        return sol.params, sol.loss_history
    return solve


def main() -> None:
    ap = harness.parser(__doc__, rounds=101)
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds = 2
    out = harness.Report("minimize_call", ns)
    params, data = mlp_params(), batch()
    variants = {"minimize": minimize_solve(loopfuse.CompiledLoop()),
                "minimize_k2000": minimize_solve(loopfuse.CompiledLoop(steps=STEPS)),
                "fori_loop": fori_loop_solve(), "optimistix": optimistix_solve(),
                "loops_only": loops_only(), "fori_device": fori_device()}
    first = {name: 1e3 * harness.clocked(lambda: solve(params, data))[0] for name, solve in variants.items()}
    clocks = harness.interleave({name: (lambda solve=solve: harness.clocked(lambda: solve(params, data)))
                                 for name, solve in variants.items()}, ns.rounds)
    times = {name: [1e3 * wall for wall, _ in c] for name, c in clocks.items()}
    cpu_share = {name: statistics.median(cpu / wall for wall, cpu in c) for name, c in clocks.items()}
    lines = [f"Whole call, wall ms: first call, then median (min–max) over {ns.rounds} interleaved rounds", "",
             "| variant | first call ms | call ms |", "|---|---:|---:|"]
    lines += [f"| {n} | {first[n]:,.1f} | {harness.summary(t)['median']:.2f} ({harness.spread_text(t, '{:.2f}')}) |"
              for n, t in times.items()]
    lines += ["", "| minimize against | reference / minimize, ratio of medians | target |", "|---|---|---|"]
    rows = []
    for ours in ("minimize", "minimize_k2000"):
        for ref, target in TARGETS.items():
            c = harness.compare(times[ours], times[ref], higher_is_better=False)
            verdict = "met" if c["ratio"] >= target else "**missed**"
            lines.append(f"| {ours} vs {ref} | {c['ratio']:.2f}x" + ("" if c["measured"] else f", {harness.ratio_text(c)}")
                         + f" | >= {target}x: {verdict} |")
            rows.append(dict(ours=ours, ref=ref, target=target, **c))
    returns = chained_return_us(4 if ns.quick else 40)
    lines += ["", "Host side: CPU time over wall time of the call (median), and the return of one device call of 100 "
              "steps chained after another (median us)", "", "| variant | CPU / wall |", "|---|---:|"]
    lines += [f"| {n} | {share:.2f} |" for n, share in cpu_share.items()]
    lines += ["", "| device call, chained | returns after, us |", "|---|---:|"]
    lines += [f"| {n} | {us:.1f} |" for n, us in returns.items()]
    per_step = per_step_us(steps=400 if ns.quick else 4000, rounds=1 if ns.quick else 9)
    ks = sorted({k for _, k in per_step})
    lines += ["", "Device side: us per step of chained loop(K) calls of minimize's step (median of interleaved "
              "rounds, 4,000 steps each)", "", "| variant | " + " | ".join(f"K = {k}" for k in ks) + " |",
              "|---|" + "---:|" * len(ks)]
    for name in dict.fromkeys(v for v, _ in per_step):
        lines.append(f"| {name} | " + " | ".join(f"{per_step[(name, k)]:.2f}" for k in ks) + " |")
    out.section("\n".join(lines) + "\n", first=first, times={n: harness.summary(t) for n, t in times.items()},
                ratios=rows, cpu_share=cpu_share, chained_return_us=returns,
                per_step_us={f"{v} K={k}": us for (v, k), us in per_step.items()})
    out.write()


if __name__ == "__main__":
    main()
