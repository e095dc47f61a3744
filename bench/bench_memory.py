"""Compiled memory of loopfuse's step and loop vs jax.jit and a hand-written fori_loop (figure "memory").

    python bench/bench_memory.py [--k 10] [--json PATH]        # ~3 min on 2 cores

Every figure is from the compiled executables (argument + output - alias + temp), so it is
deterministic (no rounds). Rows: the Adam MLPs of bench_loop.py (tiny, medium, large) and the
8-layer 1024x1024 tanh MLP (batch 64). The jax.jit and fori_loop references appear as users write
them and compiled with the XLA options loopfuse compiled its executable with; loopfuse also with
its copy-free option (XLA copy insertion with region analysis) off. Then the same on 4 CPU devices
(a subprocess with --xla_force_host_platform_device_count=4; loopfuse sharding "data" and
"params"; for "data" also with XLA's all-reduce combiner back on). Also: the "never materialize
all gradients" figure (step temp bytes vs the bytes of all gradients).
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
import harness  # noqa: E402
from bench_loop import SIZES, fori_train, init_state, make_batch, train_step  # noqa: E402

import loopfuse  # noqa: E402

OPTION = "xla_cpu_copy_insertion_use_region_analysis"
OFF = {OPTION: False}
COMBINED = {"xla_disable_hlo_passes": ""}  # XLA:CPU's all-reduce combiner back on (see xla.SPLIT_ALL_REDUCE)
PROBLEMS = {name: (spec["layers"], spec["batch"]) for name, spec in SIZES.items()}
PROBLEMS["8x1024"] = ((1024,) * 9, 64)
TARGET = "8x1024"
SAME = "loopfuse's XLA options"


def jit_stats(fn, state, batch, options=None, donate=True) -> loopfuse.MemoryStats:
    return harness.jit_memory(harness.jit(fn, options, donate), state, batch)


def one_device(k: int) -> dict:
    out = {}
    fori = partial(fori_train, steps=k)
    for name, (layers, bsz) in PROBLEMS.items():
        state, batch = init_state(layers), make_batch(layers, bsz)
        step = loopfuse.compile_step(train_step, keep_aux=("loss",))
        loop = step.loop(k)
        off = loopfuse.compile_step(train_step, keep_aux=("loss",), xla_options=OFF)
        step_opts, loop_opts = harness.loopfuse_options(step, state, batch), harness.loopfuse_options(loop, state, batch)
        rows = {"jax.jit (no donation)": jit_stats(train_step, state, batch, donate=False),
                "jax.jit + donation": jit_stats(train_step, state, batch),
                f"jax.jit + donation, {SAME}": jit_stats(train_step, state, batch, step_opts),
                "loopfuse step": step.memory_stats(state, batch),
                "loopfuse step, copy-free option off": off.memory_stats(state, batch),
                f"jax fori_loop({k}) + donation": jit_stats(fori, state, batch),
                f"jax fori_loop({k}) + donation, {SAME}": jit_stats(fori, state, batch, loop_opts),
                f"loopfuse loop({k})": loop.memory_stats(state, batch),
                f"loopfuse loop({k}), copy-free option off": off.loop(k).memory_stats(state, batch)}
        grads = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state[0]))
        out[name] = dict(layers=layers, batch=bsz, gradient_bytes=grads, options=dict(step=step_opts, loop=loop_opts),
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
            variants = (("defaults", None), ("copy-free option off", OFF)) + ((("all-reduces combined", COMBINED),)
                                                                     if sharding == "data" else ())
            for label, options in variants:
                step = loopfuse.compile_step(train_step, keep_aux=("loss",), devices=devices, sharding=sharding,
                                             xla_options=options)
                rows[f"{sharding}: step, {label}"] = step.memory_stats(state, batch)
                rows[f"{sharding}: loop({k}), {label}"] = step.loop(k).memory_stats(state, batch)
        out[name] = dict(layers=layers, batch=bsz, devices=len(devices),
                         rows={n: m.__dict__ | {"peak": m.peak} for n, m in rows.items()})
    return out


def table(name: str, p: dict, base_peak=None) -> str:
    layers = p["layers"]
    shape = "-".join(map(str, layers)) if len(set(layers)) > 1 else f"{len(layers) - 1} x {layers[0]}x{layers[0]}"
    head = (f"#### {name}: MLP {shape}"
            f", batch {p['batch']}" + (f", {p['devices']} devices" if "devices" in p else "") + "\n\n"
            "| executable | argument MiB | output MiB | alias MiB | temp MiB | peak MiB |"
            + (" vs jit (no donation) |" if base_peak else "") + "\n|---|---:|---:|---:|---:|---:|"
            + ("---:|" if base_peak else "") + "\n")
    return head + "".join(
        f"| {n} | {harness.mib(r['argument'])} | {harness.mib(r['output'])} | {harness.mib(r['alias'])} | {harness.mib(r['temp'])} | {harness.mib(r['peak'])} |"
        + (f" {r['peak'] / base_peak:.3f}x |" if base_peak else "") + "\n" for n, r in p["rows"].items())


def main() -> None:
    ap = harness.parser(__doc__, rounds=1)
    ap.add_argument("--k", type=int, default=10, help="steps per loop")
    ap.add_argument("--devices4", action="store_true", help=argparse.SUPPRESS)  # the 4-device subprocess
    ns = ap.parse_args()
    if ns.devices4:
        print(json.dumps(four_devices(ns.k)))
        return
    report = harness.Report("memory", ns)
    single = one_device(ns.k)
    md = [f"K = {ns.k} steps per loop; MiB = 2^20 bytes; peak = argument + output - alias + temp. "
          f"{SAME}: {harness.options_text(single[TARGET]['options']['loop'])}.", "", "### One device", ""]
    md += [table(n, p, p["rows"]["jax.jit (no donation)"]["peak"]) for n, p in single.items()]
    t = single[TARGET]["rows"]
    loop, step, fori = t[f"loopfuse loop({ns.k})"], t["loopfuse step"], t[f"jax fori_loop({ns.k}) + donation, {SAME}"]
    jit_peak = t["jax.jit (no donation)"]["peak"]
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    md += ["### Targets (8 x 1024x1024, Adam, batch 64)", "",
           "| figure | value | target | result |", "|---|---:|---|---|",
           f"| step peak / jax.jit (no donation) peak | {step['peak'] / jit_peak:.3f}x | <= 0.6x | "
           f"{verdict(step['peak'] <= 0.6 * jit_peak)} |",
           f"| loop({ns.k}) peak - step peak | {loop['peak'] - step['peak']:+,} bytes | <= 0 | "
           f"{verdict(loop['peak'] <= step['peak'])} |",
           f"| loop({ns.k}) peak - fori_loop({ns.k}) + donation peak, {SAME} | {loop['peak'] - fori['peak']:+,} bytes "
           f"| — | — |",
           f"| loop({ns.k}) peak / jax.jit (no donation) peak | {loop['peak'] / jit_peak:.3f}x | <= 0.56x | "
           f"{verdict(loop['peak'] <= 0.56 * jit_peak)} |",
           f"| step temp / all gradients | {harness.mib(step['temp'])} / {harness.mib(single[TARGET]['gradient_bytes'])} "
           f"MiB = {step['temp'] / single[TARGET]['gradient_bytes']:.3f}x | about one layer (1/8 = 0.125x) | — |", ""]
    report.section("\n".join(md), one_device=single)
    proc = subprocess.run([sys.executable, __file__, "--devices4", "--k", str(ns.k)], capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=1800)
    if proc.returncode:
        sys.exit(f"4-device run failed:\n{proc.stderr[-4000:]}")
    multi = json.loads(proc.stdout)
    report.section("\n".join(["### 4 CPU devices", ""] + [table(n, p) for n, p in multi.items()]), four_devices=multi)
    report.write()


if __name__ == "__main__":
    main()
