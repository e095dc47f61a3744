"""compile_step: a step function compiled whole (see `compiler`), its executables cached per
signature, and called through jaxlib's C++ dispatcher."""
import inspect
import threading
from dataclasses import replace
from typing import Any, Callable

import jax

from .. import _jax_compat, validate
from ..compile import compiler, stopping
from ..compile.executable import Executable
from ..compile.options import StepOptions, given, takes_keywords
from ..compile.trace import fn_name
from ..diagnostics import verify
from ..errors import DonatedArrayError
from ..memory import memory_plan, memory_report
from ..run import dispatch
from ..run.runtime import MemoryStats
from ..run.sharding import Placement
from ..state import packed, static_leaves
from ..state.data import Dataset
from ..state.leaves import aval, is_deleted, keyed_paths, leaf_name


class Step:
    """A compiled ``fn(state, batch) -> (new_state, aux)``; see `compile_step`."""

    def __init__(self, fn: Callable, options: StepOptions = StepOptions()):
        _check_start_is_free(fn)
        # a state's leaves that are not arrays are held as its structure: fn, until and init see them as the caller does
        self.fn = static_leaves.held(fn)
        self.options = options if options.until is None and options.init is None else replace(
            options, until=static_leaves.until_on_wrapped(options.until), init=static_leaves.init_on_wrapped(options.init))
        self._compiled = 0                 # programs compiled for this Step's own calls
        self._cache: dict = {}             # signature -> Executable
        self._derived: dict = {}           # (kind, ...) -> what `derived` built for it
        self._lock = threading.Lock()      # guards _compiled, _derived, _compiling, _dispatchers and _entry
        self._compiling: dict = {}         # signature -> lock held while it compiles
        self._dispatchers: dict = {}       # static argument names -> call (see `dispatch`)
        self._entry: Callable = self._bind  # a call without keywords: (state, batch) -> outputs (see `_bind`)
        self._verified: set = set()        # signatures whose first call `verify` checked

    @property
    def placement(self) -> Placement | None:
        """The mesh the program runs on (None: one device); see `StepOptions.devices`."""
        return self.options.placement

    @property
    def compile_count(self) -> int:
        """Programs compiled for this Step's calls, those of the packed states it ran included."""
        with self._lock:
            packed_steps = [step for key, step in self._derived.items() if key[0] == "packed"]   # see `_for`
            own = self._compiled
        return own + sum(step.compile_count for step in packed_steps)

    def derived(self, key: tuple, build: Callable[[], Any]) -> Any:
        """What ``build()`` made the first time this Step was asked for `key`, kept with it for its life: the
        one home of what is derived from a Step, the programs (its loops, the Step of a packed layout, an
        ensemble's Step, the step with a step axis) and what a driver learned of it (`chunks`: its pace).
        `key` names its kind first (``("loop", steps, until, stop_on_nonfinite)``); `build` runs under the
        Step's lock, once, and asks this Step for nothing derived."""
        value = self._derived.get(key)
        if value is None:                 # a driver asks for its loop once per chunk: no lock on a hit
            with self._lock:
                value = self._derived.get(key)
                if value is None:
                    value = self._derived[key] = build()
        return value

    def loop(self, steps: int, *, until: Callable | None = None, stop_on_nonfinite: bool = False,
             init: Callable | None = None) -> "Step":
        """The same step run `steps` times per call inside one device loop (one Step per options,
        so its executables are reused by every caller).

        until: ``pred(new_state, aux) -> scalar bool``, evaluated on the device after every step;
        stop_on_nonfinite: stop after a step whose kept floating aux leaves hold a NaN or Inf. With
        either, the loop stops after the first step that asks it to and a call returns
        ``(state, aux, steps_run, stopped)``: the int32 steps run and the bool "a step asked to
        stop" (true also when the K-th step did); history rows of steps not run are NaN (0 for integers).
        A weakly typed state leaf that the step returns strongly typed, or computes from one that is, is
        carried strongly typed from the first step (`trace.trace`; README, "Results are jax.jit's").
        init: ``init(x, batch) -> state``: a call takes `x` (never donated) in the state's place and the loop
        starts from ``init(x, batch)``, computed in the same program (one device call where there would be
        two: `minimize`'s solve in one call); for a loop on one device that cannot stop early, a fixed batch
        (a ValueError or TypeError otherwise), without ordered effects, typed PRNG keys in its state or effects
        in the init (`InitFoldError`).
        """
        if type(steps) is not int or type(stop_on_nonfinite) is not bool:   # checked before a key equal to
            steps = validate.steps(steps)                                    # another's finds it (True == 1)
            stopping.check(until, stop_on_nonfinite, steps)
        return self.derived(("loop", steps, until, stop_on_nonfinite, init), lambda: Step(
            self.fn, replace(self.options, steps=steps, until=until, stop_on_nonfinite=stop_on_nonfinite, init=init)))

    def _for(self, state) -> "Step":
        """The Step that runs `state`: this one, or for a `packed.PackedState` the Step of its
        layout (the step function and `until` on the unpacked state, the new state packed again),
        which counts its own compiles (`compile_count` adds them up)."""
        if not isinstance(state, packed.PackedState):
            return self
        o = self.options
        return self.derived(("packed", state.layout), lambda: Step(packed.on_packed(self.fn, state.layout),
                                                                  replace(o, until=packed.until_on_packed(o.until))))

    # ---- compiling -------------------------------------------------------------------------
    @staticmethod
    def _signature(state, batch, static):
        """(cache key, flat leaves): tree structures, leaf abstract values, static kwargs, and jax's trace
        context (x64, dtype promotion, ...: a change traces anew, as jax.jit does)."""
        s_leaves, s_def = jax.tree_util.tree_flatten(state)
        b_leaves, b_def = jax.tree_util.tree_flatten(batch)
        leaves = s_leaves + b_leaves
        try:
            static_key = tuple(sorted(static.items()))
            hash(static_key)
        except TypeError as e:
            raise TypeError(f"static keyword arguments must be hashable: {e}") from None
        return (s_def, b_def, tuple(map(aval, leaves)), static_key, _jax_compat.trace_context()), leaves

    def compiled(self, state, batch, *, start: int = 0, **static) -> Executable:
        """The executable for this signature (compiled on first use, then cached); `start` as in `__call__`."""
        state = static_leaves.wrap(state)
        step = self._for(state)
        batch = step._serve(batch, start)
        return step._executable(step._signature(state, batch, static)[0], state, batch, static)

    def _executable(self, key, state, batch, static) -> Executable:
        """The cached executable of `key`, built (`compiler.build`) once however many threads ask at
        the same time."""
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                lock = self._compiling.setdefault(key, threading.Lock())
            with lock:
                entry = self._cache.get(key)
                if entry is None:
                    build = compiler.build if self.options.memory_limit is None else memory_plan.build
                    entry = build(self.fn, self.options, state, batch, static)
                    with self._lock:
                        self._compiled += 1
                    self._cache[key] = entry
                    self._cache.setdefault(_promoted(key, entry.traced.promoted), entry)
            with self._lock:
                self._compiling.pop(key, None)
        return entry

    def lower(self, state, batch, *, start: int = 0, **static) -> dict[str, str]:
        """The IR at every stage: {"00-traced": text, "01-after-<pass>": text, ..., "final": text}.

        Traces and runs the passes only (`compiler.lower`); XLA is not invoked and nothing is cached, but under
        a `memory_limit`, whose plan is chosen on compiled figures (`compiled`): the stages are its plan's.
        """
        stages: dict[str, str] = {}
        compiler.lower(self._plan(state, batch, start, static), stages=stages)
        return stages

    def memory_stats(self, state, batch, *, start: int = 0, **static) -> MemoryStats:
        """Argument/output/alias/temp bytes of the compiled executable for this signature."""
        return self.compiled(state, batch, start=start, **static).memory

    def memory_report(self, state, batch, *, start: int = 0, top: int = 10, **static) -> memory_report.MemoryReport:
        """Where this signature's peak memory comes from: the `top` largest buffers live at the peak of
        its compiled program, each with the line of your code that made it, and the live bytes over
        the program's schedule (see `memory_report`). With `dump_ir`, the program's dump folder also
        gets ``memory-report.txt`` and ``memory-timeline.svg``.

        Compiles the program once more, apart from the executable calls run (neither is changed nor
        cached, `compile_count` stays); nothing runs, so the state is never consumed. Under a `memory_limit`
        it is the chosen plan's program, and the report's notes say which plan and why.
        """
        top = validate.steps(top, "top")
        plan = self._plan(state, batch, start, static)
        lowered = compiler.lower(plan)
        report = memory_report.compile_report(lowered.module, plan.devices, lowered.xla.values,
                                              host_callbacks=plan.traced.effects.host_callbacks,
                                              batch_paths=plan.batch_paths, top=top)
        chosen = self._memory_plan(state, batch, start, static)
        if chosen is not None:
            report = replace(report, notes=(*report.notes, f"{chosen.summary()} (Executable.reports[\"memory-limit\"])"))
        if plan.dump is not None:
            memory_report.write(report, plan.dump)
        return report

    def _plan(self, state, batch, start: int, static: dict) -> compiler.Plan:
        """`compiler.trace` of a call's program (the Step of a packed state's, a `Dataset` as served)."""
        state = static_leaves.wrap(state)
        step = self._for(state)
        chosen = self._memory_plan(state, batch, start, static)
        options = step.options if chosen is None else chosen.chosen.options(step.options)
        return compiler.trace(step.fn, options, state, step._serve(batch, start), static)

    def _memory_plan(self, state, batch, start: int, static: dict) -> memory_plan.MemoryPlan | None:
        """The plan chosen for this signature under `memory_limit` (None without one)."""
        if self.options.memory_limit is None:
            return None
        return self.compiled(state, batch, start=start, **static).memory_plan

    def _serve(self, batch, start: int = 0):
        """A `Dataset` as the executable takes it (`Dataset.served`); other batches as they are."""
        if not isinstance(batch, Dataset):
            return batch
        batch.validate()
        placement = self.options.placement
        sharding = (placement.replicated if placement else
                    jax.sharding.make_single_device_sharding(self.options.program_devices[0]))
        return batch.served(start, self.options.steps or 1, sharding)

    # ---- running ---------------------------------------------------------------------------
    def __call__(self, state, batch, **kwargs) -> tuple[Any, ...]:
        """Run one step (or `steps` steps) and return ``(new_state, aux)``: ``step(state, batch, start=0, **static)``.

        With a `Dataset` batch, `start` is the global step index of the first step (it picks the
        batch and the epoch); `start` is reserved, never passed to the step function. Other
        keyword arguments are static arguments of the step function (part of the signature).
        The caller's donated state arrays are consumed: use the returned state.

        A call without keywords goes straight to jaxlib's C++ dispatcher (`_bind`); one with
        keywords, and a call the dispatcher refuses (a donated leaf, one array as two leaves), takes
        `_general`.
        """
        if kwargs:
            return self._general(state, batch, **kwargs)
        try:
            return self._entry(state, batch)
        except ValueError:
            if dispatch.refused((state, batch)):  # the Python path names the gone leaf or copies the shared one
                return self._general(state, batch)
            raise

    def after(self, stopped, state, batch, *, start: int = 0, **static) -> tuple[Any, ...]:
        """`__call__` of a loop that can stop early, following a call whose stopped flag (its fourth
        output, still on the device) is `stopped`: when it is true this call runs no step (steps run
        0, the state returned as it came, stopped true). So the next call is dispatched before the
        previous one's flag is read, and its results are those of stopping as soon as that flag is."""
        if not self.options.stops:
            raise ValueError("Step.after is for a loop that can stop early: step.loop(K, until=...)")
        wrapped = static_leaves.wrap(state)
        if wrapped is not state:
            return _unwrapped(self.after(stopped, wrapped, batch, start=start, **static))
        return self._for(state)._dispatch(state, batch, start, (stopped,), static)

    def _general(self, state, batch, *, start: int = 0, **static) -> tuple[Any, ...]:
        """`__call__` of any state, batch and keywords: a packed state's Step, a served `Dataset`, the static
        arguments' dispatcher, a stopping loop's initial flag (false), a state with leaves that are not arrays
        (held as its structure, `static_leaves`)."""
        wrapped = static_leaves.wrap(state)
        if wrapped is not state:     # through the C++ dispatcher where no keyword is given
            return _unwrapped(self(wrapped, batch, **({"start": start} if start else {}), **static))
        return self._for(state)._dispatch(state, batch, start, (False,) if self.options.stops else (), static)

    def _bind(self, state, batch):
        """`_entry` until the first call, which binds it and calls it: jaxlib's C++ dispatcher of
        ``(state, batch)`` (`_entry_miss` on a new signature), or `_general` for a loop that can stop (its
        calls pass the initial flag) and where this jax has no dispatcher."""
        with self._lock:
            if self._entry == self._bind:
                self._entry = self._general if self.options.stops else dispatch.dispatcher(
                    fn_name(self.fn), self._general, self._entry_miss)
        return self._entry(state, batch)

    def _entry_miss(self, state, batch):
        """`_entry`'s first call of a signature: `_cache_miss`, or for a packed state, a `Dataset` or a state with
        leaves that are not arrays, `_general` on every call of it (no fast path of its own)."""
        if isinstance(state, packed.PackedState) or isinstance(batch, Dataset) or static_leaves.present(state):
            return self._general(state, batch), None, False
        return self._cache_miss(state, batch)

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
                self._dispatchers[names] = dispatch.dispatcher(fn_name(self.fn), self._call,
                                                               self._cache_miss, names)
            return self._dispatchers[names]

    def _call(self, state, batch, start, *stopped, **static):
        """One call through loopfuse's Python path."""
        return self._run(state, batch, start, stopped, static)[0]

    def _cache_miss(self, state, batch, *args, **static):
        """A C++ dispatcher's first call of a signature (`args`: none, or the step index and a stopping loop's
        flag): the outputs, and how to repeat it in C++."""
        start, *stopped = args or (0,)
        outs, executable = self._run(state, batch, start, tuple(stopped), static)
        return outs, dispatch.fastpath(executable, (state, batch, *args), outs), False

    def _run(self, state, batch, start, stopped: tuple, static):
        key, leaves = self._signature(state, batch, static)
        if any(map(is_deleted, leaves)):
            _raise_donated(state, batch)
        executable = self._executable(key, state, batch, static)
        if key not in self._verified and verify.enabled(self.options.verify):
            chosen = executable.memory_plan
            options = self.options if chosen is None else chosen.chosen.options(self.options)
            verify.check(self.fn, options, executable, state, batch, start, static)
            self._verified.add(key)
        return executable(leaves, start, *stopped), executable


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
        for path, x in zip(keyed_paths(tree), jax.tree_util.tree_leaves(tree)):
            if is_deleted(x):
                raise DonatedArrayError(
                    f"{leaf_name(what, path)} was donated to an earlier loopfuse call and its buffer is gone; pass "
                    "the state that call returned (state, aux = step(state, batch)), or compile with "
                    "donate=False to keep inputs alive")


def _unwrapped(outs: tuple) -> tuple:
    """A call's outputs with the new state as the caller holds it (`static_leaves.unwrap`)."""
    return (static_leaves.unwrap(outs[0]), *outs[1:])


def _promoted(key, leaves: tuple):
    """The signature `key` with the state `leaves` strongly typed (the state the loop returns)."""
    s_def, b_def, avals, static_key, context = key
    return (s_def, b_def, tuple(a.update(weak_type=False) if i in leaves else a for i, a in enumerate(avals)),
            static_key, context)


@takes_keywords
def compile_step(fn: Callable, **keywords: Any) -> Step:
    """Compile ``fn(state, batch) -> (new_state, aux)`` as a whole step through loopfuse's passes.

    Each keyword is the `StepOptions` field of its name (listed below; `Step.loop` sets the others).
    Nothing is compiled until the first call: a program per signature, then cached.

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
    return Step(fn, given("compile_step", keywords))
