"""A memory limit as the interface (issue 39, items 2 and 3): the plan `compile_step(..., memory_limit=L)`
chooses on issue 31's GPT against a hand sweep of budgets x micro-batches, a sweep of limits, `largest_batch`,
and a model with batch norm (figure "memory_limit").

    python bench/bench_memory_limit.py [--batch 128] [--limit 512MiB] [--limits 6] [--rounds 3] [--calls 1]
                                       [--sections plan hand limits largest bn] [--quick]

The GPT is tests/py/transformer.py's (8 blocks, width 256, 8 heads, 128 tokens, vocab 512, AdamW) at
`--batch`; every variant runs one step per call, the state donated. Peaks are XLA's compiled figures
(arguments + outputs - aliased + temporaries); jax.jit's from ``jax.jit(step, donate_argnums=0)``.

- plan: the choice under `--limit` (its report, its compiles and seconds), the loss after 3 steps against
  jax.jit's whole-batch step (relative).
- hand: every plan of budgets 1.0, 0.5, 0.0 (and the chosen plan's) x micro-batches 1, 2, 4, ... `--batch` that the compiler takes,
  compiled (peak); steps/s of those that fit the limit, in `--rounds` interleaved rounds of `--calls` calls;
  the chosen plan's rate against the fastest that fits (the target: >= 0.9x).
- limits: `--limits` limits from the floor (the least peak of any plan, from the MemoryLimitError of a
  limit of 1 byte) to jax.jit's peak, geometric, and one below the floor: the plan each fresh compile_step
  chooses, its peak (<= the limit, never rising as it falls), its compiles; the programs shared by the
  compile cache (a temporary folder: a program compiled for one limit loads for the next).
- largest: `largest_batch` under `--limit`: the batch, its plan, the least peak at each size probed (the
  next power of two over the limit), the compiles.
- bn: a residual MLP with batch norm in every layer (8 layers of 64, 4096 rows, Adam) under half its traced
  peak and under a tenth: micro-batches declined with the op's line, the limit met by remat or the floor error.

The plan and hand sections compile the full-size GPT many times (tens of seconds each on 2 cores): a full
run takes about an hour on a quiet machine; --sections picks parts, --quick shrinks everything.
"""
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import transformer  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import validate  # noqa: E402
from loopfuse.compile import compiler  # noqa: E402
from loopfuse.memory import memory_plan  # noqa: E402
from loopfuse.memory.memory_report import size_text  # noqa: E402

STEPS = 3                   # steps before the loss is compared
SECTIONS = ("plan", "hand", "limits", "largest", "bn")
HAND_BUDGETS = (1.0, 0.5, 0.0)


def keep_loss(fn):
    def only_loss(s, b):
        new, aux = fn(s, b)
        return new, {"loss": aux["loss"]}
    return only_loss


def loss_after(call, state, batch) -> float:
    s = fresh(state)
    for _ in range(STEPS):
        s, aux = call(s, batch)
    return float(aux["loss"])


def jit_peak(step, state, batch) -> int:
    return harness.jit_memory(jax.jit(step, donate_argnums=0), state, batch).peak


def plan_section(out, ns, step, state, batch, limit: int, cache) -> dict:
    t0 = time.perf_counter()
    call = loopfuse.compile_step(harness.fresh_fn(step), memory_limit=limit, cache_dir=cache)
    executable = call.compiled(fresh(state), batch)
    seconds = time.perf_counter() - t0
    plan = executable.memory_plan
    jit = jit_peak(step, state, batch)
    reference = loss_after(jax.jit(step, donate_argnums=0), state, batch)
    loss = loss_after(call, state, batch)
    diff = abs(loss - reference) / abs(reference)
    out.section("\n".join([
        f"### The plan under {size_text(limit)}", "",
        f"Chosen in {seconds:.1f} s ({plan.compiles} programs compiled): **{plan.chosen}**, compiled peak "
        f"{size_text(plan.stats.peak)} against jax.jit's {size_text(jit)} ({plan.stats.peak / jit:.2f}x); the loss after "
        f"{STEPS} steps {diff:.1e} relative to jax.jit's whole-batch step.", "", "```", str(plan), "```"]),
        plan=dict(limit=limit, chosen=str(plan.chosen), peak=plan.stats.peak, predicted=plan.predicted, jit_peak=jit,
                  compiles=plan.compiles, seconds=seconds, loss=loss, jit_loss=reference, loss_rel_diff=diff))
    return dict(call=call, plan=plan, jit=jit)


def hand_section(out, ns, step, state, batch, limit: int, chosen, cache) -> None:
    counts = [1] + [m for m in compiler.slice_counts(batch, None) if m & (m - 1) == 0]
    peaks, calls = {}, {}
    budgets = sorted({*HAND_BUDGETS, chosen["plan"].chosen.budget}, reverse=True)   # the chosen plan timed too
    for b in budgets:
        for m in counts:
            c = memory_plan.Candidate(b, m)
            budget, slices = (None if b >= 1.0 else b), (None if m == 1 else m)
            call = loopfuse.compile_step(harness.fresh_fn(step), memory_budget=budget, micro_batches=slices,
                                         cache_dir=cache)
            peaks[c] = call.memory_stats(fresh(state), batch).peak
            if peaks[c] <= limit:
                calls[c] = call
            out.save()
    chosen_plan = chosen["plan"].chosen
    names = {c: str(c) for c in calls}
    states = {names[c]: fresh(state) for c in calls}
    measured, cpu = harness.step_rates({names[c]: calls[c] for c in calls}, states, batch, ns.rounds, ns.calls)
    fastest = max(measured, key=lambda n: np.median(measured[n]))
    least_cpu = min(cpu, key=lambda n: np.median(cpu[n]))
    lines = [f"### The hand sweep: budgets {', '.join(f'{b:g}' for b in budgets)} x micro-batches "
             f"{', '.join(map(str, counts))} (the compiler's combinations)", "",
             f"Steps/s: medians (min–max) of {ns.rounds} interleaved rounds of {ns.calls} call(s), for the plans "
             f"that fit {size_text(limit)}.", "",
             "| plan | compiled peak | fits | steps/s | vs the fastest that fits | CPU s per step | vs the least |",
             "|---|---:|---|---:|---:|---:|---:|"]
    rows = {}
    for c, peak in peaks.items():
        n = names.get(c)
        rate = f"{np.median(measured[n]):.3f} ({harness.spread_text(measured[n], '{:.3f}')})" if n else "—"
        vs = harness.ratio_text(harness.compare(measured[n], measured[fastest], True)) if n and n != fastest else (
            "fastest" if n else "—")
        work = f"{np.median(cpu[n]):.1f} ({harness.spread_text(cpu[n], '{:.1f}')})" if n else "—"
        vs_cpu = f"{np.median(cpu[least_cpu]) / np.median(cpu[n]):.2f}x" if n else "—"
        lines.append(f"| {c}{' (chosen)' if c == chosen_plan else ''} | {size_text(peak)} | {'yes' if n else 'no'} | "
                     f"{rate} | {vs} | {work} | {vs_cpu} |")
        rows[str(c)] = dict(peak=peak, fits=bool(n), steps_per_s=harness.summary(measured[n]) if n else None,
                            cpu_s_per_step=harness.summary(cpu[n]) if n else None)
    chosen_name = str(chosen_plan)
    ratio = np.median(measured[chosen_name]) / np.median(measured[fastest]) if chosen_name in measured else None
    work = np.median(cpu[least_cpu]) / np.median(cpu[chosen_name]) if chosen_name in cpu else None
    lines += ["", f"The chosen plan ({chosen_plan}) against the fastest that fits ({fastest}): "
              + (f"{ratio:.2f}x of its median rate (target >= 0.9x); by CPU seconds per step, {work:.2f}x of the "
                 f"least ({least_cpu})." if ratio is not None else "not timed.")]
    out.section("\n".join(lines), hand=dict(rows=rows, fastest=fastest, chosen_vs_fastest=ratio, least_cpu=least_cpu,
                                             chosen_vs_least_cpu=work))


def limits_section(out, ns, step, state, batch, jit: int, cache) -> None:
    try:
        loopfuse.compile_step(harness.fresh_fn(step), memory_limit=1, cache_dir=cache).compiled(fresh(state), batch)
        raise AssertionError("a limit of 1 byte was met")
    except loopfuse.MemoryLimitError as e:
        floor = e.floor
    n = ns.limits
    limits = [int(floor * (jit / floor) ** (i / (n - 1))) for i in reversed(range(n))] + [floor - 1]
    lines = [f"### A sweep of limits from jax.jit's peak ({size_text(jit)}) to the floor ({size_text(floor)}) and "
             "below it", "", "Each a fresh `compile_step(..., memory_limit=L)` (the compile cache shared: a program "
             "compiled for one limit loads for the next).", "",
             "| limit | chosen plan | compiled peak | <= limit | programs compiled or loaded | seconds |",
             "|---:|---|---:|---|---:|---:|"]
    rows, previous = [], None
    for limit in limits:
        t0 = time.perf_counter()
        try:
            ex = loopfuse.compile_step(harness.fresh_fn(step), memory_limit=limit, cache_dir=cache).compiled(
                fresh(state), batch)
        except loopfuse.MemoryLimitError as e:
            seconds = time.perf_counter() - t0
            lines.append(f"| {size_text(limit)} | MemoryLimitError: floor {size_text(e.floor)} ({e.plan}) | — | — | — | "
                         f"{seconds:.1f} |")
            rows.append(dict(limit=limit, error=str(e).splitlines()[0], floor=e.floor))
            continue
        seconds = time.perf_counter() - t0
        plan = ex.memory_plan
        lines.append(f"| {size_text(limit)} | {plan.chosen} | {size_text(plan.stats.peak)} | "
                     f"{plan.stats.peak <= limit} | {plan.compiles} | {seconds:.1f} |")
        rows.append(dict(limit=limit, chosen=str(plan.chosen), peak=plan.stats.peak, compiles=plan.compiles,
                         seconds=seconds, monotone=previous is None or plan.stats.peak <= previous))
        previous = plan.stats.peak
        out.save()
    fits = [r for r in rows if "peak" in r]
    ok = all(r["peak"] <= r["limit"] and r["monotone"] for r in fits) and "error" in rows[-1]
    lines += ["", f"Every peak within its limit and never rising as the limit falls, the error below the floor: {ok}."]
    out.section("\n".join(lines), limits=dict(floor=floor, jit_peak=jit, rows=rows, ok=ok))


def largest_section(out, ns, spec, step, state, limit: int) -> None:
    t0 = time.perf_counter()
    fit = loopfuse.largest_batch(harness.fresh_fn(step), state,
                                 lambda n: transformer.tokens(spec["seq"], n, spec["vocab"]), memory_limit=limit,
                                 max_batch=ns.max_batch)
    seconds = time.perf_counter() - t0
    n = fit.batch_size
    twice = fit.probes.get(2 * n)
    out.section("\n".join([
        f"### `largest_batch` under {size_text(limit)} (max_batch {ns.max_batch})", "",
        f"Batch **{n}** with {fit.plan.chosen} (compiled peak {size_text(fit.plan.stats.peak)}); the least peak at "
        f"{2 * n}: {size_text(twice) if twice else '— (max_batch)'}; {fit.compiles} programs compiled, {seconds:.1f} s.",
        "", "Least peak at each batch size probed: " + ", ".join(f"{b}: {size_text(p)}" for b, p in sorted(fit.probes.items())),
        "", "```", str(fit.plan), "```"]),
        largest=dict(batch=n, plan=str(fit.plan.chosen), peak=fit.plan.stats.peak, twice_least_peak=twice,
                     probes=fit.probes, compiles=fit.compiles, seconds=seconds))


def bn_problem(quick: bool):
    layers, width, rows = (4, 16, 256) if quick else (8, 64, 4096)
    rng = np.random.default_rng(0)
    p = {"w_in": rng.normal(size=(8, width)) / 3, "w_out": rng.normal(size=(width, 1)) / width**0.5,
         "layers": [{"w": rng.normal(size=(width, width)) / width**0.5, "b": np.zeros(width)} for _ in range(layers)]}
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p)
    opt = optax.adam(1e-3)

    def loss(p, batch):
        x = jnp.tanh(batch["x"] @ p["w_in"])
        for layer in p["layers"]:
            h = x @ layer["w"] + layer["b"]
            x = x + jnp.tanh((h - h.mean(0)) * lax.rsqrt(h.var(0) + 1e-5))
        return jnp.mean((x @ p["w_out"] - batch["y"]) ** 2)

    batch = {"x": rng.normal(size=(rows, 8)).astype(np.float32), "y": rng.normal(size=(rows, 1)).astype(np.float32)}
    return transformer.optax_step(loss, opt), (p, opt.init(p)), batch


def bn_section(out, ns) -> None:
    step, state, batch = bn_problem(ns.quick)
    traced = loopfuse.compile_step(step).memory_stats(fresh(state), batch).peak
    lines = [f"### Batch norm in every layer: the step as traced {size_text(traced)}", ""]
    rows = {}
    for share in (0.5, 0.1):
        limit = int(share * traced)
        try:
            ex = loopfuse.compile_step(harness.fresh_fn(step), memory_limit=limit).compiled(fresh(state), batch)
            text = ex.reports["memory-limit"]
            rows[share] = dict(limit=limit, chosen=str(ex.memory_plan.chosen), peak=ex.memory.peak)
        except loopfuse.MemoryLimitError as e:
            text = str(e)
            rows[share] = dict(limit=limit, error=text.splitlines()[0], floor=e.floor)
        lines += [f"Under {size_text(limit)} ({share:g} of it):", "", "```", text, "```", ""]
    out.section("\n".join(lines), bn=rows)


def main() -> None:
    ap = harness.parser(__doc__, rounds=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--limit", default="512MiB")
    ap.add_argument("--limits", type=int, default=6, help="limits in the sweep (from the floor to jax.jit's peak)")
    ap.add_argument("--calls", type=int, default=1, help="calls of one step per round")
    ap.add_argument("--max-batch", type=int, default=2**12, help="largest_batch's max_batch")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ns = ap.parse_args()
    spec = dict(transformer.ISSUE, batch=ns.batch)
    if ns.quick:
        spec = dict(transformer.TINY, seq=64, batch=16)
        vars(ns).update(rounds=1, calls=1, limits=3, limit=ns.limit if ns.limit != "512MiB" else "3MiB", max_batch=256)
    out = harness.Report("memory_limit", ns)
    harness.no_compile_cache()
    step, state, batch = transformer.gpt(**spec)
    step = keep_loss(step)
    limit = validate.memory_limit(ns.limit)
    out.section(f"GPT {spec['layers']} blocks of width {spec['width']}, {spec['batch']} x {spec['seq']} tokens, AdamW"
                f"{' (--quick: tiny)' if ns.quick else ''}; limit {size_text(limit)}; peaks are XLA's compiled "
                "arguments + outputs - aliased + temporaries.")
    with tempfile.TemporaryDirectory(prefix="bench-memory-limit-") as cache:
        chosen = None
        if {"plan", "hand"} & set(ns.sections):
            chosen = plan_section(out, ns, step, state, batch, limit, cache)
            out.save()
        if "hand" in ns.sections:
            hand_section(out, ns, step, state, batch, limit, chosen, cache)
            out.save()
        if "limits" in ns.sections:
            limits_section(out, ns, step, state, batch, chosen["jit"] if chosen else jit_peak(step, state, batch), cache)
            out.save()
    if "largest" in ns.sections:
        largest_section(out, ns, spec, step, state, limit)
        out.save()
    if "bn" in ns.sections:
        bn_section(out, ns)
    out.write()


if __name__ == "__main__":
    main()
