"""The first call of a new process: loopfuse's `loop(K)` against jax.jit of the hand-written `lax.scan`,
a weakly typed state, without a compile cache and with each one's persistent cache warm (figure "first_call").

    python bench/bench_first_call.py [--leaves 300] [--k 10] [--rounds 3] [--json PATH]   # ~10 min on 2 cores

Problem: the Adam step over `--leaves` parameter leaves of bench_compile.py, its params built with
``jnp.full(shape, 0.5)`` (weakly typed, as are Adam's moments of them; the step returns them strongly
typed, so a loop carries them promoted: `lax.scan` traces the step twice to find that out) and, for
comparison, the same state strongly typed (``--states weak strong``). Each timed value is the first call
of a fresh process, from the call to its results ready (imports and the state not counted):

* ``loopfuse``: ``loopfuse.compile_step(step, cache_dir=...).loop(K)(state, batch)``;
* ``jax.jit scan``: ``jax.jit(lambda s, b: lax.scan(step on b, s, length=K), donate_argnums=0)(state, batch)``,
  with jax's persistent compilation cache (``jax_compilation_cache_dir``, every entry kept:
  ``jax_persistent_cache_min_compile_time_secs=0``) where cached.

"uncached": no compile cache at all. "cached": the cache folder filled by an untimed process of the same
variant just before. Rounds alternate the variants' order; per variant the best (min) and the median of
the rounds, and the ratio of the bests and of the medians (loopfuse / jax.jit scan, < 1: loopfuse's
first call is shorter). Targets (issue 33, weak state): cached <= 1.1x, uncached <= 1.0x, on the bests.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"cached": 1.1, "uncached": 1.0}
VARIANTS = ("loopfuse", "jax.jit scan")
MODES = ("uncached", "cached")


def child(variant: str, state_kind: str, leaves: int, k: int, cache_dir: str) -> None:
    """One process: the first call of `variant` (cache folder `cache_dir`, "" for none), timed; prints JSON."""
    import jax
    import jax.numpy as jnp

    from bench_compile import OPT, problem

    fn, state, batch = problem(leaves)
    if state_kind == "weak":
        params = {name: jnp.full(p.shape, 0.5) for name, p in state[0].items()}
        state = (params, OPT.init(params))
    if variant == "loopfuse":
        import loopfuse
        call = loopfuse.compile_step(fn, cache_dir=cache_dir or None).loop(k)
    else:
        if cache_dir:
            jax.config.update("jax_compilation_cache_dir", cache_dir)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        call = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: fn(c, b), s, None, length=k), donate_argnums=0)
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(call(state, batch))
    out = {"first_call_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    if variant == "loopfuse":
        out["compiles"] = call.compile_count
    print(json.dumps(out))


def run(variant: str, state_kind: str, leaves: int, k: int, cache_dir: str) -> dict:
    """`child` in a fresh process (CPU jax, loopfuse's cache folder variable unset)."""
    env = {key: v for key, v in os.environ.items() if key != "LOOPFUSE_CACHE_DIR"}
    env["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, __file__, "--child", variant, state_kind, str(leaves), str(k), cache_dir],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def measure(state_kind: str, leaves: int, k: int, rounds: int) -> dict:
    """{mode: {variant: [first-call results per round]}}, the variants' order alternating round by round."""
    out: dict = {mode: {v: [] for v in VARIANTS} for mode in MODES}
    for r in range(rounds):
        for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            out["uncached"][variant].append(run(variant, state_kind, leaves, k, ""))
            with tempfile.TemporaryDirectory(prefix="loopfuse-first-call-") as folder:
                run(variant, state_kind, leaves, k, folder)      # fills the cache, untimed
                out["cached"][variant].append(run(variant, state_kind, leaves, k, folder))
            print(state_kind, r, variant, {m: out[m][variant][-1] for m in MODES}, file=sys.stderr, flush=True)
    return out


def table(results: dict, rounds: int) -> list[str]:
    lines = ["| state | cache | loopfuse s, best (median) | jax.jit scan s, best (median) | loopfuse / scan, bests "
             "(medians) | target |", "|---|---|---:|---:|---:|---|"]
    for state_kind, modes in results.items():
        for mode, runs in modes.items():
            s = {v: [r["first_call_s"] for r in runs[v]] for v in VARIANTS}
            best = min(s["loopfuse"]) / min(s["jax.jit scan"])
            median = statistics.median(s["loopfuse"]) / statistics.median(s["jax.jit scan"])
            target = TARGETS[mode] if state_kind == "weak" else None
            verdict = f"<= {target}x: {'met' if best <= target else '**missed**'}" if target else "—"
            lines.append(f"| {state_kind} | {mode} | " + " | ".join(
                f"{min(s[v]):.2f} ({statistics.median(s[v]):.2f})" for v in VARIANTS)
                + f" | {best:.2f}x ({median:.2f}x) | {verdict} |")
    return lines


def main() -> None:
    import harness
    ap = harness.parser(__doc__, rounds=3)
    ap.add_argument("--leaves", type=int, default=300)
    ap.add_argument("--k", type=int, default=10, help="steps per loop call (default 10)")
    ap.add_argument("--states", nargs="+", choices=["weak", "strong"], default=["weak", "strong"])
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        variant, state_kind, leaves, k, folder = ns.child
        return child(variant, state_kind, int(leaves), int(k), folder)
    if ns.quick:
        ns.leaves, ns.k, ns.rounds = 10, 2, 1
    report = harness.Report("first_call", ns)
    results = {s: measure(s, ns.leaves, ns.k, ns.rounds) for s in ns.states}
    report.section("\n".join([f"Adam over {ns.leaves} leaves, loop({ns.k}); the first call of a fresh process, wall "
                              f"seconds, best and median of {ns.rounds} alternating processes per variant", "",
                              *table(results, ns.rounds)]) + "\n", results=results)
    report.write()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
