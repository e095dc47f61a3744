"""compile_step: trace, run loopfuse's passes, compile with PJRT, and call the result."""
import inspect
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import jax
import numpy as np

from . import cache as compile_cache, dispatch, memory_report, packed, pipeline, runtime, stopping, validate, verify
from .data import Dataset
from .errors import DonatedArrayError
from .executable import Executable
from .sharding import Placement
from .trace import Traced, is_weak, trace


@dataclass(frozen=True)
class StepOptions:
    """Everything that changes the compiled program (each field as in `compile_step`).

    `xla_options`: XLA compile options (``{"xla_...": value}``, None leaves one unset) merged over the
    options loopfuse decides per program (`runtime.program_options`).
    """

    donate: bool = True
    passes: str | tuple | None = None
    keep_aux: tuple | None = None
    steps: int | None = None
    device: Any = None
    devices: tuple | None = None
    sharding: str | None = None
    dump_ir: str | Path | None = None
    xla_options: Mapping[str, Any] | None = None
    until: Callable | None = None
    stop_on_nonfinite: bool = False
    cache_dir: str | Path | None = None
    verify: bool | None = None

    def __post_init__(self) -> None:
        if self.steps is not None:
            object.__setattr__(self, "steps", validate.steps(self.steps))
        stopping.check(self.until, self.stop_on_nonfinite, self.steps)
        if self.device is not None and self.devices is not None:
            raise ValueError("pass either device= (one device) or devices= (an SPMD mesh), not both")
        if self.sharding is not None and self.devices is None:
            raise ValueError(f"sharding={self.sharding!r} needs devices=[...] to shard over")
        if self.passes is not None and not isinstance(self.passes, str):
            object.__setattr__(self, "passes", tuple(self.passes))
        for name in ("keep_aux", "devices"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.xla_options is not None:
            object.__setattr__(self, "xla_options", MappingProxyType(runtime.check_xla_options(self.xla_options)))


class Step:
    """A compiled ``fn(state, batch) -> (new_state, aux)``; see `compile_step`."""

    def __init__(self, fn: Callable, options: StepOptions = StepOptions()):
        _check_start_is_free(fn)
        self.fn, self.options = fn, options
        self._stops = options.steps is not None and (options.until is not None or options.stop_on_nonfinite)
        self.placement = Placement(options.devices, options.sharding or "data") if options.devices is not None else None
        self.compile_count = 0             # programs compiled for this Step's calls (packed states' included)
        self._cache: dict = {}
        self._loops: dict = {}
        self._packed: dict = {}            # layout -> the Step of states packed so (see `_for`)
        self._owner: Step | None = None    # the Step this one runs packed states for
        self._lock = threading.Lock()      # guards compile_count, _loops, _packed, _compiling and _dispatchers
        self._compiling: dict = {}         # signature -> lock held while it compiles
        self._dispatchers: dict = {}       # static argument names -> call (see `dispatch`)
        self._verified: set = set()        # signatures whose first call `verify` checked

    def loop(self, steps: int, *, until: Callable | None = None, stop_on_nonfinite: bool = False) -> "Step":
        """The same step run `steps` times per call inside one device loop (one Step per options,
        so its executables are reused by every caller).

        until: ``pred(new_state, aux) -> scalar bool``, evaluated on the device after every step;
        stop_on_nonfinite: stop after a step whose kept floating aux leaves hold a NaN or Inf. With
        either, the loop stops after the first step that asks it to and a call returns
        ``(state, aux, steps_run, stopped)``: the int32 steps run and the bool "a step asked to
        stop" (true also when the K-th step did); history rows of steps not run are NaN (0 for integers).
        A weakly typed state leaf that the step returns strongly typed is carried strongly typed from
        the first step, as `lax.scan` carries it.
        """
        steps = validate.steps(steps)
        key = (steps, until, stop_on_nonfinite)
        with self._lock:
            if key not in self._loops:
                self._loops[key] = Step(self.fn, replace(self.options, steps=steps, until=until,
                                                         stop_on_nonfinite=stop_on_nonfinite))
            return self._loops[key]

    def _for(self, state) -> "Step":
        """The Step that runs `state`: this one, or for a `packed.PackedState` the Step of its
        layout (the step function and `until` on the unpacked state, the new state packed again)."""
        if not isinstance(state, packed.PackedState):
            return self
        with self._lock:
            step = self._packed.get(state.layout)
            if step is None:
                o = self.options
                step = Step(packed.on_packed(self.fn, state.layout), replace(o, until=packed.until_on_packed(o.until)))
                step._owner, self._packed[state.layout] = self, step
            return step

    # ---- compiling -------------------------------------------------------------------------
    @staticmethod
    def _signature(state, batch, static):
        """(cache key, flat leaves): tree structures, leaf shapes and dtypes, static kwargs."""
        s_leaves, s_def = jax.tree_util.tree_flatten(state)
        b_leaves, b_def = jax.tree_util.tree_flatten(batch)
        leaves = s_leaves + b_leaves
        try:
            static_key = tuple(sorted(static.items()))
            hash(static_key)
        except TypeError as e:
            raise TypeError(f"static keyword arguments must be hashable: {e}") from None
        return (s_def, b_def, tuple(map(_aval, leaves)), static_key), leaves

    def _trace(self, state, batch, static) -> Traced:
        packed.check_not_nested(state)
        o = self.options
        return trace(self.fn, state, batch, static, o.keep_aux, self.placement, stopping.flag(o.until, o.stop_on_nonfinite),
                     stopped_arg=self._stops, loop=o.steps is not None)

    def _program(self, traced: Traced, state) -> runtime.ProgramOptions:
        """The XLA options of `traced`'s program (`runtime.program_options`), given the bytes of
        floating-point state it replicates over a mesh."""
        replicated = 0
        if traced.arg_shardings is not None:
            for x, s in zip(jax.tree_util.tree_leaves(state), traced.arg_shardings):
                a = _aval(x)
                if s.is_fully_replicated and jax.numpy.issubdtype(a.dtype, jax.numpy.floating):
                    replicated += a.size * a.dtype.itemsize
        return runtime.program_options(traced.module, self._devices()[0].platform, replicated, self.options.xla_options)

    def _dump_folder(self, traced: Traced, specs) -> Path | None:
        o = self.options
        root = pipeline.dump_dir(o.dump_ir)
        return None if root is None else pipeline.dump_folder(
            root, getattr(self.fn, "__name__", "step"), traced.module, specs, (o.device, o.devices, o.xla_options))

    def _compile(self, state, batch, static) -> Executable:
        """Trace, decide the XLA options, then load the executable from the compile cache or run the
        passes and XLA (and store it)."""
        o, devices = self.options, self._devices()
        t0 = time.perf_counter()
        traced = self._trace(state, batch, static)
        seconds = {"trace": time.perf_counter() - t0}
        program = self._program(traced, state)
        options = runtime.compile_options(devices, program.values, shardy=runtime.uses_shardy(traced.module))
        specs = pipeline.build(o.passes, steps=o.steps, donate=o.donate)
        t0 = time.perf_counter()
        where = compile_cache.folder(o.cache_dir)
        entry = None if where is None or traced.effects.host_callbacks else compile_cache.Entry.of(
            where, str(traced.module), pipeline.pipeline_string(specs), devices, options)
        loaded = entry.load(traced.module.context) if entry is not None else None
        cache_seconds = time.perf_counter() - t0
        dump = self._dump_folder(traced, specs)
        if loaded is None or dump is not None:
            note = _origin(entry, loaded, where is not None) + str(program)
            text, timings = pipeline.lower(traced.module, specs, dump=dump, note=note)
            seconds.update(timings)
        if loaded is not None:
            executable, traced.module = loaded
        else:
            t0 = time.perf_counter()
            executable = runtime.compile_module(text, devices, options, host_callbacks=traced.effects.host_callbacks)
            seconds["xla"] = time.perf_counter() - t0
            if entry is not None:
                t0 = time.perf_counter()
                entry.store(executable, traced.module)
                cache_seconds += time.perf_counter() - t0
        if where is not None:
            seconds["cache"] = cache_seconds
        with self._lock:
            self.compile_count += 1
        if self._owner is not None:
            with self._owner._lock:
                self._owner.compile_count += 1
        leaves = jax.tree_util.tree_leaves((state, batch))
        return Executable.build(traced, executable, leaves, self.placement, self._device(), o.donate, program, seconds)

    def _device(self):
        return self.options.device or jax.devices()[0]

    def _devices(self) -> list:
        """The devices the program runs on: the mesh's, or the one device."""
        return self.placement.devices if self.placement else [self._device()]

    def compiled(self, state, batch, *, start: int = 0, **static) -> Executable:
        """The executable for this signature (compiled on first use, then cached); `start` as in `__call__`."""
        step = self._for(state)
        return step.served_executable(state, step._serve(batch, start), static)

    def served_executable(self, state, batch, static: dict) -> Executable:
        """`compiled` for a batch as the executable takes it (a `Dataset` already served)."""
        key, _ = self._signature(state, batch, static)
        return self._executable(key, state, batch, static)

    def _executable(self, key, state, batch, static) -> Executable:
        """The cached executable of `key`, compiled once however many threads ask at the same time."""
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                lock = self._compiling.setdefault(key, threading.Lock())
            with lock:
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._cache[key] = self._compile(state, batch, static)
                    self._cache.setdefault(_promoted(key, entry.traced.promoted), entry)
            with self._lock:
                self._compiling.pop(key, None)
        return entry

    def lower(self, state, batch, *, start: int = 0, **static) -> dict[str, str]:
        """The IR at every stage: {"00-traced": text, "01-after-<pass>": text, ..., "final": text}.

        Traces and runs the passes only; XLA is not invoked and nothing is cached.
        """
        step = self._for(state)
        traced = step._trace(state, step._serve(batch, start), static)
        specs = pipeline.build(step.options.passes, steps=step.options.steps, donate=step.options.donate)
        stages: dict[str, str] = {}
        pipeline.lower(traced.module, specs, dump=step._dump_folder(traced, specs), stages=stages)
        return stages

    def memory_stats(self, state, batch, *, start: int = 0, **static) -> runtime.MemoryStats:
        """Argument/output/alias/temp bytes of the compiled executable for this signature."""
        return self.compiled(state, batch, start=start, **static).memory

    def memory_report(self, state, batch, *, start: int = 0, top: int = 10, **static) -> memory_report.MemoryReport:
        """Where this signature's peak memory comes from: the `top` largest buffers live at the peak of
        its compiled program, each with the line of your code that made it, and the live bytes over
        the program's schedule (see `memory_report`). With `dump_ir`, the program's dump folder also
        gets ``memory-report.txt`` and ``memory-timeline.svg``.

        Compiles the program once more, apart from the executable calls run (neither is changed nor
        cached, `compile_count` stays); nothing runs, so the state is never consumed.
        """
        top = validate.steps(top, "top")
        step = self._for(state)
        batch = step._serve(batch, start)
        traced = step._trace(state, batch, static)
        program, shardy = step._program(traced, state), runtime.uses_shardy(traced.module)
        specs = pipeline.build(step.options.passes, steps=step.options.steps, donate=step.options.donate)
        dump = step._dump_folder(traced, specs)
        pipeline.lower(traced.module, specs, dump=dump)
        report = memory_report.compile_report(traced.module, step._devices(), program, shardy=shardy,
                                              host_callbacks=traced.effects.host_callbacks, batch=batch, top=top)
        if dump is not None:
            memory_report.write(report, dump)
        return report

    def _serve(self, batch, start: int = 0):
        """A `Dataset` as the executable takes it (`Dataset.served`); other batches as they are."""
        if not isinstance(batch, Dataset):
            return batch
        batch.validate()
        sharding = self.placement.replicated if self.placement else jax.sharding.SingleDeviceSharding(self._device())
        return batch.served(start, self.options.steps or 1, sharding)

    # ---- running ---------------------------------------------------------------------------
    def __call__(self, state, batch, *, start: int = 0, **static) -> tuple[Any, ...]:
        """Run one step (or `steps` steps) and return ``(new_state, aux)``.

        With a `Dataset` batch, `start` is the global step index of the first step (it picks the
        batch and the epoch); `start` is reserved, never passed to the step function. Other
        keyword arguments are static arguments of the step function (part of the signature).
        The caller's donated state arrays are consumed: use the returned state.
        """
        return self._for(state)._dispatch(state, batch, start, (False,) if self._stops else (), static)

    def after(self, stopped, state, batch, *, start: int = 0, **static) -> tuple[Any, ...]:
        """`__call__` of a loop that can stop early, following a call whose stopped flag (its fourth
        output, still on the device) is `stopped`: when it is true this call runs no step (steps run
        0, the state returned as it came, stopped true). So the next call is dispatched before the
        previous one's flag is read, and its results are those of stopping as soon as that flag is."""
        if not self._stops:
            raise ValueError("Step.after is for a loop that can stop early: step.loop(K, until=...)")
        return self._for(state)._dispatch(state, batch, start, (stopped,), static)

    def _dispatch(self, state, batch, start, stopped: tuple, static):
        """Call through the C++ dispatcher; `stopped` is () or, for a loop that can stop, (initial flag,)."""
        if isinstance(batch, Dataset):
            batch = self._serve(batch, start)
        names = tuple(static)
        call = self._dispatchers.get(names) or self._dispatcher(names)
        try:
            return call(state, batch, start, *stopped, **static)
        except ValueError:
            if dispatch.refused((state, batch)):  # the Python path names the gone leaf or copies the shared one
                return self._call(state, batch, start, *stopped, **static)
            raise

    def _dispatcher(self, names: tuple):
        """The call for static arguments `names`: jaxlib's C++ dispatcher over `_call` (see `dispatch`)."""
        with self._lock:
            if names not in self._dispatchers:
                self._dispatchers[names] = dispatch.dispatcher(
                    getattr(self.fn, "__name__", "step"), self._call, self._cache_miss, names)
            return self._dispatchers[names]

    def _call(self, state, batch, start, *stopped, **static):
        """One call through loopfuse's Python path."""
        return self._run(state, batch, start, stopped, static)[0]

    def _cache_miss(self, state, batch, start, *stopped, **static):
        """The C++ dispatcher's first call of a signature: the outputs, and how to repeat it in C++."""
        outs, executable = self._run(state, batch, start, stopped, static)
        return outs, dispatch.fastpath(executable, (state, batch, start, *stopped), outs), False

    def _run(self, state, batch, start, stopped: tuple, static):
        key, leaves = self._signature(state, batch, static)
        if any(map(_deleted, leaves)):
            _raise_donated(state, batch)
        executable = self._executable(key, state, batch, static)
        if key not in self._verified and verify.enabled(self.options.verify):
            verify.check(self, executable, state, batch, start, static)
            self._verified.add(key)
        return executable(leaves, start, *stopped), executable


def _origin(entry: compile_cache.Entry | None, loaded, cache_set: bool) -> str:
    """Where the executable comes from, for the IR dump's executable.txt."""
    if loaded is not None:
        assert entry is not None
        return f"loaded from the compile cache ({entry.path}); XLA did not run\n"
    if entry is not None:
        return f"compiled by XLA and stored in the compile cache ({entry.path})\n"
    return "compiled by XLA; not cached (the program has host callbacks)\n" if cache_set else "compiled by XLA\n"


def _check_start_is_free(fn: Callable) -> None:
    """Raise TypeError when `fn` takes a keyword argument named `start` (reserved by `Step.__call__`)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # not introspectable (some builtins and C callables)
        return
    named = [p for p in params[2:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.name == "start" for p in named):
        raise TypeError(
            f"{getattr(fn, '__name__', fn)!r} takes an argument named 'start', which loopfuse reserves for the "
            "step index of a Dataset batch (step(state, batch, start=i)) and would never pass to it; rename it")


def _raise_donated(state, batch) -> None:
    """Raise DonatedArrayError naming the first leaf whose buffer an earlier donation deleted."""
    for what, tree in (("state", state), ("batch", batch)):
        for x in jax.tree_util.tree_leaves(tree):
            if isinstance(x, jax.Array) and x.is_deleted():
                path = next(jax.tree_util.keystr(p) for p, y in jax.tree_util.tree_flatten_with_path(tree)[0]
                            if y is x)
                raise DonatedArrayError(
                    f"{what} leaf {path} was donated to an earlier loopfuse call and its buffer is gone; pass "
                    "the state that call returned (state, aux = step(state, batch)), or compile with "
                    "donate=False to keep inputs alive")


def _deleted(x) -> bool:
    try:
        return x.is_deleted()
    except AttributeError:  # numpy arrays and Python scalars
        return False


def _promoted(key, leaves: tuple):
    """The signature `key` with the state `leaves` strongly typed (the state the loop returns)."""
    s_def, b_def, avals, static_key = key
    return s_def, b_def, tuple(a.update(weak_type=False) if i in leaves else a for i, a in enumerate(avals)), static_key


def _aval(x):
    """The abstract value of a leaf for the cache key (weak types included: they trace differently)."""
    try:
        return x.aval
    except AttributeError:  # numpy arrays and Python scalars
        weak = is_weak(x)
        x = np.asarray(x)
        return jax.core.ShapedArray(x.shape, jax.dtypes.canonicalize_dtype(x.dtype), weak_type=weak)


def compile_step(fn: Callable, *, donate: bool = True, dump_ir: str | Path | None = None, passes=None,
                 keep_aux=None, steps: int | None = None, device=None, devices=None, sharding=None,
                 cache_dir: str | Path | None = None, xla_options: Mapping[str, Any] | None = None,
                 verify: bool | None = None) -> Step:
    """Compile ``fn(state, batch) -> (new_state, aux)`` as a whole step through loopfuse's passes.

    donate:   update state in place (params and optimizer state buffers are reused).
    dump_ir:  folder for the IR after tracing and after every pass (or $LOOPFUSE_DUMP_IR); each
              program gets its own subfolder ``<fn name>-<digest>`` (see `pipeline.dump_folder`).
    passes:   optimization passes (pipeline string or names), default ``pipeline.DEFAULT_PASSES``.
    keep_aux: aux leaf paths to return, e.g. ``("loss",)``; others are not computed (None: all).
    steps:    run that many updates per call in one device loop; aux gains a leading [steps] axis.
    device:   the one device to run on (default: the first).
    devices, sharding: run SPMD over a mesh of `devices`; "data" (default) splits the batch and
              replicates the state, "params" also splits large state leaves (see `sharding`).
    cache_dir: folder of the persistent compile cache (or $LOOPFUSE_CACHE_DIR); a program compiled
              once on this machine loads from it instead of running the passes and XLA again.
    xla_options: XLA compile options merged over the options loopfuse decides per program
              (`runtime.program_options`: the copy-free loop carry where it is safe), e.g.
              ``{"xla_cpu_copy_insertion_use_region_analysis": False}`` turns that off; a value of
              None leaves an option unset.
    verify:   check each new executable's first call against jax.jit of `fn` on copies of the
              inputs and raise `MiscompileError` naming the first differing leaf and the pass or
              XLA option that causes it (default: $LOOPFUSE_VERIFY; see `verify`).

    Call the result as ``step(state, batch, **static)``; the keyword `start` is reserved (the first
    step index of a `Dataset` batch), so `fn` may not take an argument named `start`.

    Examples:
        >>> import jax.numpy as jnp
        >>> import loopfuse
        >>> def fn(w, target):
        ...     return w - 0.5 * (w - target), {"loss": jnp.sum((w - target) ** 2)}
        >>> step = loopfuse.compile_step(fn)
        >>> w, aux = step(jnp.ones(2), jnp.zeros(2))
        >>> w.tolist(), aux["loss"].item()
        ([0.5, 0.5], 2.0)
        >>> loop = loopfuse.compile_step(fn, steps=3)  # 3 updates per call, aux per step
        >>> w, aux = loop(jnp.ones(2), jnp.zeros(2))
        >>> w.tolist(), aux["loss"].tolist()
        ([0.125, 0.125], [2.0, 0.5, 0.125])
    """
    return Step(fn, StepOptions(donate=donate, passes=passes, keep_aux=keep_aux, steps=steps, device=device,
                                devices=devices, sharding=sharding, dump_ir=dump_ir, cache_dir=cache_dir,
                                xla_options=xla_options, verify=verify))
