"""Many fits in one call (issues 32, 39): ``minimize(..., ensemble=True)`` against ``jax.jit(jax.vmap(solve))`` and
against every fixed tile size (figure "ensemble").

    python bench/bench_ensemble.py [--quick] [--every-tile] [--rounds 5] [--compile-rounds 2] [--json PATH]

`solve` is the single-member solve minimize runs, written by hand: a ``lax.while_loop`` of value and
gradient, the optax update, the loss history (NaN past the stop) and the stop (`until` on the params
before the update, a non-finite loss); vmapped over the members, jitted, the data an argument on both
sides. Every figure is the wall time of a whole repeated call (both sides compiled beforehand: minimize
keeps its programs; the reference is called compiled), its outputs on the host; medians (min-max) of
interleaved rounds (bench/harness.py), ratios of medians. Each problem runs the default tiles (the tile
`loopfuse.drivers.tiles` reads from the member step's program) beside fixed tiles ``Ensemble(tile=T)``, T the
powers of 4 up to N (``--every-tile``: every power of 2, ~10 min more: each Lotka-Volterra tile is a
program of ~15 s to compile); the default is one of them, so its row and that tile's run the same program.

* quadratic: N = 1,024 gradient-descent solves (SGD(1.0)) of normalised diagonal quadratics
  ``0.5 * sum(h * x**2)``, D = 64, condition numbers log-uniform in 1..1e3 (largest curvature 1),
  each stopping after the first step whose loss is below 1e-6, at most 4,000 steps. Contenders:
  loopfuse (default and fixed tiles), the vmapped reference (the same outputs, checked bitwise against
  the default's: params, history, steps), the vmapped solve without the history (an ablation: fewer
  outputs), optimistix's ``minimise`` with ``GradientDescent(1.0, rtol=0, atol=ATOL)`` under ``jax.vmap``
  (its own stop: ``|dy|, |df| <= atol``; no history). Targets: loopfuse >= 4x the vmapped reference; the
  default within 10% of the best fixed tile.
* lotka-volterra: the L-BFGS phase of examples/multistart.py (64 starts, from its Adam phase, computed
  once): loopfuse (default and fixed tiles) against the vmapped reference; whole call and compile (a
  fresh loss object per compile round: minimize's first call's compile_seconds, the tile's reading of
  the program included; jax.jit's lower + compile). Outputs compared per member. Targets: the default
  >= 2x the reference and within 10% of the best fixed tile, compile <= 1.5x.
* overhead: a 1-member ensemble against the plain minimize of that member (the quadratic with
  condition number 1e3), target >= 0.95x; N = 1,024 copies of one quadratic (all stop at the same
  step: nothing to compact) against the vmapped reference, target >= 0.95x, and against the vmapped
  solve without history.

--quick: N = 64 quadratics of at most 1,000 steps, 8 Lotka-Volterra starts, 2 rounds: a smoke test.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import harness  # noqa: E402

D, KAPPA, THRESHOLD = 64, 1e3, 1e-6
FULL = dict(members=1024, steps=4000, lv_starts=64, lv_steps=100)
QUICK = dict(members=64, steps=1000, lv_starts=8, lv_steps=20)
ATOL = 1e-7          # optimistix's Cauchy tolerance (its steps are reported beside ours)
TARGETS = dict(quadratic=4.0, lv=2.0, lv_compile=1.5, one_member=0.95, same_stop=0.95, best_tile=1.1)
DEFAULT = "loopfuse, default tiles"


def quadratics(n: int, seed: int = 0, kappa=None):
    """(x0 [n, D], h [n, D]): h = kappa ** -linspace(0, 1, D), kappa log-uniform in 1..KAPPA (or `kappa`)."""
    rng = np.random.default_rng(seed)
    kappa = 10 ** rng.uniform(0, np.log10(KAPPA), n) if kappa is None else np.full(n, kappa)
    h = kappa[:, None] ** -np.linspace(0, 1, D)[None]
    return jnp.asarray(rng.normal(size=(n, D)), jnp.float32), jnp.asarray(h, jnp.float32)


def quadratic(x, h):
    return 0.5 * jnp.sum(h * x * x)


def below(params, loss):
    return loss < THRESHOLD


SGD = optax.sgd(1.0)


def vmapped(loss, opt, steps, until=None, own=True, history=True, line_search=False):
    """``jax.jit(jax.vmap(solve))``: (params, history [N, steps] or None, steps [N], code [N]: 0 ran out of
    steps, 1 converged, 2 non-finite); `until` takes ``previous_loss`` when named so."""
    takes_previous = until is not None and "previous_loss" in until.__code__.co_varnames

    def solve(p, data):
        f = lambda q: loss(q, data)       # noqa: E731

        def body(c):
            i, p, s, previous, h, _ = c
            v, g = jax.value_and_grad(f)(p)
            extra = dict(value=v, grad=g, value_fn=f) if line_search else {}
            u, s = opt.update(g, s, p, **extra)
            flag = False if until is None else until(p, v, **({"previous_loss": previous} if takes_previous else {}))
            code = jnp.where(~jnp.isfinite(v), 2, jnp.where(flag, 1, 0))
            return i + 1, optax.apply_updates(p, u), s, v, h.at[i].set(v) if history else h, code

        h0 = jnp.full(steps if history else 0, jnp.nan, jnp.float32)
        i, p, _, _, h, code = jax.lax.while_loop(lambda c: (c[0] < steps) & (c[-1] == 0), body,
                                                 (0, p, opt.init(p), jnp.float32(jnp.inf), h0, 0))
        return p, (h if history else None), i, code
    return jax.jit(jax.vmap(solve, in_axes=(0, 0 if own else None)))


def host(outputs):
    """The reference's outputs on the host, as minimize returns its history."""
    return jax.tree_util.tree_map(np.asarray, jax.block_until_ready(outputs))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def rounds(variants: dict, n: int) -> tuple[dict, dict]:
    """({name: [seconds per round]}, {name: the last round's output}) of interleaved rounds."""
    got = harness.interleave({k: (lambda f=f: timed(f)) for k, f in variants.items()}, n)
    return {k: [t for t, _ in v] for k, v in got.items()}, {k: v[-1][1] for k, v in got.items()}


def same_bits(a, b) -> bool:
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b))


def history_rel_diff(a, b) -> float:
    """The largest |a - b| / |b| over the entries of two loss histories (NaN where both are)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.nanmax(np.where(a == b, 0.0, np.abs(a - b) / np.abs(b)), initial=0.0))


def ms(values) -> str:
    return f"{statistics.median(values) * 1e3:,.1f} ms ({harness.spread_text([v * 1e3 for v in values], '{:,.1f}')})"


def s_(values) -> str:
    return f"{statistics.median(values):,.2f} s ({harness.spread_text(values, '{:,.2f}')})"


def table(times: dict, reference: str, notes: dict) -> list[str]:
    rows = ["| contender | whole call, median (min-max) | speed vs the vmapped reference | notes |", "|---|---:|---:|---|"]
    for name, t in times.items():
        ratio = "1.00x (reference)" if name == reference else harness.ratio_text(harness.compare(t, times[reference], False))
        rows.append(f"| {name} | {ms(t)} | {ratio} | {notes.get(name, '')} |")
    return rows


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x, target >= {target}x: {'met' if ratio >= target else 'MISSED'}"


def tile_sizes(n: int, every: bool) -> list[int]:
    """The fixed tiles compared: powers of 2 (`every`) or of 4 up to `n`, and `n`."""
    step = 2 if every else 4
    return sorted({*(step ** k for k in range(int(np.log(n) / np.log(step)) + 1)), n})


def default_tile(loss, params, data, optimizer, until) -> int:
    """The tile minimize's default picks for this solve (`Ensemble.tile_size` of its member step, which
    minimize keeps: the cost read here is the one the timed calls use)."""
    from loopfuse.drivers.ensemble import wrapper
    from loopfuse.drivers.solve import _program
    init, member = _program(loss, True, optimizer, loopfuse.CompiledLoop(), until)
    members, params, data = wrapper(True, params, "params", data)
    return loopfuse.Ensemble().tile_size(member.fn, members.init(init)(params, data), data)


def tiled(solve, tiles) -> dict:
    """{name: call} of `solve(ensemble)` with the default tiles and each fixed tile."""
    return {DEFAULT: lambda: solve(True),
            **{f"loopfuse, Ensemble(tile={t})": (lambda t=t: solve(loopfuse.Ensemble(tile=t))) for t in tiles}}


def default_note(out: dict, tile: int) -> str:
    """'tiles of T', and whether the default's outputs are bitwise those of ``Ensemble(tile=T)`` (the one
    program: a difference of their times is noise)."""
    fixed = out.get(f"loopfuse, Ensemble(tile={tile})")
    if fixed is None:
        return f"tiles of {tile}"
    same = same_bits(*((s.params, s.steps, s.loss_history) for s in (out[DEFAULT], fixed)))
    return f"tiles of {tile}, {'' if same else '**not** '}bitwise Ensemble(tile={tile})'s outputs"


def best_tile(times: dict, tiles, tile: int) -> dict:
    """The fixed tile of the lowest median (`best`); per round (`harness.paired_ratio`), the time of the
    default's tile over the best's (`over`, <= 1.1 the target: 1 when the default picked it) and the default's
    over its tile's, the same program (`noise`)."""
    name = "loopfuse, Ensemble(tile={})".format
    best = min(tiles, key=lambda t: statistics.median(times[name(t)]))
    chosen = times[name(tile)] if tile in tiles else times[DEFAULT]
    return dict(best=best, over=harness.paired_ratio(chosen, times[name(best)]),
                noise=harness.paired_ratio(times[DEFAULT], chosen) if tile in tiles else None)


def tile_verdict(tile: int, b: dict) -> str:
    met = b["over"]["ratio"] <= TARGETS["best_tile"]
    text = (f"the default tile ({tile}) against the best fixed tile ({b['best']}): "
            + ("the same" if tile == b["best"] else f"{harness.paired_text(b['over'])} its time per round")
            + f", target <= {TARGETS['best_tile']}x: {'met' if met else 'MISSED'}")
    if b["noise"] is not None:
        text += f" (the default's row against Ensemble(tile={tile})'s, one program: {harness.paired_text(b['noise'])})"
    return text


# ---- sections -------------------------------------------------------------------------------------
def quadratic_section(size: dict, n_rounds: int, tiles=()) -> tuple[str, dict]:
    """The quadratics: the default tiles, each of the fixed `tiles`, the references."""
    import optimistix as optx
    n, steps = size["members"], size["steps"]
    x0, h = quadratics(n)
    reference, no_history = vmapped(quadratic, SGD, steps, below), vmapped(quadratic, SGD, steps, below, history=False)
    solver = optx.GradientDescent(learning_rate=1.0, rtol=0.0, atol=ATOL)
    optimistix = jax.jit(jax.vmap(lambda y, a: (lambda s: (s.value, s.stats["num_steps"]))(
        optx.minimise(quadratic, solver, y, a, max_steps=steps, throw=False))))
    solve = lambda tile: loopfuse.minimize(quadratic, x0, loopfuse.per_member(h), SGD, steps, until=below,  # noqa: E731
                                           ensemble=tile)
    ref_name = "jax.jit(jax.vmap(while_loop)), the same outputs"
    variants = {**tiled(solve, tiles), ref_name: lambda: host(reference(x0, h)),
                "jax.jit(jax.vmap(while_loop)) without the history": lambda: host(no_history(x0, h)),
                "optimistix minimise(GradientDescent) under jax.vmap": lambda: host(optimistix(x0, h))}
    for f in variants.values():
        f()                                              # compile (and warm) every side
    times, out = rounds(variants, n_rounds)
    tile = default_tile(quadratic, x0, loopfuse.per_member(h), SGD, below)
    sol, (p, hist, i, _) = out[DEFAULT], out[ref_name]
    same_steps = same_bits((sol.params, sol.steps), (p, i))
    bitwise = same_steps and same_bits([sol.loss_history], [hist[:, :sol.steps.max()]])
    rel = history_rel_diff(sol.loss_history, hist[:, :sol.steps.max()]) if same_steps else float("nan")
    opt_steps = out["optimistix minimise(GradientDescent) under jax.vmap"][1]
    ratio = harness.compare(times[DEFAULT], times[ref_name], False)["ratio"]
    useful = sol.steps.sum() / (n * sol.steps.max())
    outputs = ("bitwise the reference's" if bitwise else f"params and steps bitwise the reference's, losses within {rel:.1e}"
               if same_steps else "**params or steps differ from the reference's**")
    notes = {DEFAULT: f"{default_note(out, tile)}; {outputs}",
             ref_name: "params, history [N, steps], steps",
             "jax.jit(jax.vmap(while_loop)) without the history": "params, steps (fewer outputs)",
             "optimistix minimise(GradientDescent) under jax.vmap": f"its own stop (atol {ATOL:g}): steps {int(opt_steps.min())}.."
                                                                   f"{int(opt_steps.max())}, median {np.median(opt_steps):.0f}; no history"}
    lines = [f"#### Quadratics: {n:,} members, D = {D}, stop at loss < {THRESHOLD:g}, at most {steps:,} steps\n",
             f"Steps per member {sol.steps.min()}..{sol.steps.max()} (median {np.median(sol.steps):.0f}, mean "
             f"{sol.steps.mean():.0f}): {useful:.0%} of a vmapped loop's member-steps are useful.\n",
             *table(times, ref_name, notes),
             f"\nloopfuse's default against the vmapped reference: {verdict(ratio, TARGETS['quadratic'])}"]
    results = dict(times=times, ratio=ratio, bitwise=bitwise, params_and_steps=same_steps, history_rel_diff=rel,
                   useful=useful, tile=tile, steps=dict(min=int(sol.steps.min()), max=int(sol.steps.max())))
    if tiles:
        b = best_tile(times, tiles, tile)
        lines[-1] += f"; {tile_verdict(tile, b)}"
        results.update(best_tile=b)
    return "\n".join(lines) + "\n", results


def lv_section(size: dict, n_rounds: int, compile_rounds: int, tiles) -> tuple[str, dict]:
    """The Lotka-Volterra fit's L-BFGS phase: the default tiles, each of the fixed `tiles`, the reference."""
    import multistart as ms
    import lotka_volterra as lv
    n, steps = size["lv_starts"], size["lv_steps"]
    data = lv.observations()
    adam = loopfuse.minimize(ms.loss, ms.starts(n), data, lv.ADAM, 300 if n == ms.STARTS else 50, ensemble=True)
    start = jnp.asarray(adam.params)
    solve = lambda tile: loopfuse.minimize(ms.loss, start, data, lv.LBFGS, steps, until=lv.UNTIL, ensemble=tile)  # noqa: E731
    reference = vmapped(ms.loss, lv.LBFGS, steps, lv.UNTIL, own=False, line_search=True)
    ref_name = "jax.jit(jax.vmap(while_loop))"
    variants = {**tiled(solve, tiles), ref_name: lambda: host(reference(start, data))}
    for f in variants.values():
        f()
    times, out = rounds(variants, n_rounds)
    tile = default_tile(ms.loss, start, data, lv.LBFGS, lv.UNTIL)
    p, hist, i, code = out[ref_name]
    best_ref = int(np.argmin([h[k - 1] for h, k in zip(hist, i)]))
    notes = {}
    for name in variants:
        if name != ref_name:
            sol = out[name]
            same = int(((sol.steps == i) & (np.asarray(sol.params) == p).all(1)).sum())
            theta = np.abs(np.exp(sol.params[sol.best]) / np.exp(p[best_ref]) - 1).max()
            notes[name] = (f"{same} of {n} bitwise the reference's params and steps; params within "
                           f"{np.abs(np.asarray(sol.params) - p).max():.1e}; best theta within {theta:.1e}")
    notes[DEFAULT] = f"{default_note(out, tile)}; {notes[DEFAULT]}"
    notes[ref_name] = f"steps {int(i.min())}..{int(i.max())}, median {np.median(i):.0f}"
    ratio = harness.compare(times[DEFAULT], times[ref_name], False)["ratio"]
    b = best_tile(times, tiles, tile)

    def compile_loopfuse():
        loss = harness.fresh_fn(ms.loss)          # a new loss object: minimize builds and compiles anew
        sol = loopfuse.minimize(loss, start, data, lv.LBFGS, steps, until=lv.UNTIL, ensemble=True)
        return None, {"xla": sol.compile_seconds}

    builds = {DEFAULT: compile_loopfuse, ref_name: lambda: _jit_compile(ms.loss, steps, start, data)}
    compiled = harness.compile_rounds(builds, compile_rounds)
    seconds = {k: [p.get("xla", 0.0) + p.get("trace", 0.0) for p in v["parts"]] for k, v in compiled.items()}
    compile_ratio = statistics.median(seconds[DEFAULT]) / statistics.median(seconds[ref_name])
    lines = [f"#### Lotka-Volterra, {n} starts: L-BFGS from the Adam phase, ftol(rtol=1e-6), at most {steps} steps\n",
             *table(times, ref_name, notes),
             "", "| compile | seconds, median (min-max) |", "|---|---:|",
             *[f"| {k} | {s_(v)} |" for k, v in seconds.items()],
             f"\nloopfuse's default against the vmapped reference: {verdict(ratio, TARGETS['lv'])}; "
             f"{tile_verdict(tile, b)}. Compile, loopfuse / jax.jit: {compile_ratio:.2f}x, target <= "
             f"{TARGETS['lv_compile']}x: {'met' if compile_ratio <= TARGETS['lv_compile'] else 'MISSED'}"]
    return "\n".join(lines) + "\n", dict(times=times, ratio=ratio, tile=tile, best_tile=b, compile_seconds=seconds,
                                         compile_ratio=compile_ratio)


def _jit_compile(loss, steps, start, data):
    """jax.jit(jax.vmap(solve)) of a fresh loss object, lowered and compiled: (None, {"trace", "xla"})."""
    import lotka_volterra as lv
    fn = vmapped(harness.fresh_fn(loss), lv.LBFGS, steps, lv.UNTIL, own=False, line_search=True)
    t0 = time.perf_counter()
    lowered = fn.lower(start, data)
    t1 = time.perf_counter()
    lowered.compile()
    return None, {"trace": t1 - t0, "xla": time.perf_counter() - t1}


def overhead_section(size: dict, n_rounds: int) -> tuple[str, dict]:
    n, steps = size["members"], size["steps"]
    x0, h = quadratics(1, seed=1, kappa=min(KAPPA, steps / 4))
    p0, h0 = x0[0], h[0]                # the member's own arrays, made before the rounds
    one = {"plain minimize": lambda: loopfuse.minimize(quadratic, p0, h0, SGD, steps, until=below),
           "1-member ensemble": lambda: loopfuse.minimize(quadratic, x0, loopfuse.per_member(h), SGD, steps, until=below,
                                                          ensemble=True)}
    for f in one.values():
        f()
    one_times, one_out = rounds(one, n_rounds)
    one_ratio = harness.compare(one_times["1-member ensemble"], one_times["plain minimize"], False)["ratio"]
    one_bitwise = same_bits((one_out["1-member ensemble"].params[0], one_out["1-member ensemble"].loss_history[0]),
                            (one_out["plain minimize"].params, one_out["plain minimize"].loss_history))

    xs, hs = jnp.tile(x0, (n, 1)), jnp.tile(h, (n, 1))
    reference, no_history = vmapped(quadratic, SGD, steps, below), vmapped(quadratic, SGD, steps, below, history=False)
    same = {"loopfuse minimize(ensemble=True)": lambda: loopfuse.minimize(quadratic, xs, loopfuse.per_member(hs), SGD, steps,
                                                                          until=below, ensemble=True),
            "jax.jit(jax.vmap(while_loop)), the same outputs": lambda: host(reference(xs, hs)),
            "jax.jit(jax.vmap(while_loop)) without the history": lambda: host(no_history(xs, hs))}
    for f in same.values():
        f()
    same_times, same_out = rounds(same, n_rounds)
    sol = same_out["loopfuse minimize(ensemble=True)"]
    ratio = harness.compare(same_times["loopfuse minimize(ensemble=True)"],
                            same_times["jax.jit(jax.vmap(while_loop)), the same outputs"], False)["ratio"]
    bare = harness.compare(same_times["loopfuse minimize(ensemble=True)"],
                           same_times["jax.jit(jax.vmap(while_loop)) without the history"], False)["ratio"]
    lines = ["#### Overheads\n",
             f"One member (a quadratic of condition number {min(KAPPA, steps / 4):g}, {one_out['plain minimize'].steps} steps): "
             f"plain minimize {ms(one_times['plain minimize'])}, 1-member ensemble {ms(one_times['1-member ensemble'])}: "
             f"{verdict(one_ratio, TARGETS['one_member'])}; bitwise the plain solve: {one_bitwise}\n",
             f"{n:,} copies of that quadratic (every member stops at step {int(sol.steps[0])}: nothing to compact):\n",
             *table(same_times, "jax.jit(jax.vmap(while_loop)), the same outputs", {}),
             f"\nAgainst the vmapped reference: {verdict(ratio, TARGETS['same_stop'])}; against the vmapped solve "
             f"without the history (fewer outputs): {bare:.2f}x"]
    return "\n".join(lines) + "\n", dict(one_member=dict(times=one_times, ratio=one_ratio, bitwise=one_bitwise),
                                         same_stop=dict(times=same_times, ratio=ratio, vs_no_history=bare))


def main():
    ap = harness.parser(__doc__, rounds=5, compile_rounds=2)
    ap.add_argument("--every-tile", action="store_true", help="every power of 2 as a fixed tile (default: powers of 4)")
    args = ap.parse_args()
    size = QUICK if args.quick else FULL
    n_rounds, c_rounds = (2, 1) if args.quick else (args.rounds, args.compile_rounds)
    harness.no_compile_cache()
    out = harness.Report("ensemble", args)
    for name, section in (("quadratic", lambda: quadratic_section(size, n_rounds, tile_sizes(size["members"], args.every_tile))),
                          ("overhead", lambda: overhead_section(size, n_rounds)),
                          ("lotka_volterra", lambda: lv_section(size, n_rounds, c_rounds,
                                                                tile_sizes(size["lv_starts"], args.every_tile)))):
        text, results = section()
        out.section(text, **{name: results})
        out.save()
    out.write()


if __name__ == "__main__":
    main()
