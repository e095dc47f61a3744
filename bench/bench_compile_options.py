"""XLA compile time with loopfuse's default XLA options (copy-free loop carry) vs without them.

    python bench/bench_compile_options.py [--leaves 1000] [--rounds 2] [--out bench/out]

The Adam step over `--leaves` parameter leaves of bench_compile.py is traced and run through
loopfuse's passes once, as a step and as `.loop(10)`; then each final module is compiled by XLA
with `runtime.XLA_DEFAULTS` and with the copy-free option turned off, alternating, for `--rounds`
rounds. Reports the median XLA compile CPU seconds of the process (robust on a shared machine;
wall seconds are in the json) and their ratio (target: <= 1.2x), and the temp bytes of
each executable. Writes compile_options.md and compile_options.json into --out.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent))
from bench_compile import problem  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import runtime  # noqa: E402

OFF = {"xla_cpu_copy_insertion_use_region_analysis": False}
TARGET = 1.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/out", type=Path)
    ns = ap.parse_args()
    fn, state, batch = problem(ns.leaves)
    step = loopfuse.compile_step(fn)
    devices = [jax.devices()[0]]
    texts = {"step": step.lower(state, batch)["final"], "loop(10)": step.loop(10).lower(state, batch)["final"]}
    seconds = {(k, o): [] for k in texts for o in ("defaults", "off")}
    cpu = {(k, o): [] for k in texts for o in ("defaults", "off")}
    temp = {}
    for _ in range(ns.rounds):
        for kind, text in texts.items():
            for label, options in (("defaults", None), ("off", OFF)):
                t0, c0 = time.perf_counter(), time.process_time()
                executable = runtime.compile_module(text, devices, xla_options=options)
                seconds[kind, label].append(time.perf_counter() - t0)
                cpu[kind, label].append(time.process_time() - c0)
                temp[kind, label] = runtime.MemoryStats.of(executable).temp
                print(kind, label, f"{seconds[kind, label][-1]:.1f} s wall, {cpu[kind, label][-1]:.1f} s CPU", flush=True)
    rows = []
    for kind in texts:
        on, off = cpu[kind, "defaults"], cpu[kind, "off"]  # CPU seconds: robust on a shared machine
        ratio = statistics.median(a / b for a, b in zip(on, off))
        rows.append(dict(kind=kind, defaults_s=statistics.median(on), off_s=statistics.median(off), ratio=ratio,
                         rounds_defaults=on, rounds_off=off, wall_defaults=seconds[kind, "defaults"],
                         wall_off=seconds[kind, "off"], temp_defaults=temp[kind, "defaults"],
                         temp_off=temp[kind, "off"], met=ratio <= TARGET))
    lines = [f"Adam step over {ns.leaves} parameter leaves, XLA compile only (same module text; process CPU s), "
             f"{ns.rounds} interleaved rounds, jax {jax.__version__}, loadavg {os.getloadavg()[0]:.1f}", "",
             "| executable | XLA CPU s, defaults | XLA CPU s, option off | ratio (median of rounds) | target | temp, defaults | temp, off |",
             "|---|---:|---:|---:|---|---:|---:|"]
    lines += [f"| {r['kind']} | {r['defaults_s']:.1f} | {r['off_s']:.1f} | {r['ratio']:.2f}x | "
              f"{'PASS' if r['met'] else 'MISS'} (<= {TARGET}x) | {r['temp_defaults'] / 2**20:.2f} MiB | "
              f"{r['temp_off'] / 2**20:.2f} MiB |" for r in rows]
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "compile_options.md").write_text("\n".join(lines) + "\n")
    (ns.out / "compile_options.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
