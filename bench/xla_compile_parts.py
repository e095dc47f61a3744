"""Where XLA:CPU's compile time goes, jax.jit's step against the program `fit` runs rolled (issue 38's compile target).

    python bench/xla_compile_parts.py [--models eqx,linen,nnx] [--quick]    # ~1 min per model on 2 cores

For each model of bench_roll_models (full size; ``--quick``: its tiny size), two StableHLO programs: jax.jit's
step as written (donated) and fit's program on the stacked layout (``compile_step(step, memory_budget=0.0)
.loop(2)`` on ``pack(state, layers=True)``, after loopfuse's passes). Each is compiled by XLA:CPU in a child
process with XLA's own timers logged (``TF_CPP_MAX_VLOG_LEVEL=1``), which this script reads back: the HLO
passes' time, the code generation's ("for CPU using JIT"), and the kernels LLVM compiled, each once: XLA:CPU
compiles a fusion whose computation another fusion already has once, so the count is the program's distinct
kernels, and of them the row reads and writes (the kernels XLA names after a dynamic-slice or a
dynamic-update-slice). The counts are exact; the times are one compile each on
a shared machine, sizes only.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import bench_roll_models as models  # noqa: E402
from problems import fresh  # noqa: E402

import jax  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.compile import compiler  # noqa: E402

CHILD = """
import json, sys, time
import jax, jax.extend.backend as jeb
from loopfuse.compile import xla
text, values = open(sys.argv[1]).read(), json.loads(sys.argv[2])
devices = jax.devices("cpu")[:1]
t0 = time.perf_counter()
jeb.get_backend("cpu").compile_and_load(text, devices, xla.compile_options(devices, values, shardy=False))
print("LOOPFUSE_COMPILE_SECONDS", time.perf_counter() - t0, file=sys.stderr)
"""
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
LLVM = "kernels' LLVM"
TIMER = re.compile(r"\] (.*?) time: ([0-9.]+) (us|ms|s) ")
MODULE = re.compile(r"Compiled LLVM module: (\S+) time")


def programs(name: str, size: dict) -> dict:
    """{side: (StableHLO text, XLA options)} of jax.jit's step and fit's rolled program."""
    step, state, batch = models.MODELS[name](size)
    jit_text = jax.jit(step, donate_argnums=0).lower(fresh(state), batch).as_text()
    loop = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0).loop(2)
    stacked = loopfuse.pack(fresh(state), layers=True)
    plan = loop._plan(stacked, batch, 0, {})
    return {"jax.jit": (jit_text, {}), "fit's program": (compiler.lower(plan).text, dict(plan.xla.values))}


def xla_parts(text: str, values: dict) -> dict:
    """One compile of `text` in a child process, timed (``total``), and one more with XLA's timers logged
    (which slow it): seconds by part, and the kernels."""
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
        f.write(text)
    try:
        total = float(re.search(r"LOOPFUSE_COMPILE_SECONDS ([0-9.]+)", _child(f.name, values, {})).group(1))
        log = _child(f.name, values, {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_MAX_VLOG_LEVEL": "1"})
    finally:
        os.unlink(f.name)
    parts = {"hlo passes": 0.0, "codegen": 0.0, LLVM: 0.0}
    names = MODULE.findall(log)       # the kernels, one line each
    rows = {"row reads": sum("dynamic-slice" in n for n in names),
            "row writes": sum("dynamic-update-slice" in n for n in names)}
    for m in TIMER.finditer(log):
        what, seconds = m.group(1), float(m.group(2)) * UNITS[m.group(3)]
        if what.startswith("HLO pass: "):
            parts["hlo passes"] += seconds
        elif what.endswith("for CPU using JIT"):
            parts["codegen"] += seconds
        elif what.startswith("Compiled LLVM module"):
            parts[LLVM] += seconds
    return dict(total=total, kernels=len(names), **rows, **parts)


def _child(path: str, values: dict, env: dict) -> str:
    """The standard error of a child process compiling the program at `path`."""
    return subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(values)], env=dict(os.environ, **env),
                          capture_output=True, text=True, check=True).stderr


def main() -> None:
    ap = harness.parser(__doc__, rounds=1)
    ap.add_argument("--models", default="eqx,linen,nnx", help="comma-separated, of: " + ", ".join(models.MODELS))
    ns = ap.parse_args()
    out = harness.Report("xla_compile_parts", ns)
    rows = []
    for name in ns.models.split(","):
        for side, (text, values) in programs(name, models.TINY if ns.quick else models.GPT).items():
            rows.append(dict(model=name, side=side, ops=text.count(" = stablehlo.") + text.count('"stablehlo.'),
                             **xla_parts(text, values)))
            print(rows[-1], flush=True)
            out.save()
    lines = ["| model | program | StableHLO ops | kernels | of which row reads, writes | XLA compile s | logged: HLO passes s | "
             "codegen s | kernels' LLVM s (summed over threads) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['side']} | {r['ops']:,} | {r['kernels']} | {r['row reads']}, {r['row writes']} | "
              f"{r['total']:.2f} | {r['hlo passes']:.2f} | {r['codegen']:.2f} | {r[LLVM]:.2f} |" for r in rows]
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
