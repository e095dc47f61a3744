"""The pass pipeline compile_step runs: dumps the IR after every pass, times each pass, and on a
failure writes a reproducer that ``loopfuse-opt --reproducer`` replays.

Dumps go to ``<dump root>/<name>-<digest>/``: `name` is the step function's name reduced to
``[A-Za-z0-9_-]``, `digest` hashes the traced module, the pass pipeline (passes, steps, donation)
and the compile settings, so two programs never share a folder. Files are written atomically.
"""
import hashlib
import os
import re
import tempfile
import time
import uuid
from pathlib import Path

from jaxlib.mlir import ir

from .. import settings
from ..errors import LoopfuseError, warn
from ..passes import AliasState, DropUnusedOutputs, FoldInit, MicroBatch, RollLayers, WrapLoop
from ..passes.module_pass import reports
from ..passes.vocabulary import FINAL_STAGE, PIPELINE_HEADER, TRACED_STAGE, after_pass_stage
from .pass_manager import Pass, PassFailure, parse_pipeline, run_pass

DUMP_ENV = "LOOPFUSE_DUMP_IR"
DEFAULT_PASSES: tuple = ()


def build(passes=None, *, steps: int | None = None, donate: bool = True,
          memory_budget: float | None = None, rows: int = 0, micro_batches: int | None = None,
          init: bool = False) -> list[Pass]:
    """Structural passes around the optimization passes (default ``DEFAULT_PASSES``).

    `passes` is a pipeline string or a sequence of pass objects and pipeline strings (``"simplify"``,
    ``"flatten-update{min-group=3}"``). drop-unused-outputs always runs first (it removes work), then
    micro-batch for `micro_batches` above 1, roll-layers for a `memory_budget` below 1, the chosen passes,
    wrap-loop for ``steps`` (its histories written in blocks of `rows`, where no pass adds loops of its own
    (`adds_control_flow`) or rewrites wrap-loop's loop),
    then the chosen passes that rewrite its loop (``after_wrap_loop``: pack-state), alias-state, and fold-init
    last for a loop started from its `init` (its program takes the init's arguments, not the state).
    """
    opt = chosen(passes)
    if memory_budget is not None and memory_budget < 1.0:
        opt.insert(0, RollLayers(memory_budget=float(memory_budget)))
    on_loop = [p for p in opt if getattr(p, "after_wrap_loop", False)]
    specs = [DropUnusedOutputs(), *([MicroBatch(slices=micro_batches)] if micro_batches and micro_batches > 1 else []),
             *(p for p in opt if not getattr(p, "after_wrap_loop", False))]
    if steps is not None:
        blocked = not on_loop and not any(p.adds_control_flow() for p in opt)
        specs.append(WrapLoop(steps=steps, rows=rows if blocked else 0))
    specs += on_loop
    if donate:
        specs.append(AliasState())
    if init:
        specs.append(FoldInit())
    return specs


def chosen(passes=None) -> list[Pass]:
    """The optimization passes `passes` names (see `build`), as pass objects."""
    items = [passes] if isinstance(passes, str) else DEFAULT_PASSES if passes is None else passes
    return [q for p in items for q in (parse_pipeline(p) if isinstance(p, str) else [p])]


def pipeline_string(specs) -> str:
    return "builtin.module(" + ",".join(str(s) for s in specs) + ")"


def dump_dir(explicit) -> Path | None:
    """The dump directory: the keyword, else $LOOPFUSE_DUMP_IR, else None."""
    return settings.folder(explicit, DUMP_ENV)


def dump_folder(root: Path, name: str, module: ir.Module, specs, settings=()) -> Path:
    """The dump folder of one program: ``root/<name>-<digest>`` (see the module docstring).

    `module` is the traced module (before any pass); `settings` whatever else changes the
    executable (devices, XLA options), hashed by its repr.
    """
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", name)[:64] or "step"
    key = "\n".join((str(module), pipeline_string(specs), repr(settings)))
    return root / f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: `path` is complete or absent, and readable
    as the umask allows an ordinary file (`tempfile.mkstemp`'s are the owner's alone)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class PipelineError(PassFailure, LoopfuseError):
    """A pass failed inside compile_step; `reproducer` is the file to replay with loopfuse-opt
    (None when it could not be written: `write_error` says why)."""

    def __init__(self, failure: PassFailure, reproducer: Path | None, write_error: OSError | None = None):
        where = (f"  reproducer: {reproducer}\n  replay with: loopfuse-opt --reproducer {reproducer}"
                 if reproducer is not None else f"  reproducer: not written ({write_error})")
        RuntimeError.__init__(self, f"{failure}\n{where}")
        self.spec, self.cause = failure.spec, failure.cause
        self.reproducer, self.write_error = reproducer, write_error


def run(module: ir.Module, specs, on_stage=None, repro_dir: Path | None = None) -> dict:
    """Run `specs` on `module` in place; returns {pass name: seconds}.

    ``on_stage(name, module)`` sees "00-traced" and then "NN-after-<pass>" after every pass. On a
    failure a reproducer goes to `repro_dir` (a fresh temporary folder when None).
    """
    if on_stage:
        on_stage(TRACED_STAGE, module)
    timings: dict[str, float] = {}
    for n, spec in enumerate(specs, start=1):
        snapshot = module.operation.clone()  # a failed pass may leave the IR half rewritten
        t0 = time.perf_counter()
        try:
            run_pass(module, spec)
        except PassFailure as e:
            raise PipelineError(e, *_reproducer(str(snapshot), specs[n - 1:], repro_dir)) from e.cause
        finally:
            timings[spec.name] = timings.get(spec.name, 0.0) + time.perf_counter() - t0
        snapshot.erase()
        if on_stage:
            on_stage(after_pass_stage(n, spec.name), module)
    return timings


def lower(module: ir.Module, specs, *, dump: Path | None = None, stages: dict | None = None) -> tuple[str, dict]:
    """Run `specs` on `module` in place: (final MLIR text, {pass name: seconds}).

    Each stage ("00-traced", "NN-after-<pass>", "final") is printed once, for the `dump` folder
    (``<stage>.mlir``, the last one ``NN-final.mlir``) and for `stages` (when given). A dump
    that cannot be written warns and stops; it never hides the pipeline's own result or failure.
    """
    writer = _DumpWriter(dump) if dump is not None else None

    def on_stage(name: str, text: str) -> None:
        if writer:
            writer.write(name, text)
        if stages is not None:
            stages[name] = text

    keep = writer is not None or stages is not None
    timings = run(module, specs, (lambda name, m: on_stage(name, str(m))) if keep else None, repro_dir=dump)
    text = str(module)
    if writer:
        writer.write(f"{len(specs) + 1:02d}-{FINAL_STAGE}", text)
        for name, report in reports(module.operation).items():
            writer.write(f"{name}.txt", report + "\n")
    if stages is not None:
        stages[FINAL_STAGE] = text
    return text, timings


def write_dump(folder: Path, name: str, text: str) -> None:
    """Write one file `name` (with its suffix) into a program's dump folder; one that cannot be written warns."""
    _DumpWriter(folder).write(name, text)


class _DumpWriter:
    """Writes stages into one dump folder; the first OSError (e.g. a full disk) warns and stops it."""

    def __init__(self, folder: Path):
        self.folder, self.failed = folder, False

    def write(self, name: str, text: str) -> None:
        if self.failed:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(self.folder / _file_name(name), text)
        except OSError as e:
            self.failed = True
            warn(f"loopfuse: IR dump stopped, cannot write {self.folder / _file_name(name)}: {e}")


def _file_name(stage: str) -> str:
    """A stage's dump file: ``<stage>.mlir`` (names that carry their own suffix are kept)."""
    return stage if "." in stage else f"{stage}.mlir"


def _reproducer(text: str, specs, folder: Path | None) -> tuple[Path | None, OSError | None]:
    """Write the reproducer: (its path, None), or (None, the OSError) when it cannot be written."""
    try:
        folder = folder if folder is not None else Path(tempfile.mkdtemp(prefix="loopfuse-repro-"))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "reproducer.mlir"
        write_atomic(path, f"{PIPELINE_HEADER}{pipeline_string(specs)}\n{text}")
        return path, None
    except OSError as e:
        return None, e
