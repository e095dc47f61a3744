"""Steps/second, peak memory and compile time of one Adam-trained MLP, run every way side by side.

    python bench/bench_loop.py [--quick] [--out bench/out]

Per size (tiny: dispatch bound ... large: compute bound) it times jax.jit per step (with and
without donation), a hand-written lax.fori_loop of K steps in one jit, loopfuse per step,
loopfuse `.loop(K)`, PyTorch eager and, when present, `loopfuse.minimize` with each backend.
Every variant trains the same problem (fixed synthetic batch, optax.adam(1e-3)); ratios are
against jax.jit + donation measured in the same run. A memory section compares the peak
bytes of one Adam step on an 8-layer 1024x1024 MLP. Writes results.md and results.json.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

try:
    import torch
except ImportError:  # the PyTorch rows are skipped
    torch = None

K = 100  # steps per device loop (fori_loop, loopfuse .loop, CompiledLoop)
OPT = optax.adam(1e-3)
# steps: timed steps per round (a multiple of K); `repeats` rounds, medians reported.
# torch_threads: one thread for small matrices (more only adds OpenMP barriers), all cores for large.
SIZES = {
    "tiny": dict(layers=(8, 16, 1), batch=16, steps=2000, repeats=7, torch_threads=1),
    "medium": dict(layers=(64, 256, 1), batch=128, steps=1000, repeats=7, torch_threads=1),
    "large": dict(layers=(512, 2048, 1), batch=512, steps=100, repeats=7, torch_threads=os.cpu_count()),
}
QUICK = dict(k=10, steps=20, repeats=1)  # --quick: a smoke test, not a measurement
MEMORY_PROBLEM = dict(layers=(1024,) * 9, batch=64)  # 8 weight layers of 1024x1024
TARGETS = {"tiny": 10.0, "medium": 1.5, "large": 1.0}  # loopfuse loop / jit+donation
FORI_TARGET = 0.95                                     # loopfuse loop / fori_loop, every size
MEMORY_TARGET = 0.6                                    # loopfuse step peak / jit (no donation) peak
BASELINE, LOOP, FORI = "jax.jit + donation", "loopfuse .loop(K)", "jax fori_loop(K) in jit"


# ---- the problem ---------------------------------------------------------------------------
def init_params(layers, seed=0):
    keys = jax.random.split(jax.random.key(seed), len(layers) - 1)
    return [{"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
            for k, a, b in zip(keys, layers[:-1], layers[1:])]


def mlp(params, x):
    for p in params[:-1]:
        x = jnp.tanh(x @ p["w"] + p["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean((mlp(params, x) - y) ** 2)


def train_step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": loss}


def fori_train(state, batch, steps):
    """K steps in one jit, the way one writes it by hand: state and a [K] loss history carried."""
    def body(i, carry):
        state, losses = carry
        state, aux = train_step(state, batch)
        return state, losses.at[i].set(aux["loss"])
    state, losses = jax.lax.fori_loop(0, steps, body, (state, jnp.zeros(steps, jnp.float32)))
    return state, {"loss": losses}


def make_batch(layers, batch, seed=1):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (batch, layers[0]))
    w = jax.random.normal(kw, (layers[0], layers[-1])) / np.sqrt(layers[0])
    return x, jnp.sin(x @ w)


def init_state(layers):
    params = init_params(layers)
    return params, OPT.init(params)


# ---- variants: each is a runner, built (compiled, warmed up) once, then timed in rounds ----
def timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


class StepRunner:
    """A ``call(state, batch) -> (state, aux)`` variant running `per_call` steps per call.

    Built: first call (trace + compile + run) timed, then one warm-up call. The state is kept
    between timed runs (donating variants consume it), so every run continues training.
    """

    def __init__(self, name, call, init, batch, per_call=1, memory=None, compiles=True):
        self.name, self.call, self.batch, self.per_call, self.memory, self.compiles = (
            name, call, batch, per_call, memory, compiles)
        state = init()
        (state, aux), self.first_call_s = timed(lambda: call(state, batch))
        self.first_loss = np.asarray(aux["loss"]).tolist()
        self.state, self.aux = jax.block_until_ready(call(state, batch))

    def run(self, steps) -> float:
        state, calls = self.state, max(1, steps // self.per_call)
        t0 = time.perf_counter()
        for _ in range(calls):
            state, aux = self.call(state, self.batch)
        jax.block_until_ready((state, aux))
        self.state, self.aux = state, aux
        return calls * self.per_call / (time.perf_counter() - t0)

    def info(self, steps_per_s) -> dict:
        mem = self.memory(self.state, self.batch) if self.memory else None
        stages = self.call.compiled(self.state, self.batch).seconds if isinstance(self.call, loopfuse.Step) else None
        return dict(compile_s=self.first_call_s - self.per_call / steps_per_s if self.compiles else None,
                    first_call_s=self.first_call_s, compile_stages_s=stages, memory=mem,
                    first_loss=self.first_loss, final_loss=float(np.asarray(self.aux["loss"]).reshape(-1)[-1]))


class MinimizeRunner:
    """``loopfuse.minimize(..., backend=...)``: each run is a fresh solve; its Solution's
    steps_per_second (loop only) and compile_seconds are what it reports."""

    def __init__(self, name, backend, layers, batch, k):
        self.name, self.backend, self.layers, self.batch = name, backend, layers, batch
        self.run(k)  # warm-up, and a probe: a failure here becomes a 'failed' row
        self.first_compile_s = self.compile_s

    def run(self, steps) -> float:
        sol = loopfuse.minimize(loss_fn, init_params(self.layers), self.batch, optimizer=OPT, steps=steps,
                                backend=self.backend)
        self.compile_s = sol.compile_seconds
        self.final_loss = float(sol.loss_history[-1])
        return sol.steps_per_second

    def info(self, steps_per_s) -> dict:
        return dict(compile_s=self.first_compile_s, final_loss=self.final_loss,
                    note="Solution.steps_per_second; compile = first solve's compile_seconds")


def jit_memory(jitted):
    def stats(state, batch):
        m = jitted.lower(state, batch).compile().memory_analysis()
        return loopfuse.MemoryStats(m.argument_size_in_bytes, m.output_size_in_bytes,
                                    m.alias_size_in_bytes, m.temp_size_in_bytes)
    return stats


def jax_runners(layers, batch_size, k) -> list:
    batch, init = make_batch(layers, batch_size), partial(init_state, layers)
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    loop = step.loop(k)
    jitted = [("jax.jit per step", jax.jit(train_step), 1),
              (BASELINE, jax.jit(train_step, donate_argnums=0), 1),  # arg 0 = (params, opt_state)
              (FORI, jax.jit(partial(fori_train, steps=k), donate_argnums=0), k)]
    return ([StepRunner(name, f, init, batch, n, jit_memory(f)) for name, f, n in jitted]
            + [StepRunner("loopfuse per step", step, init, batch, 1, step.memory_stats),
               StepRunner(LOOP, loop, init, batch, k, loop.memory_stats)])


def torch_runner(layers, batch_size, threads) -> StepRunner:
    x, y = (torch.tensor(np.asarray(a)) for a in make_batch(layers, batch_size))

    def init():
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        mods = []
        for a, b in zip(layers[:-1], layers[1:]):
            mods += [torch.nn.Linear(a, b), torch.nn.Tanh()]
        model = torch.nn.Sequential(*mods[:-1])
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # fastest CPU Adam

    def call(state, batch):
        model, opt = state
        opt.zero_grad(set_to_none=True)
        loss = torch.mean((model(batch[0]) - batch[1]) ** 2)
        loss.backward()
        opt.step()
        return state, {"loss": loss.detach()}

    return StepRunner("PyTorch eager (Adam fused)", call, init, (x, y), compiles=False)


def minimize_runners(layers, batch_size, k) -> tuple[list, list]:
    """Runners for loopfuse.minimize with each backend when the module has them; rows for failures."""
    backends, names = getattr(loopfuse, "backends", None), ("GradOnly", "CompiledStep", "CompiledLoop")
    if not hasattr(loopfuse, "minimize") or not all(hasattr(backends, n) for n in names):
        return [], [dict(name="loopfuse.minimize", steps_per_s=None, note="skipped: not in this loopfuse")]
    runners, failed = [], []
    for name in names:
        label = f"loopfuse.minimize {name}" + ("(steps=K)" if name == "CompiledLoop" else "()")
        try:
            backend = getattr(backends, name)(**({"steps": k} if name == "CompiledLoop" else {}))
            runners.append(MinimizeRunner(label, backend, layers, make_batch(layers, batch_size), k))
        except Exception as e:  # an API still in flux: report instead of failing the run
            failed.append(dict(name=label, steps_per_s=None,
                               note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"))
    return runners, failed


def measure(runners, steps: int, repeats: int) -> list:
    """Time every runner once per round, round-robin, so a drift in machine load hits all alike.

    steps/s: median over rounds. vs_baseline: median over rounds of the ratio to jit + donation
    in the same round (more robust on a shared machine than a ratio of medians).
    """
    rates = {r.name: [] for r in runners}
    for _ in range(repeats):
        for r in runners:
            rates[r.name].append(r.run(steps))
    rows = []
    for r in runners:
        sps = statistics.median(rates[r.name])
        info = r.info(sps)
        mem = info.pop("memory", None)
        rows.append(dict(name=r.name, steps_per_s=sps, repeats=rates[r.name], note=info.pop("note", ""),
                         vs_baseline=paired(rates[r.name], rates[BASELINE]),
                         peak_bytes=mem.peak if mem else None,
                         memory=None if mem is None else dict(argument=mem.argument, output=mem.output,
                                                              alias=mem.alias, temp=mem.temp), **info))
    return rows


def paired(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


# ---- reporting -----------------------------------------------------------------------------
def fmt(x, spec="{:,.0f}"):
    return "—" if x is None else spec.format(x)


def kib(n):
    return "—" if n is None else (f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB")


def size_table(name, spec, rows, steps, repeats) -> str:
    head = (f"### {name}: MLP {'-'.join(map(str, spec['layers']))}, batch {spec['batch']} "
            f"({repeats} rounds of {steps} steps)\n\n"
            "| variant | steps/s (median) | rounds min–max | vs jit+donation | compile (s) | peak memory | note |\n"
            "|---|---:|---:|---:|---:|---:|---|\n")
    first = {r["name"]: np.asarray(r.get("first_loss")) for r in rows}
    agree = np.max(np.abs(first[FORI] - first[LOOP]) / np.maximum(np.abs(first[FORI]), 1e-30))
    spread = lambda r: f"{min(r['repeats']):,.0f}–{max(r['repeats']):,.0f}" if r.get("repeats") else "—"
    return head + "".join(
        f"| {r['name']} | {fmt(r['steps_per_s'])} | {spread(r)} | {fmt(r.get('vs_baseline'), '{:.2f}x')} "
        f"| {fmt(r.get('compile_s'), '{:.2f}')} | {kib(r.get('peak_bytes'))} | {r.get('note', '')} |\n"
        for r in rows) + (
        f"\nSame computation: the first K-step loss histories of fori_loop and loopfuse .loop(K) differ by "
        f"at most {agree:.1e} (relative).\n")


def targets(results) -> list:
    out = []
    for size, rows in results.items():
        rounds = {r["name"]: r.get("repeats") for r in rows}
        out.append(target(f"{size}: loopfuse loop / jit+donation", paired(rounds[LOOP], rounds[BASELINE]),
                          TARGETS[size], ">="))
        out.append(target(f"{size}: loopfuse loop / fori_loop", paired(rounds[LOOP], rounds[FORI]),
                          FORI_TARGET, ">="))
    return out


def target(what, value, goal, op) -> dict:
    met = value >= goal if op == ">=" else value <= goal
    return dict(what=what, value=value, target=f"{op} {goal:g}x", met=met,
                margin=(value / goal - 1) if op == ">=" else (goal / value - 1))


def target_table(ts) -> str:
    return ("| target | measured | goal | result | margin |\n|---|---:|---:|---|---:|\n" + "".join(
        f"| {t['what']} | {t['value']:.2f}x | {t['target']} | {'PASS' if t['met'] else 'MISS'} "
        f"| {t['margin']:+.1%} |\n" for t in ts))


def memory_section(k) -> tuple[str, list, dict]:
    layers, bsz = MEMORY_PROBLEM["layers"], MEMORY_PROBLEM["batch"]
    state, batch = init_state(layers), make_batch(layers, bsz)
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    stats = [("jax.jit (no donation)", jit_memory(jax.jit(train_step))(state, batch)),
             ("jax.jit + donation", jit_memory(jax.jit(train_step, donate_argnums=0))(state, batch)),
             ("loopfuse compile_step (donating)", step.memory_stats(state, batch)),
             ("jax fori_loop(K) + donation",
              jit_memory(jax.jit(partial(fori_train, steps=k), donate_argnums=0))(state, batch)),
             ("loopfuse .loop(K) (donating)", step.loop(k).memory_stats(state, batch))]
    base = stats[0][1].peak
    rows = [dict(name=n, peak_bytes=m.peak, argument=m.argument, output=m.output, alias=m.alias, temp=m.temp,
                 vs_jit=m.peak / base) for n, m in stats]
    t = target("memory: loopfuse step / jit (no donation)", rows[2]["vs_jit"], MEMORY_TARGET, "<=")
    md = (f"### Adam step, MLP {len(layers) - 1} x {layers[0]}x{layers[1]}, batch {bsz}\n\n"
          "| executable | argument | output | alias | temp | peak | vs jit (no donation) |\n"
          "|---|---:|---:|---:|---:|---:|---:|\n" + "".join(
              f"| {r['name']} | {kib(r['argument'])} | {kib(r['output'])} | {kib(r['alias'])} | {kib(r['temp'])} "
              f"| {kib(r['peak_bytes'])} | {r['vs_jit']:.2f}x |\n" for r in rows))
    return md, rows, t


def machine() -> dict:
    import jaxlib
    models = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")] \
        if os.path.exists("/proc/cpuinfo") else []
    return dict(cpu=models[0] if models else platform.processor(), cores=len(os.sched_getaffinity(0)),
                device=str(jax.devices()[0]), python=platform.python_version(), jax=jax.__version__,
                jaxlib=jaxlib.__version__, optax=optax.__version__, torch=torch.__version__ if torch else None,
                date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                loadavg_1min_start=round(os.getloadavg()[0], 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny step counts: a smoke test, not a measurement")
    ap.add_argument("--out", default="bench/out", type=Path)
    args = ap.parse_args()
    t_start, info, results, md = time.perf_counter(), machine(), {}, []
    k = QUICK["k"] if args.quick else K
    for size, spec in SIZES.items():
        steps, repeats = (QUICK["steps"], QUICK["repeats"]) if args.quick else (spec["steps"], spec["repeats"])
        runners, skipped = jax_runners(spec["layers"], spec["batch"], k), []
        if torch is not None:
            runners.append(torch_runner(spec["layers"], spec["batch"], spec["torch_threads"]))
        else:
            skipped.append(dict(name="PyTorch eager", steps_per_s=None, note="skipped: torch does not import"))
        extra, failed = minimize_runners(spec["layers"], spec["batch"], k)
        results[size] = measure(runners + extra, steps, repeats) + skipped + failed
        md.append(size_table(size, spec, results[size], steps, repeats))
        print(md[-1], flush=True)
    mem_md, mem_rows, mem_target = memory_section(k)
    ts = targets(results) + [mem_target]
    info.update(wall_s=round(time.perf_counter() - t_start, 1), loadavg_1min_end=round(os.getloadavg()[0], 2),
                K=k, command="python bench/bench_loop.py" + (" --quick" if args.quick else ""))
    text = ("# bench_loop results" + (" (--quick smoke test: not a measurement)" if args.quick else "") + "\n\n"
            + ", ".join(f"{key}: {v}" for key, v in info.items()) + "\n\n"
            + f"K = {k} steps per device loop. Each variant is compiled and warmed up, then all are timed "
              f"round-robin for a number of rounds; steps/s is the median over rounds and "
              f"ratios are the median over rounds of the ratio measured in the same round. compile = first "
              f"call's wall time less one steady-state call.\n\n"
            + "\n".join(md) + "\n## Memory\n\n" + mem_md + "\n## Targets\n\n" + target_table(ts))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(
        dict(machine=info, sizes={s: dict(SIZES[s], rows=r) for s, r in results.items()},
             memory=mem_rows, targets=ts), indent=2))
    print(mem_md + "\n" + target_table(ts) + f"\nwrote {args.out}/results.md, results.json ({info['wall_s']} s)")


if __name__ == "__main__":
    main()
