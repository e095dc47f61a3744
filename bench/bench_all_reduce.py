"""Data-parallel steps on 4 CPU devices: one all-reduce per gradient vs XLA's single combined one (figure "all_reduce").

    python bench/bench_all_reduce.py [--rounds 5] [--json PATH]       # ~4 min on 2 cores

XLA:CPU combines every independent all-reduce of a program into one, so a data-parallel step
holds all gradients at once (as operands and results). loopfuse compiles a program whose
replicated state reaches `xla.SPLIT_ALL_REDUCE_BYTES` with the combiner off
(`xla.program_options`). For each problem this script compiles `loopfuse.compile_step(...,
sharding="data")` both ways, ``xla_options={"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}``
("split") and ``{"xla_disable_hlo_passes": ""}`` ("combined"), and `jax.jit` + donation of the
same step on the same mesh (state replicated, batch split on its first axis; every variant gets
the batch so placed) as users write it and
with the XLA options loopfuse's default compiled with. It checks that all compute bitwise the same
state, and reports temporary bytes and ms/step (medians over interleaved rounds, min-max, ratio
of medians; 4 devices emulated on this machine's cores: the timings show the direction, not what
real devices would get).
"""
import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from bench_loop import init_state, make_batch, train_step  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.compile import xla  # noqa: E402

WAYS = {"split": {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}, "combined": {"xla_disable_hlo_passes": ""}}
SAME = "jax.jit + donation, loopfuse's XLA options"


def many_leaves(n: int):
    """Adam over `n` 8x8 tanh layers read side by side: `n` small gradients (the case combining is for)."""
    rng = np.random.default_rng(0)
    params = {f"p{i:04d}": jnp.asarray(rng.normal(size=(8, 8)).astype(np.float32)) for i in range(n)}
    opt = optax.adam(1e-3)

    def loss(p, x):
        return sum(jnp.mean(jnp.tanh(x @ w) ** 2) for w in p.values())

    def fn(state, x):
        p, o = state
        value, grads = jax.value_and_grad(loss)(p, x)
        updates, o = opt.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), {"loss": value}
    return fn, (params, opt.init(params)), jnp.asarray(rng.normal(size=(64, 8)).astype(np.float32))


def problems(quick: bool) -> dict:
    mlps = {"medium MLP 64-256-1": ((64, 256, 1), 128), "large MLP 512-2048-1": ((512, 2048, 1), 512),
            "8 x 1024x1024 MLP": ((1024,) * 9, 64)}
    if quick:
        mlps = {"medium MLP 64-256-1": mlps["medium MLP 64-256-1"]}
    out = {name: (train_step, init_state(layers), make_batch(layers, b)) for name, (layers, b) in mlps.items()}
    out["300 leaves of 8x8"] = many_leaves(30 if quick else 300)
    return out


def placed(state, batch):
    """State replicated over the 4-device mesh, batch split on its first axis (what sharding="data" does)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    rep, split = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*p)) for p in ((), ("d",)))
    return jax.device_put(state, rep), jax.device_put(batch, split)


def measure(fn, state, batch, rounds: int) -> dict:
    make = lambda o: loopfuse.compile_step(fn, keep_aux=("loss",), devices=jax.devices(), sharding="data",  # noqa: E731
                                           xla_options=o)
    calls = {f"loopfuse, {w}": make(o) for w, o in WAYS.items()}
    default_opts = harness.loopfuse_options(make(None), state, batch)
    pstate, pbatch = placed(state, batch)
    jits = {"jax.jit + donation": harness.jit(fn), SAME: harness.jit(fn, default_opts)}
    temps = {**{v: s.memory_stats(state, batch).temp for v, s in calls.items()},
             **{v: harness.jit_memory(j, pstate, pbatch).temp for v, j in jits.items()}}
    calls.update(jits)
    states = {v: placed(jax.tree_util.tree_map(jnp.copy, state), batch)[0] for v in calls}
    for v, c in calls.items():
        for _ in range(2):
            states[v], _ = c(states[v], pbatch)
    leaves = [jax.tree_util.tree_leaves(s) for s in states.values()]
    equal = all(np.array_equal(a, b) for other in leaves[1:] for a, b in zip(leaves[0], other))
    t0 = time.perf_counter()
    jax.block_until_ready(calls["loopfuse, split"](states["loopfuse, split"], pbatch)[0])
    n = max(3, min(50, int(0.3 / (time.perf_counter() - t0))))  # ~0.3 s per variant and round
    states["loopfuse, split"] = placed(jax.tree_util.tree_map(jnp.copy, state), batch)[0]

    def timed(v):
        def run():
            x, t0 = states[v], time.perf_counter()
            for _ in range(n):
                x, _ = calls[v](x, pbatch)
            jax.block_until_ready(x)
            states[v] = x
            return (time.perf_counter() - t0) / n * 1e3
        return run

    ms = harness.interleave({v: timed(v) for v in calls}, rounds)
    replicated = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    default = "split" if replicated >= xla.SPLIT_ALL_REDUCE_BYTES else "combined"
    return dict(replicated_bytes=replicated, default=default, options=default_opts, bitwise_equal=equal, temp=temps,
                ms_per_step={v: harness.summary(t) for v, t in ms.items()},
                split_vs_combined=harness.compare(ms["loopfuse, split"], ms["loopfuse, combined"], False),
                default_vs_jit=harness.compare(ms[f"loopfuse, {default}"], ms["jax.jit + donation"], False),
                default_vs_same=harness.compare(ms[f"loopfuse, {default}"], ms[SAME], False))


def main() -> None:
    ns = harness.parser(__doc__, rounds=5).parse_args()
    report = harness.Report("all_reduce", ns)
    rounds = 2 if ns.quick else ns.rounds
    rows, temp_md, speed_md = {}, [], []
    for name, (fn, state, batch) in problems(ns.quick).items():
        r = rows[name] = measure(fn, state, batch, rounds)
        t, ms = r["temp"], r["ms_per_step"]
        temp_md.append(f"| {name} | {harness.mib(r['replicated_bytes'])} | {r['default']} | {r['bitwise_equal']} | "
                       + " | ".join(harness.mib(t[v]) for v in t) + " |")
        speed_md.append(f"| {name} | " + " | ".join(f"{ms[v]['median']:,.2f} ({ms[v]['min']:,.2f}–{ms[v]['max']:,.2f})"
                                                     for v in ms)
                        + f" | {harness.ratio_text(r['split_vs_combined'])} | {harness.ratio_text(r['default_vs_jit'])} "
                        f"| {harness.ratio_text(r['default_vs_same'])} |")
        print(temp_md[-1], speed_md[-1], sep="\n", flush=True)
    variants = list(next(iter(rows.values()))["temp"])
    md = [f"4 CPU devices on {len(os.sched_getaffinity(0))} cores, {rounds} interleaved rounds; loopfuse splits at "
          f"{xla.SPLIT_ALL_REDUCE_BYTES / 2**20:.0f} MiB of replicated state; \"{SAME}\" = the options of "
          "loopfuse's default for that problem. Bitwise equal: all four executables' states after 2 steps.", "",
          "| problem | replicated state MiB | loopfuse default | bitwise equal | " + " | ".join(f"temp MiB, {v}" for v in variants)
          + " |", "|---|---:|---|---|" + "---:|" * len(variants)] + temp_md
    md += ["", "ms/step, median (min–max over rounds); speed ratios of medians (> 1: the first is faster):", "",
           "| problem | " + " | ".join(variants) + " | split / combined | loopfuse default / jax.jit | "
           "loopfuse default / jax.jit, same options |", "|---|" + "---:|" * (len(variants) + 3)] + speed_md
    report.section("\n".join(md) + "\n", problems=rows)
    report.write()


if __name__ == "__main__":
    main()
