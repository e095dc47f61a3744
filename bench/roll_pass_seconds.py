"""roll-layers' own time on bench_roll_models' models: the pass alone, on the step as traced (issue 38's compile target).

    python bench/roll_pass_seconds.py [--models linen,encdec] [--rounds 7] [--quick]    # ~3 min on 2 cores

Each model (full size; ``--quick``: its tiny size) is traced once on its packed state and run through
drop-unused-outputs, the passes before roll-layers (`compile_step(..., passes="drop-unused-outputs")`);
then, per round, the module is parsed afresh and `RollLayers(memory_budget=0.0)` runs on it, timed as
this process's CPU seconds (the pass is single-threaded Python over MLIR's bindings). Reports the median
(min-max) of the rounds and the layers rolled. bench_roll_models' ``passes s`` column is every pass inside
a whole compile; this one isolates the pass, so that a change to it can be measured (run it on two trees:
``PYTHONPATH=<other tree>/python:<other tree>`` takes that tree's loopfuse).
"""
import sys
import time
from pathlib import Path

from jaxlib.mlir import ir

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import bench_roll_models as models  # noqa: E402
import harness  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.compile.mlir_context import make_context  # noqa: E402
from loopfuse.passes.module_pass import reports  # noqa: E402
from loopfuse.passes.roll_layers import RollLayers  # noqa: E402


def traced(name: str, size: dict) -> str:
    """The model's step on its packed state, as roll-layers receives it."""
    step, state, batch = models.MODELS[name](size)
    call = loopfuse.compile_step(step, keep_aux=("loss",), passes="drop-unused-outputs")
    return call.lower(loopfuse.pack(fresh(state), layers=True), batch)["final"]


def pass_seconds(text: str, rounds: int) -> tuple[list[float], str]:
    """CPU seconds of each round of roll-layers on `text` (parsed afresh each round), and its report."""
    seconds, report = [], ""
    with make_context():
        for _ in range(rounds):
            module = ir.Module.parse(text)
            with ir.Location.unknown():
                t0 = time.process_time()
                RollLayers(memory_budget=0.0).apply(module.operation)
                seconds.append(time.process_time() - t0)
            report = reports(module.operation).get("roll-layers", "")
    return seconds, report


def main() -> None:
    ap = harness.parser(__doc__, rounds=7)
    ap.add_argument("--models", default=",".join(models.MODELS), help="comma-separated, of: " + ", ".join(models.MODELS))
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds = 2
    out = harness.Report("roll_pass_seconds", ns)
    rows = []
    for name in ns.models.split(","):
        seconds, report = pass_seconds(traced(name, models.TINY if ns.quick else models.GPT), ns.rounds)
        rows.append(dict(model=name, seconds=harness.summary(seconds), rolled=[line.split("]: ")[0] + "]" for line in
                                                                              report.splitlines()]))
        print(rows[-1], flush=True)
        out.save()
    lines = [f"roll-layers alone on the traced step, CPU s: median (min–max) of {ns.rounds} rounds", "",
             "| model | roll-layers CPU s | what it rolled |", "|---|---:|---|"]
    lines += [f"| {r['model']} | {r['seconds']['median']:.3f} ({r['seconds']['min']:.3f}–{r['seconds']['max']:.3f}) | "
              f"{'; '.join(r['rolled'])[:90]} |" for r in rows]
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
