"""The pass pipeline compile_step runs: dumps the IR after every pass, times each pass, and on a
failure writes a reproducer that ``loopfuse-opt --reproducer`` replays."""
import os
import tempfile
import time
from pathlib import Path

from jaxlib.mlir import ir

from .errors import LoopfuseError
from .pass_manager import Pass, PassFailure, parse_pipeline, run_pass
from .passes import AliasState, DropUnusedOutputs, WrapLoop

DUMP_ENV = "LOOPFUSE_DUMP_IR"
DEFAULT_PASSES = ("simplify",)


def build(passes=None, *, steps: int | None = None, donate: bool = True) -> list[Pass]:
    """Structural passes around the optimization passes (default ``DEFAULT_PASSES``).

    `passes` is a pipeline string or a sequence of pass objects and pipeline strings (``"simplify"``,
    ``"flatten-update{min-group=3}"``). drop-unused-outputs always runs first (it removes work),
    wrap-loop next to last for ``steps``, alias-state last.
    """
    items = [passes] if isinstance(passes, str) else DEFAULT_PASSES if passes is None else passes
    chosen = [q for p in items for q in (parse_pipeline(p) if isinstance(p, str) else [p])]
    specs = [DropUnusedOutputs(), *chosen]
    if steps is not None:
        specs.append(WrapLoop(steps=steps))
    if donate:
        specs.append(AliasState())
    return specs


def pipeline_string(specs) -> str:
    return "builtin.module(" + ",".join(str(s) for s in specs) + ")"


def dump_dir(explicit) -> Path | None:
    """The dump directory: the keyword, else $LOOPFUSE_DUMP_IR, else None."""
    d = explicit if explicit is not None else os.environ.get(DUMP_ENV)
    return Path(d) if d else None


class PipelineError(PassFailure, LoopfuseError):
    """A pass failed inside compile_step; `reproducer` is the file to replay with loopfuse-opt."""

    def __init__(self, failure: PassFailure, reproducer: Path):
        RuntimeError.__init__(self, f"{failure}\n  reproducer: {reproducer}\n"
                                    f"  replay with: loopfuse-opt --reproducer {reproducer}")
        self.spec, self.cause, self.reproducer = failure.spec, failure.cause, reproducer


def run(module: ir.Module, specs, on_stage=None, repro_dir: Path | None = None) -> dict:
    """Run `specs` on `module` in place; returns {pass name: seconds}.

    ``on_stage(name, module)`` sees "00-traced" and then "NN-after-<pass>" after every pass. On a
    failure a reproducer goes to `repro_dir` (a fresh temporary folder when None).
    """
    if on_stage:
        on_stage("00-traced", module)
    timings = {}
    for n, spec in enumerate(specs, start=1):
        snapshot = module.operation.clone()  # a failed pass may leave the IR half rewritten
        t0 = time.perf_counter()
        try:
            run_pass(module, spec)
        except PassFailure as e:
            raise PipelineError(e, _reproducer(str(snapshot), specs[n - 1:], repro_dir)) from e.cause
        finally:
            timings[spec.name] = timings.get(spec.name, 0.0) + time.perf_counter() - t0
        snapshot.erase()
        if on_stage:
            on_stage(f"{n:02d}-after-{spec.name}", module)
    return timings


def _reproducer(text: str, specs, folder: Path | None) -> Path:
    folder = folder if folder is not None else Path(tempfile.mkdtemp(prefix="loopfuse-repro-"))
    path = folder / "reproducer.mlir"
    path.write_text(f"// loopfuse-pipeline: {pipeline_string(specs)}\n{text}")
    return path
