"""One short run that checks loopfuse on the machine's first device: results, speed, memory, cache.

    python bench/gpu_check.py [--quick] [--out bench/out/gpu_check]

Made for a lent GPU (jax 0.11+ with its CUDA plugin as preinstalled there, loopfuse installed from
a wheel with --no-deps: bench/gpu_check.sh); it runs on any platform, and `--quick` shrinks every
problem so the whole check takes seconds on a CPU (the suite runs it). It installs nothing.

1. environment: versions, devices, the route of each private jax API (`_jax_compat.status()`).
2. results: one step bitwise against jax.jit, `loop(K)` against the hand-written `lax.scan` of K
   steps in jax.jit; `until` stops at the step jax.jit's losses say, with the state of a scan of
   that many steps; a `jax.debug.callback` runs once per step, K times in `loop(K)`, with jax.jit's
   values.
3. speed: steps/s of jax.jit + donation per step, a hand-written `lax.scan` of K steps in one
   donating jit, the loopfuse step and loopfuse `loop(K)`, each round running K steps per variant,
   the order alternating round by round; medians, and ratios against jax.jit + donation.
   Problems: a tiny MLP, a 3-layer 4096-wide MLP and a 6-layer 512-wide GPT-style model (Adam).
4. memory: compiled bytes of `loop(K)` with loopfuse's default XLA options, and with the platform's
   copy-insertion option (`xla_<platform>_copy_insertion_use_region_analysis`) on and off, whose
   results are compared bitwise.
5. compile cache: two processes compile the same step into one cache folder; the second loads it
   (XLA does not run) and computes the same bits.

Writes gpu_check.json and gpu_check.md into --out and prints the markdown; exits 1 when a check of
sections 2, 4 or 5 fails.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "py")]
import bench_loop  # noqa: E402
from problems import assert_trees_equal  # noqa: E402

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


# ---- problems: (step, init_state, batch) ---------------------------------------------------
def adam_step(loss_fn):
    def step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss}
    return step


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
        return adam_step(bench_loop.loss_fn), params, bench_loop.make_batch(spec["layers"], spec["batch"])
    params = gpt_params(spec)
    tokens = jax.random.randint(jax.random.key(1), (spec["batch"], spec["seq"] + 1), 0, spec["vocab"])
    return adam_step(gpt_loss(spec["heads"])), params, (tokens[:, :-1], tokens[:, 1:])


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
    """Per variant: median steps/s over rounds (K steps per variant and round) and the median
    per-round ratio to jax.jit + donation."""
    states = {v: jax.block_until_ready(f(fresh(params), batch)[0]) for v, (f, _) in runs.items()}  # warm up
    rates: dict = {v: [] for v in runs}
    for r in range(rounds):
        for v in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            f, per_call = runs[v]
            t0 = time.perf_counter()
            for _ in range(k // per_call):
                states[v], _ = f(states[v], batch)
            jax.block_until_ready(states[v])
            rates[v].append(k / (time.perf_counter() - t0))
    return {v: {"steps_per_s": statistics.median(x),
                "vs_jit": statistics.median(a / b for a, b in zip(x, rates[BASELINE]))} for v, x in rates.items()}


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
    with tempfile.TemporaryDirectory(prefix="loopfuse-gpu-check-") as folder:
        runs = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, __file__, "--cache-child", folder], capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode:
                return {"ok": False, "detail": proc.stderr[-2000:]}
            runs.append(json.loads(proc.stdout.splitlines()[-1]))
    first, second = runs
    ok = first["xla_ran"] and not second["xla_ran"] and first["bits"] == second["bits"]
    return {"ok": ok, "first_call_s": [first["first_call_s"], second["first_call_s"]],
            "xla_ran": [first["xla_ran"], second["xla_ran"]], "same_bits": first["bits"] == second["bits"]}


# ---- report -------------------------------------------------------------------------------
def environment() -> dict:
    import jaxlib
    devices = jax.devices()
    return {"python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "loopfuse": loopfuse.__file__, "platform": devices[0].platform,
            "devices": [d.device_kind for d in devices], "compat": _jax_compat.status()}


def markdown(report: dict) -> str:
    env, k = report["environment"], report["k"]
    lines = [f"# loopfuse check on {env['platform']} ({', '.join(sorted(set(env['devices'])))})", "",
             f"Python {env['python']}, jax {env['jax']}, jaxlib {env['jaxlib']}, loopfuse {env['loopfuse']}; "
             f"private jax APIs: {env['compat']}; K = {k}{' (--quick)' if report['quick'] else ''}.", "",
             "## Results (bitwise against jax.jit)", "", "| problem | check | | detail |", "|---|---|---|---|"]
    lines += [f"| {r['problem']} | {r['check']} | {'ok' if r['ok'] else '**FAILED**'} | {r['detail']} |"
              for r in report["results"]]
    lines += ["", "## Steps/s (median; ratio: median per-round ratio to jax.jit + donation)", ""]
    variants = list(next(iter(report["speed"].values())))
    lines += ["| problem | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    for name, row in report["speed"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[v]['steps_per_s']:,.0f} ({row[v]['vs_jit']:.2f}x)"
                                                  for v in variants) + " |")
    lines += ["", f"## Memory of loop({k}) (compiled, MiB)", "",
              "| problem | XLA options | arguments | outputs | aliased | temporaries | peak | results |",
              "|---|---|---|---|---|---|---|---|"]
    for name, m in report["memory"].items():
        for setting, r in m["rows"].items():
            mib = [f"{r[f] / 2**20:,.2f}" for f in ("argument", "output", "alias", "temp", "peak")]
            lines.append(f"| {name} | {setting} | " + " | ".join(mib) +
                         f" | {'bitwise equal' if m['bitwise_equal'] else '**differ**'} |")
    c = report["cache"]
    lines += ["", "## Compile cache across two processes", ""]
    lines.append(f"{'ok' if c['ok'] else '**FAILED**'}: " + (
        f"first calls {c['first_call_s'][0]:.2f} s then {c['first_call_s'][1]:.2f} s; XLA ran {c['xla_ran']}; "
        f"same bits: {c['same_bits']}" if "xla_ran" in c else c["detail"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny problems, one round (a smoke test, not a measurement)")
    ap.add_argument("--out", default="bench/out/gpu_check")
    ap.add_argument("--cache-child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.cache_child:
        cache_child(ns.cache_child)
        return 0
    cfg = QUICK if ns.quick else FULL
    t0 = time.perf_counter()
    report: dict = {"quick": ns.quick, "k": cfg["k"], "environment": environment(), "results": [], "speed": {},
                    "memory": {}, "seconds": {}}
    platform = report["environment"]["platform"]
    for i, (name, spec) in enumerate(cfg["problems"].items()):
        t1 = time.perf_counter()
        step, params, batch = problem(spec)
        runs = variants(step, cfg["k"])
        result_checks(report["results"], name, step, runs, params, batch, cfg["k"], tiny=i == 0)
        report["speed"][name] = speed(runs, params, batch, cfg["k"], cfg["rounds"])
        if i >= len(cfg["problems"]) - MEMORY_PROBLEMS:
            report["memory"][name] = memory(step, runs[f"loopfuse loop({cfg['k']})"][0], params, batch, cfg["k"],
                                            platform)
        report["seconds"][name] = time.perf_counter() - t1
    t1 = time.perf_counter()
    report["cache"] = compile_cache()
    report["seconds"] |= {"compile cache": time.perf_counter() - t1, "all": time.perf_counter() - t0}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    text = markdown(report) + "\nSeconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()) + "\n"
    (out / "gpu_check.md").write_text(text)
    print(text)
    ok = (all(r["ok"] for r in report["results"]) and report["cache"]["ok"]
          and all(m["bitwise_equal"] for m in report["memory"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
