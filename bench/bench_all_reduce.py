"""Data-parallel steps on 4 CPU devices: one all-reduce per gradient vs XLA's single combined one.

    python bench/bench_all_reduce.py [--rounds 9] [--out bench/out]

XLA:CPU combines every independent all-reduce of a program into one, so a data-parallel step
holds all gradients at once (as operands and results). loopfuse compiles a program whose
replicated state reaches `runtime.SPLIT_ALL_REDUCE_BYTES` with the combiner off
(`runtime.program_xla_options`). For each problem this script compiles `loopfuse.compile_step(...,
sharding="data")` both ways, ``xla_options={"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}``
("split") and ``{"xla_disable_hlo_passes": ""}`` ("combined"), checks that they compute bitwise
the same state, and reports their temporary bytes and the median over interleaved rounds of the
per-round speed ratio split / combined (4 devices emulated on this machine's cores: the timings
show the direction, not what real devices would get). Writes all_reduce.md and all_reduce.json.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_loop import init_state, make_batch, train_step  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import runtime  # noqa: E402

WAYS = {"split": {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}, "combined": {"xla_disable_hlo_passes": ""}}


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


def problems() -> dict:
    mlps = {"medium MLP 64-256-1": ((64, 256, 1), 128), "large MLP 512-2048-1": ((512, 2048, 1), 512),
            "8 x 1024x1024 MLP": ((1024,) * 9, 64)}
    out = {name: (train_step, init_state(layers), make_batch(layers, b)) for name, (layers, b) in mlps.items()}
    out["300 leaves of 8x8"] = many_leaves(300)
    return out


def measure(fn, state, batch, rounds: int) -> dict:
    steps = {w: loopfuse.compile_step(fn, keep_aux=("loss",), devices=jax.devices(), sharding="data", xla_options=o)
             for w, o in WAYS.items()}
    temps = {w: s.memory_stats(state, batch).temp for w, s in steps.items()}
    states = {w: jax.tree_util.tree_map(jnp.copy, state) for w in steps}
    for w, s in steps.items():
        for _ in range(2):
            states[w], _ = s(states[w], batch)
    equal = all(np.array_equal(a, b) for a, b in zip(*(jax.tree_util.tree_leaves(states[w]) for w in steps)))
    t0 = time.perf_counter()
    states["split"], _ = steps["split"](states["split"], batch)
    jax.block_until_ready(states["split"])
    calls = max(3, min(50, int(0.5 / (time.perf_counter() - t0))))  # ~0.5 s per variant and round
    times: dict = {w: [] for w in steps}
    for r in range(rounds):
        for w in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            x, t0 = states[w], time.perf_counter()
            for _ in range(calls):
                x, _ = steps[w](x, batch)
            jax.block_until_ready(x)
            times[w].append((time.perf_counter() - t0) / calls * 1e3)
            states[w] = x
    replicated = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    return dict(replicated_bytes=replicated, default="split" if replicated >= runtime.SPLIT_ALL_REDUCE_BYTES
                else "combined", bitwise_equal=equal, temp=temps, ms_per_step={w: statistics.median(t) for w, t in times.items()},
                split_speed=statistics.median(c / s for s, c in zip(times["split"], times["combined"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default="bench/out", type=Path)
    ns = ap.parse_args()
    md = [f"jax {jax.__version__}, {len(jax.devices())} CPU devices on {os.cpu_count()} cores, {ns.rounds} interleaved "
          f"rounds, loadavg at start {os.getloadavg()[0]:.1f}; loopfuse splits at "
          f"{runtime.SPLIT_ALL_REDUCE_BYTES / 2**20:.0f} MiB of replicated state", "",
          "| problem | replicated state MiB | loopfuse default | bitwise equal | temp MiB, combined | temp MiB, split "
          "| ms/step, combined | ms/step, split | split / combined speed |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    rows = {}
    for name, (fn, state, batch) in problems().items():
        r = rows[name] = measure(fn, state, batch, ns.rounds)
        md.append(f"| {name} | {r['replicated_bytes'] / 2**20:,.2f} | {r['default']} | {r['bitwise_equal']} | "
                  f"{r['temp']['combined'] / 2**20:,.2f} | {r['temp']['split'] / 2**20:,.2f} | "
                  f"{r['ms_per_step']['combined']:,.2f} | {r['ms_per_step']['split']:,.2f} | {r['split_speed']:.2f}x |")
        print(md[-1], flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "all_reduce.md").write_text("\n".join(md) + "\n")
    (ns.out / "all_reduce.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
