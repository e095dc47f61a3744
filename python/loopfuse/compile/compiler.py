"""The one way to a step's program, in stages as jax's own ``jax.jit(f).trace(...).lower().compile()``:

* `trace`: the step function to tagged StableHLO, and what its program will be (a `Plan`: the passes it
  runs, its XLA options, the folder its IR is dumped to);
* `lower`: the passes, on a copy of the traced module (a `Lowered`: the module handed to XLA);
* `compile`: the executable, loaded from the persistent compile cache (a hit is the executable it returns,
  and no pass runs) or `lower` then XLA.

Each is a plain function of the previous stage's result, and the stages keep no state. A call's program is
`build` (all three; `Step` counts and caches what it builds, and `verify` builds those of the options it
bisects); `Step.lower` stops after `lower`, and so does `Step.memory_report`, which compiles the lowered
module its own way.
"""
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from jaxlib.mlir import ir

from ..errors import InitFoldError, StateMismatchError, warn
from ..run import runtime
from ..state import packed
from ..state.data import Dataset
from ..state.leaves import aval, is_key, keyed_paths
from . import cache as compile_cache, pipeline, stopping, trace as tracing, xla
from .executable import Executable
from .mlir_context import copy_module, fingerprint
from .options import StepOptions
from .traced import Traced


@dataclass(frozen=True)
class Plan:
    """A step traced for one signature under its options, and what its program will be."""

    traced: Traced
    options: StepOptions
    name: str                        # the step function's (`trace.fn_name`)
    avals: tuple                     # of the flat state and batch leaves it is traced for
    batch_paths: tuple               # the `keyed` path of each batch leaf
    passes: tuple                    # the passes it runs (`pipeline.build`, wrap-loop's rows decided)
    xla: runtime.ProgramOptions      # the XLA options it is compiled with, and why
    dump: Path | None                # where its IR is dumped (`pipeline.dump_folder`), or None
    seconds: dict                    # the time so far, by stage ("trace")

    @property
    def devices(self) -> list:
        return self.options.program_devices


@dataclass(frozen=True)
class Lowered:
    """A plan's module after its passes: what XLA compiles."""

    plan: Plan
    module: ir.Module
    text: str
    seconds: dict                    # the plan's, and each pass's
    xla: runtime.ProgramOptions      # the XLA options it is compiled with (`_program`)


def build(fn: Callable, options: StepOptions, state, batch, static: dict) -> Executable:
    """The executable of ``fn(state, batch, **static)`` under `options`: `compile` of `trace`."""
    return compile(trace(fn, options, state, batch, static))


def trace(fn: Callable, options: StepOptions, state, batch, static: dict) -> Plan:
    """`fn` traced for (state, batch, static) as `options` run it (placement, stop, loop), and its plan: the
    passes (a loop's histories written in blocks where that keeps its body's buffers small enough for XLA:CPU
    to run it sequentially, `xla.history_rows`), the XLA options, the dump folder."""
    t0 = time.perf_counter()
    x = state
    if options.init is not None:        # the state the loop starts from, made from x inside its program
        if isinstance(batch, Dataset):
            raise TypeError("a loop started from its init takes a fixed batch, not a Dataset")
        state = jax.eval_shape(options.init, x, batch)
        if any(map(is_key, jax.tree_util.tree_leaves(state))):
            raise InitFoldError("a loop started from its init cannot carry typed PRNG keys in its state: make "
                                "them raw data (jax.random.key_data), or compute the initial state apart")
    packed.check_not_nested(state)
    if options.micro_batches is not None and options.micro_batches > 1:
        _check_slices(batch, options.micro_batches, options.placement)
    traced = tracing.trace(fn, state, batch, static, options.keep_aux, options.placement,
                           stopping.flag(options.until, options.stop_on_nonfinite), stopped_arg=options.stops,
                           loop=options.steps is not None, packed_paths=packed.buffer_paths(state),
                           dataset=isinstance(batch, Dataset))
    if options.init is not None:
        traced = tracing.with_init(traced, options.init, x, batch)
    avals = tuple(map(aval, jax.tree_util.tree_leaves((x, batch))))
    return _planned(traced, options, tracing.fn_name(fn), avals, tuple(keyed_paths(batch)), {"trace": time.perf_counter() - t0})


def replan(plan: Plan, options: StepOptions) -> Plan:
    """`plan`'s traced step under other `options` that trace alike (the passes, `memory_budget`,
    `micro_batches`; not the placement, aux, stop or loop): its passes, XLA options and dump folder, no new
    trace. `memory_plan` plans so, over one trace. The batch's rows must divide into the options'
    micro-batches (`slice_counts`)."""
    return _planned(plan.traced, options, plan.name, plan.avals, plan.batch_paths, plan.seconds)


def _planned(traced: Traced, options: StepOptions, name: str, avals: tuple, batch_paths: tuple,
             seconds: dict) -> Plan:
    platform = options.program_devices[0].platform
    passes = tuple(options.pipeline(xla.history_rows(traced.module, platform, options.steps)))
    program = _program_options(traced, options, avals[:len(traced.state_paths)], passes)
    root = pipeline.dump_dir(options.dump_ir)
    dump = None if root is None else pipeline.dump_folder(
        root, name, traced.module, passes, (options.device, options.devices, options.xla_options))
    return Plan(traced, options, name, avals, batch_paths, passes, program, dump, dict(seconds))


def lower(plan: Plan, *, stages: dict | None = None, note: str | None = None) -> Lowered:
    """Run `plan`'s passes on a copy of its traced module (the plan stays as traced), dumping every stage to
    its dump folder (with `note`, where the executable comes from, and the XLA options, as ``executable.txt``)
    and into `stages` when given (see `pipeline.lower`)."""
    module = copy_module(plan.traced.module)
    text, timings = pipeline.lower(module, list(plan.passes), dump=plan.dump, stages=stages)
    program = _program(plan, module)
    if plan.dump is not None and note is not None:
        pipeline.write_dump(plan.dump, "executable.txt", note + str(program))
    return Lowered(plan, module, text, {**plan.seconds, **timings}, program)


def compile(plan: Plan, lowered: Lowered | None = None) -> Executable:
    """`plan`'s executable: loaded from the compile cache, or `lower` then XLA (and stored); `lowered`, the
    plan's `lower` when the caller has it, saves running the passes again (not with a dump folder, whose
    passes run also on a hit, for the dump)."""
    devices, traced = plan.devices, plan.traced
    shardy = xla.uses_shardy(traced.module)
    t0 = time.perf_counter()
    where = compile_cache.folder(plan.options.cache_dir)
    # keyed by the plan's options, from which the program's follow (`_program`)
    passes, options = pipeline.pipeline_string(plan.passes), xla.compile_options(devices, plan.xla.values, shardy=shardy)
    kept_somewhere = where is not None or compile_cache.RECENT.size > 0
    # (a host callback lives in the trace that made it: such a program is kept nowhere)
    fingerprinted = fingerprint(traced.module) if kept_somewhere and not traced.effects.host_callbacks else None
    key = compile_cache.key(fingerprinted, passes, devices, options) if fingerprinted is not None else None
    recent = key if fingerprinted is not None and compile_cache.RECENT.keeps(fingerprinted) else None
    entry = compile_cache.Entry.of(where, key, devices, options) if where and key is not None else None
    kept = compile_cache.RECENT.load(recent, traced.module.context) if recent is not None else None
    loaded = kept or (entry.load(traced.module.context) if entry is not None else None)
    if loaded is not None and kept is None and recent is not None:     # read from disk: kept in memory too
        compile_cache.RECENT.store(recent, *loaded)
    cache_seconds = time.perf_counter() - t0
    if plan.dump is not None or lowered is None and loaded is None:
        lowered = lower(plan, note=_origin(entry, loaded, kept is not None, where is not None))
    seconds = dict(lowered.seconds if lowered is not None else plan.seconds)
    if loaded is not None:
        executable, module = loaded
        program = _program(plan, module)
    else:
        assert lowered is not None
        program = lowered.xla
        t0 = time.perf_counter()
        executable = xla.compile_module(lowered.text, devices, xla.compile_options(devices, program.values, shardy=shardy),
                                        host_callbacks=traced.effects.host_callbacks)
        seconds["xla"] = time.perf_counter() - t0
        module = lowered.module
        t0 = time.perf_counter()
        if entry is not None:
            entry.store(executable, module)
        if recent is not None:
            compile_cache.RECENT.store(recent, executable, module)
        cache_seconds += time.perf_counter() - t0
    if where is not None:
        seconds["cache"] = cache_seconds
    built = Executable.build(traced, module, executable, plan.avals, plan.options.placement, devices[0],
                             plan.options.donate, program, plan.passes, seconds)
    refused = built.reports.get("micro-batch", "")
    if refused.startswith("did not"):
        asked = "the micro-batch pass" if plan.options.micro_batches is None else f"micro_batches={plan.options.micro_batches}"
        warn(f"loopfuse: {asked} not applied, the step runs on the whole batch: {refused}")
    return built


def slice_counts(batch, placement) -> list[int]:
    """The micro-batch counts above 1 that `batch` divides into (every leaf's leading axis, a Dataset's
    batch_size, on each device the batch is split over), fewest first; none for a batch of scalars."""
    devices, sizes = _rows(batch, placement)
    rows = math.gcd(*(n for _, n in sizes)) // devices if sizes and all(n % devices == 0 for _, n in sizes) else 0
    return [m for m in range(2, rows + 1) if rows % m == 0]


def _rows(batch, placement) -> tuple[int, list[tuple[str, int]]]:
    """(the devices the batch is split over, (what, rows) of each batch leaf with a leading axis)."""
    devices = len(placement.devices) if placement is not None and placement.mode != "members" else 1
    return devices, [("the Dataset's batch_size", batch.batch_size)] if isinstance(batch, Dataset) else [
        (f"batch{path}", np.shape(x)[0]) for path, x in zip(keyed_paths(batch), jax.tree_util.tree_leaves(batch))
        if np.ndim(x)]


def _check_slices(batch, slices: int, placement) -> None:
    """Every batch leaf's leading axis (a Dataset's batch_size) divides into `slices` slices on each
    device the batch is split over (`micro_batches`); a StateMismatchError names the leaf that does not."""
    devices, sizes = _rows(batch, placement)
    parts = slices * devices
    for what, n in sizes:
        if n % parts:
            raise StateMismatchError(
                f"{what} has {n} rows, which do not divide into micro_batches={slices} slices"
                + (f" on each of {devices} devices" if devices > 1 else ""))


def _program_options(traced: Traced, options: StepOptions, state_avals, passes) -> runtime.ProgramOptions:
    """The XLA options of `traced`'s program (`xla.program_options`), given the bytes of floating-point
    state it replicates over a mesh and the `passes` it runs (those that may add control flow of their own)."""
    replicated = 0
    if traced.arg_shardings is not None:
        for a, s in zip(state_avals, traced.arg_shardings):
            if s.is_fully_replicated and jax.numpy.issubdtype(a.dtype, jax.numpy.floating):
                replicated += a.size * a.dtype.itemsize
    return xla.program_options(traced.module, options.program_devices[0].platform, replicated,
                                   options.xla_options, [p.name for p in passes if p.adds_control_flow()])


def _program(plan: Plan, module: ir.Module) -> runtime.ProgramOptions:
    """The XLA options `plan`'s program, `module` after its passes, is compiled with: the plan's, decided before
    the passes ran (the compile cache's key) as if each pass that may add control flow of its own added some;
    or, where one added none (roll-layers that rolled nothing, micro-batch that did not cut), those decided
    without it."""
    ran = [p for p in plan.passes if p.adds_control_flow()]
    added = [p for p in ran if p.added_control_flow(module.operation)]
    if len(added) == len(ran):
        return plan.xla
    return _program_options(plan.traced, plan.options, plan.avals[:len(plan.traced.state_paths)], added)


def _origin(entry: compile_cache.Entry | None, loaded, kept: bool, cache_set: bool) -> str:
    """Where the executable comes from, for the IR dump's executable.txt."""
    if kept:
        return "compiled earlier in this process (the compile cache's memory); XLA did not run\n"
    if loaded is not None:
        assert entry is not None
        return f"loaded from the compile cache ({entry.path}); XLA did not run\n"
    if entry is not None:
        return f"compiled by XLA and stored in the compile cache ({entry.path})\n"
    return "compiled by XLA; not cached (the program has host callbacks)\n" if cache_set else "compiled by XLA\n"
