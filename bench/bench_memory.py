"""Compiled memory of loopfuse's step and loop vs jax.jit and a hand-written fori_loop, with and
without loopfuse's copy-free default (XLA copy insertion with region analysis).

    python bench/bench_memory.py [--k 10] [--out bench/out]

Every figure is from the compiled executables (argument + output - alias + temp), so it is
deterministic. Rows: the Adam MLPs of bench_loop.py (tiny, medium, large) and the 8-layer
1024x1024 tanh MLP (batch 64); then the same on 4 CPU devices (a subprocess with
--xla_force_host_platform_device_count=4; loopfuse sharding "data" and "params"; for "data" also
with XLA's all-reduce combiner back on, which loopfuse turns off for large replicated state). Also: the
"never materialize all gradients" figure (step temp bytes vs the bytes of all gradients).
Writes memory.md and memory.json into --out.
"""
import argparse
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

if "--devices4" in sys.argv:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_loop import SIZES, fori_train, init_state, make_batch, train_step  # noqa: E402

import loopfuse  # noqa: E402

OPTION = "xla_cpu_copy_insertion_use_region_analysis"
OFF = {OPTION: False}
COMBINED = {"xla_disable_hlo_passes": ""}  # XLA:CPU's all-reduce combiner back on (see runtime.SPLIT_ALL_REDUCE)
PROBLEMS = {name: (spec["layers"], spec["batch"]) for name, spec in SIZES.items()}
PROBLEMS["8x1024"] = ((1024,) * 9, 64)
TARGET = "8x1024"


def jit_stats(fn, state, batch, options=None, donate=True) -> loopfuse.MemoryStats:
    jitted = jax.jit(fn, donate_argnums=0 if donate else ())
    m = jitted.lower(state, batch).compile(compiler_options=options).memory_analysis()
    return loopfuse.MemoryStats(m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
                                m.temp_size_in_bytes)


def one_device(k: int) -> dict:
    out = {}
    for name, (layers, bsz) in PROBLEMS.items():
        state, batch = init_state(layers), make_batch(layers, bsz)
        rows = {"jax.jit (no donation)": jit_stats(train_step, state, batch, donate=False)}
        for label, options in (("defaults", None), ("option off", OFF)):
            step = loopfuse.compile_step(train_step, keep_aux=("loss",), xla_options=options)
            rows[f"loopfuse step, {label}"] = step.memory_stats(state, batch)
            rows[f"loopfuse loop({k}), {label}"] = step.loop(k).memory_stats(state, batch)
            rows[f"jax fori_loop({k}) + donation, {label}"] = jit_stats(
                partial(fori_train, steps=k), state, batch, {OPTION: True} if options is None else options)
        grads = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state[0]))
        out[name] = dict(layers=layers, batch=bsz, gradient_bytes=grads,
                         rows={n: m.__dict__ | {"peak": m.peak} for n, m in rows.items()})
    return out


def four_devices(k: int) -> dict:
    devices = jax.devices()
    out = {}
    for name in ("medium", "large", "8x1024"):
        layers, bsz = PROBLEMS[name]
        state, batch = init_state(layers), make_batch(layers, bsz)
        rows = {}
        for sharding in ("data", "params"):
            variants = (("defaults", None), ("option off", OFF)) + ((("all-reduces combined", COMBINED),)
                                                                     if sharding == "data" else ())
            for label, options in variants:
                step = loopfuse.compile_step(train_step, keep_aux=("loss",), devices=devices, sharding=sharding,
                                             xla_options=options)
                rows[f"{sharding}: step, {label}"] = step.memory_stats(state, batch)
                rows[f"{sharding}: loop({k}), {label}"] = step.loop(k).memory_stats(state, batch)
        out[name] = dict(layers=layers, batch=bsz, devices=len(devices),
                         rows={n: m.__dict__ | {"peak": m.peak} for n, m in rows.items()})
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f}"


def table(name: str, p: dict, base_peak=None) -> str:
    layers = p["layers"]
    shape = "-".join(map(str, layers)) if len(set(layers)) > 1 else f"{len(layers) - 1} x {layers[0]}x{layers[0]}"
    head = (f"#### {name}: MLP {shape}"
            f", batch {p['batch']}" + (f", {p['devices']} devices" if "devices" in p else "") + "\n\n"
            "| executable | argument MiB | output MiB | alias MiB | temp MiB | peak MiB |"
            + (" vs jit (no donation) |" if base_peak else "") + "\n|---|---:|---:|---:|---:|---:|"
            + ("---:|" if base_peak else "") + "\n")
    return head + "".join(
        f"| {n} | {mib(r['argument'])} | {mib(r['output'])} | {mib(r['alias'])} | {mib(r['temp'])} | {mib(r['peak'])} |"
        + (f" {r['peak'] / base_peak:.3f}x |" if base_peak else "") + "\n" for n, r in p["rows"].items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=10, help="steps per loop")
    ap.add_argument("--out", default="bench/out", type=Path)
    ap.add_argument("--devices4", action="store_true", help=argparse.SUPPRESS)  # the 4-device subprocess
    ns = ap.parse_args()
    if ns.devices4:
        print(json.dumps(four_devices(ns.k)))
        return
    single = one_device(ns.k)
    proc = subprocess.run([sys.executable, __file__, "--devices4", "--k", str(ns.k)], capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=1800)
    if proc.returncode:
        sys.exit(f"4-device run failed:\n{proc.stderr[-4000:]}")
    multi = json.loads(proc.stdout)
    md = [f"jax {jax.__version__}, K = {ns.k} steps per loop; MiB = 2^20 bytes; peak = argument + output - alias + temp.",
          "", "### One device", ""]
    md += [table(n, p, p["rows"]["jax.jit (no donation)"]["peak"]) for n, p in single.items()]
    md += ["### 4 CPU devices", ""] + [table(n, p) for n, p in multi.items()]
    t = single[TARGET]["rows"]
    loop, step = t[f"loopfuse loop({ns.k}), defaults"], t["loopfuse step, defaults"]
    jit_peak = t["jax.jit (no donation)"]["peak"]
    md += ["### Targets (8 x 1024x1024, Adam, batch 64)", "",
           "| figure | value | target | result |", "|---|---:|---|---|",
           f"| loop({ns.k}) peak - step peak | {loop['peak'] - step['peak']:+,} bytes | <= 0 | "
           f"{'PASS' if loop['peak'] <= step['peak'] else 'MISS (the loss history and loop counters)'} |",
           f"| loop({ns.k}) peak / jax.jit (no donation) peak | {loop['peak'] / jit_peak:.3f}x | <= 0.56x | "
           f"{'PASS' if loop['peak'] <= 0.56 * jit_peak else 'MISS'} |",
           f"| step temp / all gradients | {mib(step['temp'])} / {mib(single[TARGET]['gradient_bytes'])} MiB = "
           f"{step['temp'] / single[TARGET]['gradient_bytes']:.3f}x | about one layer (1/8 = 0.125x) | — |"]
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "memory.md").write_text("\n".join(md) + "\n")
    (ns.out / "memory.json").write_text(json.dumps(dict(one_device=single, four_devices=multi), indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
