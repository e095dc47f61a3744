"""Steps/second of one Adam-trained MLP, run every way side by side (figure "loop").

    python bench/bench_loop.py [--rounds 7] [--quick] [--json PATH]     # ~4 min on 2 cores

Per size (tiny: dispatch bound ... large: compute bound) it times jax.jit per step (with and
without donation), a hand-written lax.fori_loop of K steps in one donated jit, loopfuse per step,
loopfuse `.loop(K)`, PyTorch eager (when torch imports) and `loopfuse.minimize` with each
backend (today's defaults). The jax.jit and fori_loop references run twice: as users write them,
and compiled with the XLA options loopfuse compiled its own executable with, so a reader sees
what comes from an XLA option and what from loopfuse. Every variant trains the same problem
(fixed synthetic batch, optax.adam(1e-3)). Statistics: bench/harness.py (medians over
interleaved rounds, min-max, ratio of medians). Memory is bench_memory.py's figure.
"""
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

try:
    import torch
except ImportError:  # the PyTorch rows are skipped
    torch = None

K = 100  # steps per device loop (fori_loop, loopfuse .loop, CompiledLoop)
OPT = optax.adam(1e-3)
# steps: timed steps per round (a multiple of K).
# torch_threads: one thread for small matrices (more only adds OpenMP barriers), all cores for large.
SIZES = {
    "tiny": dict(layers=(8, 16, 1), batch=16, steps=2000, torch_threads=1),
    "medium": dict(layers=(64, 256, 1), batch=128, steps=1000, torch_threads=1),
    "large": dict(layers=(512, 2048, 1), batch=512, steps=100, torch_threads=len(__import__("os").sched_getaffinity(0))),
}
QUICK = dict(k=10, steps=20)  # --quick: a smoke test, not a measurement
TARGETS = {"tiny": 10.0, "medium": 1.5, "large": 1.0}  # loopfuse loop / jit+donation
FORI_TARGET = 0.95                                     # loopfuse loop / fori_loop, every size
SAME = "loopfuse's XLA options"
BASELINE, LOOP, FORI = "jax.jit + donation", "loopfuse .loop(K)", "jax fori_loop(K) + donation"


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
class StepRunner:
    """A ``call(state, batch) -> (state, aux)`` variant running `per_call` steps per call.

    `build(state, batch)` returns the call, compiled; then one call warms up. The state is kept between timed runs (donating variants consume it), so every run continues
    training.
    """

    def __init__(self, name, build, init, batch, per_call=1, memory=None):
        self.name, self.batch, self.per_call, self.memory = name, batch, per_call, memory
        state = init()
        self.call = build(state, batch)
        state, aux = jax.block_until_ready(self.call(state, batch))
        self.first_loss = np.asarray(aux["loss"]).tolist()
        self.state, self.aux = jax.block_until_ready(self.call(state, batch))

    def run(self) -> float:
        state, calls = self.state, max(1, self.steps // self.per_call)
        t0 = time.perf_counter()
        for _ in range(calls):
            state, aux = self.call(state, self.batch)
        jax.block_until_ready((state, aux))
        self.state, self.aux = state, aux
        return calls * self.per_call / (time.perf_counter() - t0)

    def info(self) -> dict:
        return dict(peak_bytes=self.memory.peak if self.memory else None)


class MinimizeRunner:
    """``loopfuse.minimize(..., backend=...)``: each run is a fresh solve of `steps` steps; its
    Solution's steps_per_second (the solve loop, compile excluded) is what it reports."""

    def __init__(self, name, backend, layers, batch, k):
        self.name, self.backend, self.layers, self.batch, self.steps = name, backend, layers, batch, k
        self.run()  # warm-up

    def run(self) -> float:
        sol = loopfuse.minimize(loss_fn, init_params(self.layers), self.batch, optimizer=OPT, steps=self.steps,
                                backend=self.backend)
        return sol.steps_per_second

    def info(self) -> dict:
        return dict(peak_bytes=None)


def loopfuse_build(step):
    def build(state, batch):
        step.compiled(state, batch)
        return step
    return build


def jit_build(jitted):
    def build(state, batch):
        jitted.lower(state, batch).compile()
        return jitted
    return build


def jax_runners(layers, batch_size, k) -> tuple[list, dict]:
    """The jax and loopfuse runners, and the XLA options loopfuse compiled its step and loop with."""
    batch, init = make_batch(layers, batch_size), partial(init_state, layers)
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    loop = step.loop(k)
    state = init()
    options = {"step": harness.loopfuse_options(step, state, batch), "loop": harness.loopfuse_options(loop, state, batch)}
    fori = partial(fori_train, steps=k)
    jitted = [("jax.jit per step (no donation)", harness.jit(train_step, donate=False), 1),
              (BASELINE, harness.jit(train_step), 1),
              (f"{BASELINE}, {SAME}", harness.jit(train_step, options["step"]), 1),
              (FORI, harness.jit(fori), k),
              (f"{FORI}, {SAME}", harness.jit(fori, options["loop"]), k)]
    runners = [StepRunner(name, jit_build(j), init, batch, n, harness.jit_memory(j, state, batch))
               for name, j, n in jitted]
    runners += [StepRunner(name, loopfuse_build(s), init, batch, n, s.memory_stats(state, batch))
                for name, s, n in (("loopfuse per step", step, 1), (LOOP, loop, k))]
    return runners, options


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

    return StepRunner("PyTorch eager (Adam fused)", lambda s, b: call, init, (x, y))


def minimize_runners(layers, batch_size, k) -> list:
    """loopfuse.minimize with each backend, today's defaults."""
    backends = {"GradOnly()": loopfuse.GradOnly(), "CompiledStep()": loopfuse.CompiledStep(),
                "CompiledLoop(steps=K)": loopfuse.CompiledLoop(steps=k)}
    return [MinimizeRunner(f"loopfuse.minimize {name}", b, layers, make_batch(layers, batch_size), k)
            for name, b in backends.items()]


def size_section(name, spec, runners, options, rates, steps, rounds) -> tuple[str, dict]:
    base = rates[BASELINE]
    rows = {r.name: dict(steps_per_s=harness.summary(rates[r.name]), **r.info(),
                         vs_baseline=harness.compare(rates[r.name], base, higher_is_better=True)) for r in runners}
    first = {r.name: np.asarray(r.first_loss) for r in runners if hasattr(r, "first_loss")}
    agree = np.max(np.abs(first[FORI] - first[LOOP]) / np.maximum(np.abs(first[FORI]), 1e-30))
    fmt = lambda x, spec: "—" if x is None else spec.format(x)  # noqa: E731
    md = [f"### {name}: MLP {'-'.join(map(str, spec['layers']))}, batch {spec['batch']} "
          f"({rounds} rounds of {steps} steps)", "",
          "| variant | steps/s (median) | rounds min–max | vs jit + donation (ratio of medians) | peak memory |",
          "|---|---:|---:|---:|---:|"]
    md += [f"| {n} | {r['steps_per_s']['median']:,.0f} | {harness.spread_text(rates[n])} | "
           f"{'1.00x (reference)' if n == BASELINE else harness.ratio_text(r['vs_baseline'])} | "
           f"{fmt(r['peak_bytes'], '{:,} B')} |" for n, r in rows.items()]
    md += ["", f"{SAME}: step {harness.options_text(options['step'])}; loop {harness.options_text(options['loop'])}. "
           f"The first K-step loss histories of the fori_loop and loopfuse .loop(K) differ by at most {agree:.1e} "
           "(relative). minimize rows: Solution.steps_per_second of a K-step solve (compile excluded)."]
    return "\n".join(md) + "\n", rows


def targets(rates: dict) -> tuple[str, list]:
    out = []
    for size, r in rates.items():
        for what, ref, goal in [(f"{size}: loopfuse loop / jit + donation", BASELINE, TARGETS[size]),
                                (f"{size}: loopfuse loop / fori_loop", FORI, FORI_TARGET),
                                (f"{size}: loopfuse loop / fori_loop, {SAME}", f"{FORI}, {SAME}", None)]:
            c = harness.compare(r[LOOP], r[ref], higher_is_better=True)
            verdict = "—" if goal is None else ("PASS" if c["ratio"] >= goal else "MISS")
            out.append(dict(what=what, goal=goal, verdict=verdict, **c))
    goal = lambda t: "—" if t["goal"] is None else f">= {t['goal']:g}x"  # noqa: E731
    md = ["| figure | ratio of medians | measured difference | goal | result |", "|---|---:|---|---:|---|"]
    md += [f"| {t['what']} | {t['ratio']:.2f}x | {harness.ratio_text(t)} | {goal(t)} | {t['verdict']} |" for t in out]
    same = [t for t in out if t["goal"] is None]
    md += ["", "loopfuse's loop against the hand-written fori_loop compiled with the same XLA options: "
           + ", ".join(f"{t['what'].split(':')[0]} {harness.ratio_text(t)}" for t in same)
           + (". No loopfuse pass has a measured effect of its own on these loops beyond the XLA options."
              if not any(t["measured"] for t in same) else ".")]
    return "\n".join(md) + "\n", out


def main():
    args = harness.parser(__doc__, rounds=7).parse_args()
    report = harness.Report("loop", args)
    k = QUICK["k"] if args.quick else K
    rounds = 2 if args.quick else args.rounds
    all_rates = {}
    for size, spec in SIZES.items():
        steps = QUICK["steps"] if args.quick else spec["steps"]
        runners, options = jax_runners(spec["layers"], spec["batch"], k)
        if torch is not None:
            runners.append(torch_runner(spec["layers"], spec["batch"], spec["torch_threads"]))
        runners += minimize_runners(spec["layers"], spec["batch"], k)
        for r in runners:
            r.steps = steps if not isinstance(r, MinimizeRunner) else k
        rates = harness.interleave({r.name: r.run for r in runners}, rounds)
        md, rows = size_section(size, spec, runners, options, rates, steps, rounds)
        report.section(md + ("" if torch is not None else "\nPyTorch eager: skipped (torch does not import).\n"),
                       **{size: rows})
        all_rates[size] = rates
    md, ts = targets(all_rates)
    report.section("### Targets\n\n" + md, targets=ts)
    report.write()


if __name__ == "__main__":
    main()
