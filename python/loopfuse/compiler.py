"""The one way a step's program is compiled, in stages as jax's own ``jax.jit(f).trace(...).lower().compile()``:
`trace` (the step function to tagged StableHLO), then `compile` (the passes and XLA, or the persistent
compile cache: a hit is the executable it returns), each a plain function of the previous stage's result.

`build` runs both; `Step` builds the programs of its calls with it, and `verify` those of the options it
bisects. A Step counts and caches what it builds; the stages keep no state.
"""
import time
from pathlib import Path
from typing import Callable

import jax

from . import cache as compile_cache, packed, pipeline, runtime, stopping, trace as tracing
from .executable import Executable
from .leaves import aval
from .mlir_context import copy_module
from .options import StepOptions


def build(fn: Callable, options: StepOptions, state, batch, static: dict) -> Executable:
    """The executable of ``fn(state, batch, **static)`` under `options`: `compile` of `trace`."""
    t0 = time.perf_counter()
    traced = trace(fn, options, state, batch, static)
    return compile(traced, options, fn_name(fn), jax.tree_util.tree_leaves((state, batch)),
                   {"trace": time.perf_counter() - t0})


def trace(fn: Callable, options: StepOptions, state, batch, static: dict) -> tracing.Traced:
    """`fn` traced for (state, batch, static) as `options` run it (placement, stop, loop)."""
    packed.check_not_nested(state)
    return tracing.trace(fn, state, batch, static, options.keep_aux, options.placement,
                         stopping.flag(options.until, options.stop_on_nonfinite), stopped_arg=options.stops,
                         loop=options.steps is not None, packed_paths=packed.buffer_paths(state))


def compile(traced: tracing.Traced, options: StepOptions, name: str, leaves: list, seconds: dict) -> Executable:
    """Decide the XLA options of `traced`'s program, then load its executable from the compile cache or
    run the passes (on a copy of ``traced.module``: `traced` stays as traced) and XLA, and store it.
    `leaves`: the flat state and batch leaves it is compiled for; `seconds`: the time so far, by stage."""
    devices = options.program_devices
    specs = pipeline_of(traced, options)
    program = program_options(traced, options, leaves[:len(traced.state_paths)], specs)
    xla = runtime.compile_options(devices, program.values, shardy=runtime.uses_shardy(traced.module))
    seconds = dict(seconds)
    t0 = time.perf_counter()
    where = compile_cache.folder(options.cache_dir)
    entry = None if where is None or traced.effects.host_callbacks else compile_cache.Entry.of(
        where, str(traced.module), pipeline.pipeline_string(specs), devices, xla)
    loaded = entry.load(traced.module.context) if entry is not None else None
    cache_seconds = time.perf_counter() - t0
    dump = dump_folder(name, options, traced, specs)
    if loaded is None or dump is not None:
        lowered = copy_module(traced.module)
        note = _origin(entry, loaded, where is not None) + str(program)
        text, timings = pipeline.lower(lowered, specs, dump=dump, note=note)
        seconds.update(timings)
    if loaded is not None:
        executable, module = loaded
    else:
        t0 = time.perf_counter()
        executable = runtime.compile_module(text, devices, xla, host_callbacks=traced.effects.host_callbacks)
        seconds["xla"] = time.perf_counter() - t0
        module = lowered
        if entry is not None:
            t0 = time.perf_counter()
            entry.store(executable, module)
            cache_seconds += time.perf_counter() - t0
    if where is not None:
        seconds["cache"] = cache_seconds
    return Executable.build(traced, module, executable, leaves, options.placement, devices[0], options.donate,
                            program, seconds)


def pipeline_of(traced: tracing.Traced, options: StepOptions) -> list:
    """The passes of `traced`'s program: `options.pipeline`, a loop's histories written in blocks where
    that keeps its body's buffers small enough for XLA:CPU to run it sequentially (`runtime.history_rows`)."""
    return options.pipeline(runtime.history_rows(traced.module, options.program_devices[0].platform, options.steps))


def fn_name(fn: Callable) -> str:
    """The step function's name, as dumps, messages and the dispatcher give it."""
    return getattr(fn, "__name__", "step")


def dump_folder(name: str, options: StepOptions, traced: tracing.Traced, specs) -> Path | None:
    """Where the IR of `traced`'s program is dumped (see `pipeline.dump_folder`), or None."""
    root = pipeline.dump_dir(options.dump_ir)
    return None if root is None else pipeline.dump_folder(
        root, name, traced.module, specs, (options.device, options.devices, options.xla_options))


def program_options(traced: tracing.Traced, options: StepOptions, state_leaves: list, specs: list) -> runtime.ProgramOptions:
    """The XLA options of `traced`'s program (`runtime.program_options`), given the bytes of
    floating-point state it replicates over a mesh and the passes `specs` it runs (those that may
    add control flow of their own)."""
    replicated = 0
    if traced.arg_shardings is not None:
        for x, s in zip(state_leaves, traced.arg_shardings):
            a = aval(x)
            if s.is_fully_replicated and jax.numpy.issubdtype(a.dtype, jax.numpy.floating):
                replicated += a.size * a.dtype.itemsize
    return runtime.program_options(traced.module, options.program_devices[0].platform, replicated,
                                   options.xla_options, [p.name for p in specs if p.adds_control_flow()])


def _origin(entry: compile_cache.Entry | None, loaded, cache_set: bool) -> str:
    """Where the executable comes from, for the IR dump's executable.txt."""
    if loaded is not None:
        assert entry is not None
        return f"loaded from the compile cache ({entry.path}); XLA did not run\n"
    if entry is not None:
        return f"compiled by XLA and stored in the compile cache ({entry.path})\n"
    return "compiled by XLA; not cached (the program has host callbacks)\n" if cache_set else "compiled by XLA\n"
