"""jaxlib 0.12.1's small-loop kernels: a loop whose iteration touches under 1 KiB, with and without them.

    .venv312/bin/python bench/small_loop_kernels.py [--rounds 21]      # figure "small_loop_kernels"

The corpus' scatter-add step (tests/py/corpus.py, ``segment_sum_scatter_add``: an 8x4 table, Adam): loopfuse's
``loop(2000)`` against jax.jit of a ``lax.scan`` of the same 2,000 steps (its data an argument too), us per
step, median of interleaved rounds; the same again in a process where XLA:CPU's SmallWhileLoopHoistingPass is
off (``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=0`` in that process's XLA_FLAGS:
a measurement, not something loopfuse sets). Also whether the loop's first 3 losses equal the scan's and 3
jitted steps', bitwise.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import corpus  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402

STEPS = 2000
OFF = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=0"


def measure(rounds: int) -> dict:
    """us per step of each loop (median of interleaved rounds) and the bitwise checks, in this process."""
    p = corpus.segment_sum_scatter_add()
    loop = loopfuse.compile_step(p.fn).loop(STEPS)
    scan = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: p.fn(c, b), s, None, length=STEPS))

    def timed(run):
        def once():
            state = fresh(p.state)
            t0 = time.perf_counter()
            jax.block_until_ready(run(state, p.batch))
            return (time.perf_counter() - t0) / STEPS * 1e6
        once()
        return once
    got = harness.interleave({"loopfuse loop(2000)": timed(loop), "jax.jit scan": timed(scan)}, rounds)
    three = loopfuse.compile_step(p.fn).loop(3)(fresh(p.state), p.batch)[1]["loss"]
    scan3 = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: p.fn(c, b), s, None, length=3))(fresh(p.state), p.batch)[1]
    s, steps = fresh(p.state), []
    for _ in range(3):
        s, aux = jax.jit(p.fn)(s, p.batch)
        steps.append(aux["loss"])
    return {"us": {k: float(np.median(v)) for k, v in got.items()},
            "loop_is_scan": np.asarray(three).tobytes() == np.asarray(scan3["loss"]).tobytes(),
            "loop_is_steps": np.asarray(three).tobytes() == np.asarray(steps).tobytes()}


def main() -> None:
    ap = harness.parser(__doc__, rounds=21)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.inner:
        print(json.dumps(measure(ns.rounds)))
        return
    out = harness.Report("small_loop_kernels", ns)
    rounds = 2 if ns.quick else ns.rounds
    rows = {"on (XLA's default)": measure(rounds)}
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + OFF).strip())
    done = subprocess.run([sys.executable, __file__, "--inner", "--rounds", str(rounds)], env=env,
                          capture_output=True, text=True, check=True)
    rows["off"] = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [f"| {name} | {r['us']['loopfuse loop(2000)']:.2f} | {r['us']['jax.jit scan']:.2f} | "
             f"{r['loop_is_scan']} | {r['loop_is_steps']} |" for name, r in rows.items()]
    out.section("The corpus' scatter-add step (8x4 table, Adam), us per step: median of interleaved rounds\n\n"
                "| small-loop kernels | loopfuse loop(2000) | jax.jit scan | loop(3) bitwise = scan | "
                "loop(3) bitwise = 3 jitted steps |\n|---|---:|---:|---|---|\n" + "\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
