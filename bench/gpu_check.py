"""One short run that checks loopfuse on the machine's first device: results, corpus, cache, memory,
speed, packed state, shuffled Dataset.

    python bench/gpu_check.py [--quick] [--sections results corpus ...] [--rounds 5] [--out bench/out] [--json PATH]

Made for a lent GPU (jax 0.11+ with its CUDA plugin as preinstalled there, loopfuse installed from
a wheel with --no-deps: bench/gpu_check.sh); it runs on any platform, and `--quick` shrinks every
problem so the whole check takes seconds on a CPU (the suite runs it). It installs nothing.
It measures and reports as every bench script does (bench/harness.py: arguments, interleaved rounds,
the environment line, gpu_check.md and the JSON); the environment adds the platform, the devices and
the route of each private jax API (`_jax_compat.status()`). Then the sections named by --sections
(default all), most important first:

- results: one step bitwise against jax.jit, `loop(K)` against the hand-written `lax.scan` of K
  steps in jax.jit; `until` stops at the step jax.jit's losses say, with the state of a scan of
  that many steps; a `jax.debug.callback` runs once per step, K times in `loop(K)`, with jax.jit's
  values.
- corpus: the differential corpus (tests/py/corpus.py, as tests/py/test_corpus.py checks it): one
  step bitwise against jax.jit's, `loop(3)` against the program's `loop_reference`. Each reference
  runs twice: where jax.jit differs from itself (scatter-add atomics on a GPU), the row says "jax.jit
  varies run to run" and is no failure.
- cache: two processes compile the same step into one cache folder; the second loads it (XLA does
  not run) and computes the same bits.
- memory: compiled bytes of `loop(K)` with loopfuse's default XLA options, and with the platform's
  copy-insertion option (`xla_<platform>_copy_insertion_use_region_analysis`) on and off, whose
  results are compared bitwise.
- speed: steps/s of jax.jit + donation per step, a hand-written `lax.scan` of K steps in one
  donating jit, the loopfuse step and loopfuse `loop(K)`, each of --rounds interleaved rounds
  (`harness.interleave`) running K steps per variant; medians, and the median per-round ratio to
  jax.jit + donation (`harness.paired_ratio`).
  Problems: a tiny MLP, a 3-layer 4096-wide MLP and a 6-layer 512-wide GPT-style model (Adam).
- anatomy: issue 33 item 10 (the tiny MLP's `loop(K)` ran at 0.80x of the hand-written scan on an H200,
  unexplained): for the tiny MLP's four variants, each executable's XLA options (loopfuse's, from the
  executable), its optimized HLO's instructions that run code, by opcode, in the while loop's body and
  outside it (`harness.hlo_ops`), and the host time of a call: from the call to its return, the
  arguments ready and its results not waited for, against the whole call to its results ready (medians
  of --rounds interleaved rounds of `ANATOMY_CALLS` calls). A report: it fails nothing.
- pack: issue 23's figure (bench/bench_pack.py): Adam over N small leaves, loop(10), `PACK_VARIANTS`
  against the donated `lax.scan`: compile seconds (after a warm-up, median of `PACK`'s compile rounds),
  steps/s, whether each final state equals the scan's bitwise (a report: it fails nothing).
- layers: issues 31 and 38's rolled layers on the GPT problem (6x512; --quick: 3x16) and on the flax
  linen and nnx GPTs of issue 38 (8x256, 128 tokens, batch 16; --quick: tests/py's tiny size), each
  jax.jit + donation against `compile_step(..., memory_budget=0.0)` on the state kept stacked
  (`loopfuse.pack(state, layers=True)`): compiled temporaries, steps/s (interleaved rounds of 3
  steps), the loss after 3 steps and roll-layers' report. It fails when a model rolled nothing or
  its loss differs by more than `LAYERS["rtol"]` relative; the rest is a report.
- shuffle: issue 23 item 4 (bench/bench_data.py's "1M x 16" at `SHUFFLE`'s rounds): `fit` steps/s on
  a shuffled Dataset against the unshuffled one (device and numpy arrays), the cost of one epoch's
  order, and the ceiling (loopfuse's epoch loop gathering a fixed order's rows against slicing). It
  checks that the epoch loop of the shuffled Dataset (its order computed as on this platform) ends
  bitwise where the loop gathering the host-computed order does; the ratios are a report.
- memlimit: issue 39 on this device: `largest_batch` of issue 31's GPT (8x256, 128 tokens, AdamW) under
  ``memory_limit="device"`` (the device's memory less `memory_plan.DEVICE_MARGIN`; where the device reports
  none, as a CPU, a quarter of jax.jit's peak at `MEMLIMIT`'s batch), then `compile_step(...,
  memory_limit=...)` at the batch it returns, run `MEMLIMIT["steps"]` steps: the compiled peak within the
  limit, the device's own peak bytes in use within its ``bytes_limit`` where it reports them, the loss
  finite. It fails when a figure is over or the loss is not finite.
- ensemble: issue 32's quadratic at `ENSEMBLE`'s size (65,536 members; bench/bench_ensemble.py's
  quadratic section): ``minimize(..., ensemble=True)`` against ``jax.jit(jax.vmap(while_loop))`` with
  and without the history and optimistix under vmap, whole calls, and whether loopfuse's outputs equal
  the reference's bitwise (a report: it fails nothing).

Writes gpu_check.md and gpu_check.json (or --json) into --out as each section's results come in
(a run cut short keeps what it finished: `harness.Report.save`), prints each section's markdown and
seconds as it ends and the whole markdown at the end; exits 1 when a check of results, corpus, cache,
memory, layers, shuffle or memlimit fails or a section raises.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "py")]
import bench_loop  # noqa: E402
import harness  # noqa: E402
from problems import assert_trees_equal, fresh as copied  # noqa: E402
import layered  # noqa: E402
import transformer  # noqa: E402
from transformer import optax_step  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import _jax_compat  # noqa: E402

OPT = optax.adam(1e-3)
FULL = dict(k=50, rounds=5, problems={
    "tiny MLP": dict(kind="mlp", layers=(8, 16, 1), batch=16),
    "MLP 3x4096": dict(kind="mlp", layers=(4096,) * 4, batch=256),
    "GPT 6x512": dict(kind="gpt", layers=6, width=512, heads=8, seq=256, vocab=2048, batch=16),
})
QUICK = dict(k=4, rounds=1, problems={
    "tiny MLP": dict(kind="mlp", layers=(8, 16, 1), batch=16),
    "MLP 3x32": dict(kind="mlp", layers=(32,) * 4, batch=8),
    "GPT 1x16": dict(kind="gpt", layers=1, width=16, heads=2, seq=8, vocab=32, batch=2),
})
BASELINE = "jax.jit + donation"
MEMORY_PROBLEMS = 2       # the two large problems (the tiny MLP's bytes say nothing)
SECTIONS = ("results", "corpus", "cache", "memory", "speed", "anatomy", "pack", "layers", "shuffle", "ensemble",
            "memlimit")
CORPUS_K = 3              # tests/py/test_corpus.py's K
CORPUS_QUICK = ("diffrax_saveat_t1", "cond_switch", "segment_sum_scatter_add")
PACK = dict(full=dict(leaves=300, rounds=5, calls=10, compile_rounds=2),
            quick=dict(leaves=8, rounds=1, calls=2, compile_rounds=1), k=10)
# bench_pack.variants' rows to run, by name (its row 0, the donated lax.scan, is the reference and always runs).
PACK_VARIANTS = ("lax.scan (jax.jit, donated)", "hand-written ravel_pytree lax.scan (jax.jit, donated)",
                 "loopfuse loop", "loopfuse loop, state packed between calls (loopfuse.pack)",
                 "loopfuse loop, state packed between calls + pack-state{flatten=true}")
VARIES = "jax.jit varies run to run"
ANATOMY_CALLS = dict(full=200, quick=5)   # calls per variant and round of the anatomy section
SHUFFLE = dict(size="1M x 16", full=dict(rounds=3), quick=dict(rounds=1))  # bench_data.measure's (--quick: a tenth)
LAYERS = dict(full="GPT 6x512", quick=dict(kind="gpt", layers=3, width=16, heads=2, seq=8, vocab=32, batch=2),
              steps=3, rtol=1e-4,         # and issue 38's library-written GPTs, at its size (quick: transformer.TINY)
              models={"flax linen GPT": lambda size: layered.linen_gpt(**size),
                      "flax nnx GPT": lambda size: transformer.nnx_gpt(**size)})
MEMLIMIT = dict(full=dict(spec=transformer.ISSUE, max_batch=2**14), quick=dict(spec=dict(transformer.TINY, seq=64),
                                                                                 max_batch=64), batch=16, steps=3)
ENSEMBLE = dict(full=dict(members=65536, steps=4000, rounds=3), quick=dict(members=64, steps=300, rounds=1))


# ---- problems: (step, init_state, batch) ---------------------------------------------------
def layer_norm(x, gain):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gain


def gpt_params(spec, seed=0):
    d, v = spec["width"], spec["vocab"]
    keys = iter(jax.random.split(jax.random.key(seed), 4 * spec["layers"] + 2))

    def normal(shape, scale):
        return jax.random.normal(next(keys), shape) * scale

    blocks = [{"ln1": jnp.ones(d), "qkv": normal((d, 3 * d), d ** -0.5), "proj": normal((d, d), d ** -0.5),
               "ln2": jnp.ones(d), "up": normal((d, 4 * d), d ** -0.5), "down": normal((4 * d, d), (4 * d) ** -0.5)}
              for _ in range(spec["layers"])]
    return {"embed": normal((v, d), 0.02), "pos": normal((spec["seq"], d), 0.02), "blocks": blocks,
            "ln_f": jnp.ones(d)}


def gpt_loss(heads):
    """Next-token cross-entropy of a pre-norm causal transformer with tied embeddings. Tokens enter
    and targets leave as one-hot matmuls, so no gradient is a scatter (GPU atomics would make the
    bitwise comparison meaningless)."""
    def loss(params, batch):
        tokens, targets = batch
        v, d = params["embed"].shape
        x = jax.nn.one_hot(tokens, v) @ params["embed"] + params["pos"]
        b, t, _ = x.shape
        causal = jnp.tril(jnp.ones((t, t), bool))
        for blk in params["blocks"]:
            q, k, val = (a.reshape(b, t, heads, d // heads) for a in jnp.split(layer_norm(x, blk["ln1"]) @ blk["qkv"], 3, -1))
            att = jax.nn.softmax(jnp.where(causal, jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads), -jnp.inf))
            x = x + jnp.einsum("bhqk,bkhd->bqhd", att, val).reshape(b, t, d) @ blk["proj"]
            x = x + jax.nn.gelu(layer_norm(x, blk["ln2"]) @ blk["up"]) @ blk["down"]
        logp = jax.nn.log_softmax(layer_norm(x, params["ln_f"]) @ params["embed"].T)
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(targets, v), -1))
    return loss


def problem(spec):
    if spec["kind"] == "mlp":
        params = bench_loop.init_params(spec["layers"])
        return optax_step(bench_loop.loss_fn, OPT), params, bench_loop.make_batch(spec["layers"], spec["batch"])
    params = gpt_params(spec)
    tokens = jax.random.randint(jax.random.key(1), (spec["batch"], spec["seq"] + 1), 0, spec["vocab"])
    return optax_step(gpt_loss(spec["heads"]), OPT), params, (tokens[:, :-1], tokens[:, 1:])


def fresh(params):
    """A new state (its own buffers: every variant donates)."""
    params = jax.tree_util.tree_map(jnp.copy, params)
    return params, OPT.init(params)


def scan_of(step, k):
    """K steps in one jit, as written by hand: lax.scan with the loss history as its output."""
    def run(state, batch):
        state, losses = jax.lax.scan(lambda s, _: (lambda out: (out[0], out[1]["loss"]))(step(s, batch)),
                                     state, length=k)
        return state, {"loss": losses}
    return jax.jit(run, donate_argnums=0)


# ---- 2. results ---------------------------------------------------------------------------
def check(results: list, name: str, what: str, fn) -> None:
    """Run `fn` (which asserts); record ok or the failure."""
    try:
        detail = fn()
        results.append({"problem": name, "check": what, "ok": True, "detail": detail or ""})
    except AssertionError as e:
        results.append({"problem": name, "check": what, "ok": False, "detail": str(e).splitlines()[0][:300]})


def variants(step, k: int) -> dict:
    """The four ways to run `step` that section 3 times (sections 2 and 4 reuse their executables):
    name -> (call, steps per call)."""
    lf = loopfuse.compile_step(step)
    return {BASELINE: (jax.jit(step, donate_argnums=0), 1), "loopfuse step": (lf, 1),
            f"hand-written scan({k})": (scan_of(step, k), k), f"loopfuse loop({k})": (lf.loop(k), k)}


def result_checks(results: list, name: str, step, runs: dict, params, batch, k: int, tiny: bool) -> None:
    """A step against jax.jit's step; a loop against jax.jit of the same loop written by hand (a
    `lax.scan`: XLA compiles a step inside a loop differently from a step alone, for jax.jit too)."""
    lf, loop, scan = runs["loopfuse step"][0], runs[f"loopfuse loop({k})"][0], runs[f"hand-written scan({k})"][0]

    def one_step():
        assert_trees_equal(lf(fresh(params), batch), jax.jit(step)(fresh(params), batch))

    def k_steps():
        assert_trees_equal(loop(fresh(params), batch), scan(fresh(params), batch))

    check(results, name, "step == jax.jit", one_step)
    check(results, name, f"loop({k}) == jax.jit scan({k})", k_steps)
    if not tiny:
        return
    losses = np.asarray(scan(fresh(params), batch)[1]["loss"])

    def until():
        threshold = float(losses[k // 2])
        expected = int(np.argmax(losses <= np.float32(threshold))) + 1
        state, aux, steps, _ = lf.loop(k, until=lambda s, a: a["loss"] <= threshold)(fresh(params), batch)
        assert int(steps) == expected, f"stopped after {int(steps)} steps, jax.jit's loop after {expected}"
        assert_trees_equal(state, scan_of(step, expected)(fresh(params), batch)[0])
        return f"stopped after {expected} of {k} steps"

    def callbacks():
        seen = []

        def logged(state, batch):
            new_state, aux = step(state, batch)
            jax.debug.callback(lambda loss: seen.append(np.asarray(loss)), aux["loss"])
            return new_state, aux
        loopfuse.compile_step(logged).loop(k)(fresh(params), batch)
        jax.effects_barrier()
        assert len(seen) == k, f"the callback ran {len(seen)} times in loop({k})"
        assert_trees_equal(seen, list(losses))

    check(results, name, "until stops like jax.jit", until)
    check(results, name, f"debug.callback {k} times in loop({k})", callbacks)


# ---- 3. speed -----------------------------------------------------------------------------
def speed(runs: dict, params, batch, k: int, rounds: int) -> dict:
    """Per variant: median steps/s over interleaved rounds (K steps per variant and round) and the
    median per-round ratio to jax.jit + donation."""
    states = {v: jax.block_until_ready(f(fresh(params), batch)[0]) for v, (f, _) in runs.items()}  # warm up

    def k_steps(v):
        f, per_call = runs[v]

        def run():
            for _ in range(k // per_call):
                states[v], _ = f(states[v], batch)
            return states[v]
        return lambda: k / harness.clocked(run)[0]
    rates = harness.interleave({v: k_steps(v) for v in runs}, rounds)
    return {v: {"steps_per_s": statistics.median(x), "vs_jit": harness.paired_ratio(x, rates[BASELINE])["ratio"]}
            for v, x in rates.items()}


# ---- anatomy ------------------------------------------------------------------------------
def anatomy(runs: dict, params, batch, rounds: int, calls: int) -> dict:
    """Per variant of one problem: the XLA options loopfuse compiled it with (None for jax.jit's), the
    instructions that run code in its optimized HLO (`harness.hlo_ops`), and the median microseconds of a
    call to its return (arguments ready, results not waited for) and to its results ready."""
    states = {v: jax.block_until_ready(f(fresh(params), batch)[0]) for v, (f, _) in runs.items()}  # warm up

    def timed(v):
        f = runs[v][0]

        def run():
            host, whole = [], []
            for _ in range(calls):
                jax.block_until_ready(states[v])
                t0 = time.perf_counter()
                out = f(states[v], batch)
                t1 = time.perf_counter()
                states[v] = jax.block_until_ready(out)[0]
                host.append(t1 - t0)
                whole.append(time.perf_counter() - t0)
            return statistics.median(host) * 1e6, statistics.median(whole) * 1e6
        return run
    times = harness.interleave({v: timed(v) for v in runs}, rounds)
    out = {}
    for v, (f, _) in runs.items():
        state = fresh(params)
        out[v] = {"xla_options": f.compiled(state, batch).xla_options if isinstance(f, loopfuse.Step) else None,
                  "ops": harness.hlo_ops(harness.optimized_hlo(f, state, batch)),
                  "host_us": statistics.median(h for h, _ in times[v]),
                  "whole_us": statistics.median(w for _, w in times[v])}
    return out


# ---- 4. memory ----------------------------------------------------------------------------
def memory(step, default_loop, params, batch, k: int, platform: str) -> dict:
    option = f"xla_{platform}_copy_insertion_use_region_analysis"
    loops = {"loopfuse default": default_loop}
    for on in (True, False):
        loops[f"{option}={on}"] = loopfuse.compile_step(step, xla_options={option: on}).loop(k)
    rows, finals = {}, {}
    for setting, loop in loops.items():
        stats = loop.memory_stats(fresh(params), batch)
        rows[setting] = vars(stats) | {"peak": stats.peak}
        finals[setting] = loop(fresh(params), batch)
    try:
        for setting in finals:
            assert_trees_equal(finals[setting], finals["loopfuse default"])
        same = True
    except AssertionError:
        same = False
    return {"option": option, "rows": rows, "bitwise_equal": same}


# ---- 5. compile cache ---------------------------------------------------------------------
def cache_child(folder: str) -> None:
    """One process: the tiny MLP step with the cache in `folder`; prints JSON."""
    step, params, batch = problem(QUICK["problems"]["tiny MLP"])
    lf = loopfuse.compile_step(step, cache_dir=folder)
    t0 = time.perf_counter()
    seconds = lf.compiled(fresh(params), batch).seconds
    state, aux = lf(fresh(params), batch)
    jax.block_until_ready(state)
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, aux))]
    print(json.dumps({"first_call_s": time.perf_counter() - t0, "xla_ran": "xla" in seconds,
                      "bits": [x.tobytes().hex() for x in leaves]}))


def compile_cache() -> dict:
    """Two child processes; they allocate device memory as they need it (this process holds jax's
    preallocated share of a GPU's memory)."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    with tempfile.TemporaryDirectory(prefix="loopfuse-gpu-check-") as folder:
        runs = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, __file__, "--cache-child", folder], capture_output=True,
                                  text=True, timeout=240, env=env)
            if proc.returncode:
                return {"ok": False, "detail": proc.stderr[-2000:]}
            runs.append(json.loads(proc.stdout.splitlines()[-1]))
    first, second = runs
    ok = first["xla_ran"] and not second["xla_ran"] and first["bits"] == second["bits"]
    return {"ok": ok, "first_call_s": [first["first_call_s"], second["first_call_s"]],
            "xla_ran": [first["xla_ran"], second["xla_ran"]], "same_bits": first["bits"] == second["bits"]}


# ---- corpus -------------------------------------------------------------------------------
def difference(a, b) -> str | None:
    """None when `a` and `b` are bitwise equal (as `assert_trees_equal`), else where they differ:
    the differing leaves and the largest absolute and relative difference over them."""
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return f"tree structures differ: {ta} vs {tb}"[:300]
    paths, most_abs, most_rel = [], 0.0, 0.0
    for (path, x), y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            return f"{jax.tree_util.keystr(path)}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        if x.tobytes() == y.tobytes():
            continue
        paths.append(jax.tree_util.keystr(path) or "leaf")
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        rel = d / np.maximum(np.abs(y.astype(np.float64)), np.finfo(np.float32).tiny)
        with np.errstate(all="ignore"):
            most_abs = max(most_abs, float(np.nanmax(d, initial=0.0)))
            most_rel = max(most_rel, float(np.nanmax(rel, initial=0.0)))
    if not paths:
        return None
    return (f"{len(paths)} of {len(la)} leaves differ ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}); "
            f"max abs {most_abs:.3g}, max rel {most_rel:.3g}")


def differential(program: str, check: str, ours, reference, reruns: int = 3) -> dict:
    """A corpus row: `reference()` (jax.jit) twice, then `ours()` (loopfuse) against the first; when
    they differ, `reruns` more references (a rare race can give the same bits twice)."""
    expected = reference()
    varies = difference(reference(), expected)
    got = difference(ours(), expected)
    for _ in range(reruns if got and not varies else 0):
        varies = varies or difference(reference(), expected)
    if varies:
        status, detail = VARIES, f"jax.jit against itself: {varies}; loopfuse against its first run: {got or 'equal'}"
    else:
        status, detail = ("ok", "") if got is None else ("FAILED", got)
    return {"program": program, "check": check, "status": status, "detail": detail}


def loop_reference(p, k: int):
    """The reference of `p.fn`'s loop(k) (tests/py/test_corpus.py's): k jax.jit steps with aux stacked
    as loop(k) returns it, or jax.jit of the hand-written `lax.scan` of k steps (one executable for
    every call)."""
    if p.loop_reference == "scan":
        scan = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: p.fn(c, b), s, None, length=k))
        return lambda: scan(copied(p.state), p.batch)
    step = jax.jit(p.fn)

    def steps():
        state, auxes = copied(p.state), []
        for _ in range(k):
            state, aux = step(state, p.batch)
            auxes.append(aux)
        return state, jax.tree_util.tree_map(lambda *rows: jnp.stack(rows), *auxes)
    return steps


def corpus_program(name: str, k: int = CORPUS_K) -> list:
    """The rows of `differential` for one corpus program: its step and its loop(k); an exception
    fails the program."""
    import corpus
    rows: list = []
    try:
        p = corpus.PROGRAMS[name]()
        lf, jitted = loopfuse.compile_step(p.fn), jax.jit(p.fn)
        rows.append(differential(name, "step == jax.jit", lambda: lf(copied(p.state), p.batch),
                                 lambda: jitted(copied(p.state), p.batch)))
        ref = f"jax.jit scan({k})" if p.loop_reference == "scan" else f"{k} jax.jit steps"
        rows.append(differential(name, f"loop({k}) == {ref}", lambda: lf.loop(k)(copied(p.state), p.batch),
                                 loop_reference(p, k)))
    except Exception as e:  # noqa: BLE001 (an error on this platform is a finding, not the end of the run)
        rows.append({"program": name, "check": "runs", "status": "FAILED",
                     "detail": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"})
    return rows


# ---- pack ---------------------------------------------------------------------------------
def packed_state(leaves: int, rounds: int, calls: int, compile_rounds: int, k: int = PACK["k"]) -> dict:
    """bench_pack.run at one N and K with the `PACK_VARIANTS` rows."""
    import bench_pack
    names = list(bench_pack.variants(None, k, None))  # the names only (nothing is built)
    missing = [v for v in PACK_VARIANTS if v not in names]
    assert not missing, f"bench_pack.variants has no {missing}"
    result = bench_pack.run(leaves, [k], rounds, calls, only={names.index(v) for v in PACK_VARIANTS},
                            compile_rounds=compile_rounds)
    return {"k": k, "rounds": rounds, "calls": calls, **result}


def rolled_layers(step, new_state: Callable, batch, rounds: int) -> dict:
    """Issues 31 and 38 on this device: jax.jit + donation against `step` rolled at memory_budget=0.0 on
    a state kept stacked between calls (see the module docstring); `new_state()`: a state of its own."""
    n = LAYERS["steps"]
    jitted = jax.jit(step, donate_argnums=0)
    rolled = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0)
    calls = {BASELINE: (jitted, new_state),
             "loopfuse memory_budget=0.0, packed": (rolled, lambda: loopfuse.pack(new_state(), layers=True))}
    temps = {BASELINE: jitted.lower(new_state(), batch).compile().memory_analysis().temp_size_in_bytes,
             "loopfuse memory_budget=0.0, packed": rolled.memory_stats(calls["loopfuse memory_budget=0.0, packed"][1](),
                                                                    batch).temp}
    report = rolled.compiled(calls["loopfuse memory_budget=0.0, packed"][1](), batch).reports["roll-layers"]
    states, losses = {}, {}
    for name, (call, start) in calls.items():
        s = start()
        for _ in range(n):
            s, aux = call(s, batch)
        states[name], losses[name] = s, float(aux["loss"])

    def steps(name):
        def run():
            for _ in range(n):
                states[name], _ = calls[name][0](states[name], batch)
            return states[name]
        return lambda: n / harness.clocked(run)[0]
    rates = harness.interleave({name: steps(name) for name in calls}, rounds)
    diff = abs(losses["loopfuse memory_budget=0.0, packed"] - losses[BASELINE]) / abs(losses[BASELINE])
    return {"report": report, "rolled": report.startswith("rolled"), "loss_rel_diff": diff,
            "ok": report.startswith("rolled") and diff <= LAYERS["rtol"],
            "rows": {name: {"temp": temps[name], "steps_per_s": statistics.median(rates[name]),
                            "vs_jit": harness.paired_ratio(rates[name], rates[BASELINE])["ratio"],
                            "loss": losses[name]} for name in calls}}


def memory_limit(spec: dict, max_batch: int) -> dict:
    """Issue 39 on this device (see the module docstring's memlimit)."""
    step, state, tokens = transformer.gpt(**dict(spec, batch=MEMLIMIT["batch"]))
    device = jax.devices()[0]
    reported = (device.memory_stats() or {}).get("bytes_limit")
    limit = "device" if reported else harness.jit_memory(jax.jit(step, donate_argnums=0), state, tokens).peak // 4
    t0 = time.perf_counter()
    fit = loopfuse.largest_batch(step, state, lambda n: transformer.tokens(spec["seq"], n, spec["vocab"]),
                                 memory_limit=limit, max_batch=max_batch)
    seconds = time.perf_counter() - t0
    batch = transformer.tokens(spec["seq"], fit.batch_size, spec["vocab"])
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_limit=limit)
    executable = call.compiled(copied(state), batch)
    s = copied(state)
    for _ in range(MEMLIMIT["steps"]):
        s, aux = call(s, batch)
    loss = float(aux["loss"])
    in_use = (device.memory_stats() or {}).get("peak_bytes_in_use")
    plan = executable.memory_plan
    ok = plan.stats.peak <= plan.limit and np.isfinite(loss) and (in_use is None or in_use <= reported)
    return {"limit": plan.limit, "device_bytes_limit": reported, "batch": fit.batch_size, "capped": fit.capped,
            "plan": str(plan.chosen), "peak": plan.stats.peak, "peak_bytes_in_use": in_use, "loss": loss,
            "compiles": fit.compiles, "seconds": seconds, "probes": fit.probes, "report": str(plan), "ok": bool(ok)}


# ---- report ----------------------------------------------------------------------------
def heading(env: dict, k: int, quick: bool) -> str:
    return (f"# loopfuse check on {env['platform']} ({', '.join(sorted(set(env['devices'])))})\n\n"
            f"loopfuse {env['loopfuse_file']}; private jax APIs: {env['compat']}; K = {k}{' (--quick)' if quick else ''}.")


def markdown(section: str, data, k: int, quick: bool) -> str:
    """The markdown of one finished section's `data`."""
    if section == "results":
        return "\n".join(["## Results (bitwise against jax.jit)", "", "| problem | check | | detail |", "|---|---|---|---|"]
                         + [f"| {r['problem']} | {r['check']} | {'ok' if r['ok'] else '**FAILED**'} | {r['detail']} |"
                            for r in data])
    if section == "corpus":
        return "\n".join([f"## Differential corpus (bitwise against jax.jit, loop({data['k']}); each reference run twice)",
                          "", "| program | check | | detail |", "|---|---|---|---|"]
                         + [f"| {r['program']} | {r['check']} | {'**FAILED**' if r['status'] == 'FAILED' else r['status']} | "
                            f"{r['detail']} |" for r in data["rows"]]
                         + ["", "Seconds per program: " + ", ".join(f"{n} {t:.1f}" for n, t in data["seconds"].items())])
    if section == "cache":
        return "## Compile cache across two processes\n\n" + f"{'ok' if data['ok'] else '**FAILED**'}: " + (
            f"first calls {data['first_call_s'][0]:.2f} s then {data['first_call_s'][1]:.2f} s; XLA ran {data['xla_ran']}; "
            f"same bits: {data['same_bits']}" if "xla_ran" in data else data["detail"])
    if section == "memory":
        lines = [f"## Memory of loop({k}) (compiled, MiB)", "",
                 "| problem | XLA options | arguments | outputs | aliased | temporaries | peak | results |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, m in data.items():
            for setting, r in m["rows"].items():
                lines.append(f"| {name} | {setting} | " + " | ".join(harness.mib(r[f]) for f in
                                                                    ("argument", "output", "alias", "temp", "peak"))
                             + f" | {'bitwise equal' if m['bitwise_equal'] else '**differ**'} |")
        return "\n".join(lines)
    if section == "speed":
        variants = list(next(iter(data.values())))
        return "\n".join(["## Steps/s (median; ratio: median per-round ratio to jax.jit + donation)", "",
                          "| problem | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
                         + [f"| {name} | " + " | ".join(f"{row[v]['steps_per_s']:,.0f} ({row[v]['vs_jit']:.2f}x)"
                                                         for v in variants) + " |" for name, row in data.items()])
    if section == "anatomy":
        return "\n".join([f"## What a call of the tiny MLP runs (issue 33 item 10): {data['calls']} calls per variant "
                          f"and round, medians of {data['rounds']} rounds (a report, no check)", "",
                          "| variant | XLA options | while-body instructions | outside the loop | host us/call "
                          "(call to return) | us/call (to results ready) |", "|---|---|---|---|---:|---:|"]
                         + [f"| {v} | {'as jax.jit' if r['xla_options'] is None else harness.options_text(r['xla_options'])} | "
                            f"{harness.ops_text(r['ops']['loop body'])} | {harness.ops_text(r['ops']['outside'])} | "
                            f"{r['host_us']:,.1f} | {r['whole_us']:,.1f} |" for v, r in data["variants"].items()])
    if section == "pack":
        import bench_pack
        return "\n".join([f"## Packed state (issue 23): Adam over {data['leaves']} leaves, loop({data['k']}); medians of "
                          f"{data['rounds']} interleaved rounds of {data['calls']} calls (a report, no check)", "",
                          *bench_pack.table([data], [data["k"]])])
    if section == "layers":
        return "\n".join([f"## Rolled layers (issues 31 and 38): {'ok' if data['ok'] else '**FAILED**'}", "",
                          "| model | variant | temporaries MiB | vs jax.jit | steps/s | vs jax.jit | loss rel. diff |",
                          "|---|---|---:|---:|---:|---:|---:|"]
                         + [f"| {model} ({m['size']}) | {name} | {harness.mib(r['temp'])} | "
                            f"{r['temp'] / m['rows'][BASELINE]['temp']:.2f}x | {r['steps_per_s']:,.2f} | {r['vs_jit']:.2f}x | "
                            f"{m['loss_rel_diff']:.1e}{'' if m['ok'] else ' **FAILED**'} |"
                            for model, m in data["models"].items() for name, r in m["rows"].items()]
                         + ["", *(f"roll-layers, {model}: {m['report']}" for model, m in data["models"].items())])
    if section == "memlimit":
        in_use = "not reported" if data["peak_bytes_in_use"] is None else harness.mib(data["peak_bytes_in_use"]) + " MiB"
        return "\n".join([f"## Memory limit (issue 39): {'ok' if data['ok'] else '**FAILED**'}", "",
                          f"largest_batch under {harness.mib(data['limit'])} MiB (the device's bytes_limit: "
                          f"{data['device_bytes_limit']}): batch {data['batch']}{' (max_batch)' if data['capped'] else ''} "
                          f"with {data['plan']}, compiled peak {harness.mib(data['peak'])} MiB, {data['compiles']} programs "
                          f"compiled in {data['seconds']:.1f} s; after {MEMLIMIT['steps']} steps the device's peak bytes "
                          f"in use {in_use}, loss {data['loss']:.4f}", "", "```", data["report"], "```"])
    if section == "ensemble":
        return f"## Ensembles (issue 32): bench_ensemble's quadratic (a report, no check)\n\n{data['markdown']}"
    assert section == "shuffle", section
    return "\n".join([f"## Shuffled Dataset (issue 23 item 4): bench_data {data['size']!r}, {data['rounds']} interleaved "
                      f"round(s){' (a tenth of the examples)' if quick else ''}", "", *data["lines"]])


def failures(report: dict) -> list[str]:
    """The sections with a failed check (pack reports, it checks nothing) or an exception."""
    failed = {"results": not all(r["ok"] for r in report.get("results", [])),
              "corpus": any(r["status"] == "FAILED" for r in report.get("corpus", {}).get("rows", [])),
              "cache": not report.get("cache", {"ok": True})["ok"],
              "memory": not all(m["bitwise_equal"] for m in report.get("memory", {}).values()),
              "shuffle": not report.get("shuffle", {"bitwise": True})["bitwise"],
              "layers": not report.get("layers", {"ok": True})["ok"],
              "memlimit": not report.get("memlimit", {"ok": True})["ok"]}
    return [s for s in SECTIONS if failed.get(s) or s in report["errors"]]


class Check:
    """One run: the configuration, the report (`harness.Report`; its results are the JSON's sections)
    and the problems built (sections share their executables)."""

    def __init__(self, args: argparse.Namespace):
        self.cfg, self.built = QUICK if args.quick else FULL, {}
        self.rounds = QUICK["rounds"] if args.quick else args.rounds
        self.out = harness.Report("gpu_check", args)
        devices = jax.devices()
        self.out.env.update(platform=devices[0].platform, devices=[d.device_kind for d in devices],
                            compat=_jax_compat.status(), loopfuse_file=loopfuse.__file__)
        self.report = self.out.results
        self.report.update(quick=args.quick, k=self.cfg["k"], errors={}, seconds={})
        self.out.section(heading(self.out.env, self.cfg["k"], args.quick))

    def problem(self, name: str):
        """(step, params, batch, variants) of a problem, built once."""
        if name not in self.built:
            step, params, batch = problem(self.cfg["problems"][name])
            self.built[name] = step, params, batch, variants(step, self.cfg["k"])
        return self.built[name]

    def results(self) -> None:
        self.report["results"] = []
        for i, name in enumerate(self.cfg["problems"]):
            step, params, batch, runs = self.problem(name)
            result_checks(self.report["results"], name, step, runs, params, batch, self.cfg["k"], tiny=i == 0)
            self.out.save()

    def corpus(self) -> None:
        import corpus
        c = self.report["corpus"] = {"k": CORPUS_K, "rows": [], "seconds": {}}
        for name in CORPUS_QUICK if self.report["quick"] else corpus.PROGRAMS:
            t0 = time.perf_counter()
            c["rows"] += corpus_program(name)
            c["seconds"][name] = time.perf_counter() - t0
            self.out.save()

    def cache(self) -> None:
        self.report["cache"] = compile_cache()

    def memory(self) -> None:
        self.report["memory"] = {}
        k, platform = self.cfg["k"], self.out.env["platform"]
        for name in list(self.cfg["problems"])[-MEMORY_PROBLEMS:]:
            step, params, batch, runs = self.problem(name)
            self.report["memory"][name] = memory(step, runs[f"loopfuse loop({k})"][0], params, batch, k, platform)
            self.out.save()

    def speed(self) -> None:
        self.report["speed"] = {}
        for name in self.cfg["problems"]:
            step, params, batch, runs = self.problem(name)
            self.report["speed"][name] = speed(runs, params, batch, self.cfg["k"], self.rounds)
            self.out.save()

    def anatomy(self) -> None:
        name = next(iter(self.cfg["problems"]))          # the tiny MLP
        step, params, batch, runs = self.problem(name)
        calls = ANATOMY_CALLS["quick" if self.report["quick"] else "full"]
        self.report["anatomy"] = {"problem": name, "rounds": self.rounds, "calls": calls,
                                  "variants": anatomy(runs, params, batch, self.rounds, calls)}

    def pack(self) -> None:
        self.report["pack"] = packed_state(**PACK["quick" if self.report["quick"] else "full"])

    def layers(self) -> None:
        quick = self.report["quick"]
        spec = LAYERS["quick"] if quick else self.cfg["problems"][LAYERS["full"]]
        size = transformer.TINY if quick else transformer.ISSUE
        step, params, batch = problem(spec)
        models = {"GPT": (f"{spec['layers']}x{spec['width']}, {spec['batch']} x {spec['seq']} tokens",
                          (step, lambda: fresh(params), batch))}
        for name, build in LAYERS["models"].items():
            step, state, batch = build(size)
            models[name] = (f"{size['layers']}x{size['width']}, {size['batch']} x {size['seq']} tokens",
                            (step, lambda state=state: copied(state), batch))
        rolled = {name: {"size": label, **rolled_layers(*built, self.rounds)} for name, (label, built) in models.items()}
        self.report["layers"] = {"models": rolled, "ok": all(m["ok"] for m in rolled.values())}

    def shuffle(self) -> None:
        import bench_data
        quick = self.report["quick"]
        rounds = SHUFFLE["quick" if quick else "full"]["rounds"]
        lines, results = bench_data.measure(SHUFFLE["size"], rounds, quick, ceiling=True)
        checks = {k: results["ceiling"][k] for k in ("random_equals_shuffled_dataset", "identity_equals_slice")}
        self.report["shuffle"] = {"size": SHUFFLE["size"], "rounds": rounds, "lines": lines,
                                  "bitwise": all(checks.values()), **checks, "results": results}

    def ensemble(self) -> None:
        import bench_ensemble
        size = ENSEMBLE["quick" if self.report["quick"] else "full"]
        markdown, results = bench_ensemble.quadratic_section(size, size["rounds"])
        self.report["ensemble"] = {"markdown": markdown, **results}

    def memlimit(self) -> None:
        size = MEMLIMIT["quick" if self.report["quick"] else "full"]
        self.report["memlimit"] = memory_limit(size["spec"], size["max_batch"])

    def run(self, section: str) -> None:
        """Run a section (an exception is recorded, the run goes on), add its markdown, save the report."""
        t0 = time.perf_counter()
        try:
            getattr(self, section)()
            self.out.section(markdown(section, self.report[section], self.cfg["k"], self.report["quick"]))
        except Exception:  # noqa: BLE001 (a timed device run reports what it can)
            self.report["errors"][section] = traceback.format_exc()[-3000:]
            self.out.section(f"## {section}: **raised**\n\n```\n{self.report['errors'][section]}\n```")
        self.report["seconds"][section] = time.perf_counter() - t0
        print(f"gpu_check: {section} took {self.report['seconds'][section]:.1f} s"
              f"{' (raised)' if section in self.report['errors'] else ''}", flush=True)
        self.out.save()


def main() -> int:
    ap = harness.parser(__doc__, rounds=FULL["rounds"])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="the sections to run (default all), always in the order " + " ".join(SECTIONS))
    ap.add_argument("--cache-child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.cache_child:
        cache_child(ns.cache_child)
        return 0
    ns.json = ns.json or ns.out / "gpu_check.json"
    t0 = time.perf_counter()
    run = Check(ns)
    for section in (s for s in SECTIONS if s in ns.sections):
        run.run(section)
    run.report["seconds"]["all"] = time.perf_counter() - t0
    run.out.section("Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in run.report["seconds"].items()))
    print(run.out.write(), flush=True)
    failed = failures(run.report)
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
