"""compile_step: trace, run loopfuse's passes, compile with PJRT, and call the result."""
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jaxlib.mlir import ir

from . import pipeline, runtime
from .data import Dataset
from .errors import DonatedArrayError
from .passes._func import main_func, result_attrs
from .sharding import Placement
from .trace import RESULT, Traced, is_key, trace, wrap_keys


@dataclass
class Executable:
    """One executable for one abstract signature, with what it took to build it."""

    traced: Traced
    executable: Any
    results: list                  # flat output index of each executable result
    handlers: list                 # result handler of each executable result (makes the jax Array)
    arg_targets: list              # sharding of each executable argument
    key_args: list                 # argument positions that hold typed PRNG keys (passed as raw data)
    seconds: dict = field(default_factory=dict)    # trace / each pass / xla

    @property
    def memory(self) -> runtime.MemoryStats:
        return runtime.MemoryStats.of(self.executable)


class Step:
    """A compiled ``fn(state, batch) -> (new_state, aux)``; see `compile_step`."""

    def __init__(self, fn: Callable, *, donate=True, dump_ir=None, passes=None, keep_aux=None, steps=None,
                 device=None, devices=None, sharding=None, xla_options=None):
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        self.fn, self.donate, self.dump_ir, self.passes, self.steps = fn, donate, dump_ir, passes, steps
        self.keep_aux = None if keep_aux is None else tuple(keep_aux)
        if device is not None and devices is not None:
            raise ValueError("pass either device= (one device) or devices= (an SPMD mesh), not both")
        if sharding is not None and devices is None:
            raise ValueError(f"sharding={sharding!r} needs devices=[...] to shard over")
        self.device, self.devices, self.sharding = device, devices, sharding
        self.xla_options = runtime.check_xla_options(xla_options)
        self.placement = Placement(devices, sharding or "data") if devices is not None else None
        self.compile_count = 0
        self._cache: dict = {}
        self._loops: dict = {}

    def loop(self, steps: int) -> "Step":
        """The same step run `steps` times per call inside one device loop (one Step per `steps`,
        so its executables are reused by every caller)."""
        if steps not in self._loops:
            self._loops[steps] = Step(self.fn, donate=self.donate, dump_ir=self.dump_ir, passes=self.passes,
                                      keep_aux=self.keep_aux, steps=steps, device=self.device,
                                      devices=self.devices, sharding=self.sharding,
                                      xla_options=self.xla_options)
        return self._loops[steps]

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

    def _lower(self, state, batch, static, stages: dict | None = None):
        """Trace and run the pipeline: (traced, final MLIR text, seconds per stage).

        Dumps every stage when a dump folder is set; `stages` (if given) collects their texts.
        """
        seconds = {}
        t0 = time.perf_counter()
        traced = trace(self.fn, state, batch, static, self.keep_aux, self.placement)
        seconds["trace"] = time.perf_counter() - t0
        specs = pipeline.build(self.passes, steps=self.steps, donate=self.donate)
        dump = pipeline.dump_dir(self.dump_ir)
        folder = dump / self._dump_name(traced) if dump is not None else None
        if folder:
            folder.mkdir(parents=True, exist_ok=True)

        def on_stage(name: str, module) -> None:  # each stage printed once, for the dump and `stages`
            text = str(module)
            if folder:
                (folder / f"{name}.mlir").write_text(text)
            if stages is not None:
                stages[name] = text

        seconds.update(pipeline.run(traced.module, specs, on_stage if folder or stages is not None else None,
                                    repro_dir=folder))
        text = str(traced.module)
        if folder:
            (folder / f"{len(specs) + 1:02d}-final.mlir").write_text(text)
        if stages is not None:
            stages["final"] = text
        return traced, text, seconds

    def _compile(self, state, batch, static) -> Executable:
        traced, text, seconds = self._lower(state, batch, static)
        t0 = time.perf_counter()
        executable = runtime.compile_module(text, self.placement.devices if self.placement else [self._device()],
                                            self.xla_options)
        seconds["xla"] = time.perf_counter() - t0
        self.compile_count += 1
        key_args = [i for i, x in enumerate(jax.tree_util.tree_leaves((state, batch))) if is_key(x)]
        return Executable(traced, executable, *self._layout(traced), key_args, seconds)

    def _layout(self, traced: Traced):
        """Which flat output each result is, where results land, where arguments must be."""
        with traced.module.context:
            main = main_func(traced.module.operation)
            results = [ir.IntegerAttr(a[RESULT]).value for a in result_attrs(main)]
            shapes = [tuple(ir.RankedTensorType(t).shape) for t in main.type.results]
            n_args = len(main.type.inputs)
        if traced.arg_shardings is None:
            device = jax.sharding.SingleDeviceSharding(self._device())
            arg_targets, out_shardings = [device] * n_args, [device] * len(results)
        else:
            n_state = len(traced.state_paths)
            arg_targets = traced.arg_shardings
            out_shardings = [arg_targets[j] if j < n_state else self.placement.replicated for j in results]
        handlers = runtime.result_handlers(
            [(s, traced.out_dtypes[j], sh) for j, s, sh in zip(results, shapes, out_shardings)])
        return results, handlers, arg_targets

    def _dump_name(self, traced: Traced) -> str:
        name = getattr(self.fn, "__name__", "step")
        with traced.module.context:
            digest = hashlib.sha1(str(traced.module).encode()).hexdigest()[:8]
        return f"{name}-{digest}"

    def _device(self):
        return self.device or jax.devices()[0]

    def compiled(self, state, batch, **static) -> Executable:
        """The executable for this signature (compiled on first use, then cached)."""
        batch = self._serve(batch)
        key, _ = self._signature(state, batch, static)
        return self._cache.get(key) or self._cached_compile(key, state, batch, static)

    def _cached_compile(self, key, state, batch, static) -> Executable:
        entry = self._cache[key] = self._compile(state, batch, static)
        return entry

    def lower(self, state, batch, **static) -> dict:
        """The IR at every stage: {"00-traced": text, "01-after-<pass>": text, ..., "final": text}.

        Traces and runs the passes only; XLA is not invoked and nothing is cached.
        """
        stages = {}
        self._lower(state, self._serve(batch), static, stages)
        return stages

    def memory_stats(self, state, batch, **static) -> runtime.MemoryStats:
        """Argument/output/alias/temp bytes of the compiled executable for this signature."""
        return self.compiled(state, batch, **static).memory

    # ---- running ---------------------------------------------------------------------------
    def __call__(self, state, batch, *, start: int = 0, **static):
        """Run one step (or `steps` steps) and return ``(new_state, aux)``.

        With a `Dataset` batch, `start` is the global step index of the first step (it picks the
        batch and the epoch). The caller's donated state arrays are consumed: use the returned state.
        """
        batch = self._serve(batch, start)
        key, leaves = self._signature(state, batch, static)
        if any(map(_deleted, leaves)):
            _raise_donated(state, batch)
        entry = self._cache.get(key) or self._cached_compile(key, state, batch, static)
        outs = runtime.execute(entry.executable, self._arguments(entry, leaves, start), entry.handlers)
        return self._unflatten(entry, outs)

    def _serve(self, batch, start: int = 0):
        """A `Dataset` as the executable takes it (`Dataset.served`); other batches as they are."""
        if not isinstance(batch, Dataset):
            return batch
        batch.validate()
        sharding = self.placement.replicated if self.placement else jax.sharding.SingleDeviceSharding(self._device())
        return batch.served(start, self.steps or 1, sharding)

    def _arguments(self, entry: Executable, leaves, start) -> list:
        if entry.traced.has_step_index:
            leaves = leaves + [np.int32(start)]
        for i in entry.key_args:
            leaves[i] = jax.random.key_data(leaves[i])
        args = [x if getattr(x, "sharding", None) is t else _place(x, t) for x, t in zip(leaves, entry.arg_targets)]
        if self.donate and len(set(map(id, args))) < len(args):  # one buffer cannot be donated twice
            seen = set()
            for i, x in enumerate(args):
                if id(x) in seen:
                    args[i] = x.copy()
                seen.add(id(x))
        return args

    def _unflatten(self, entry: Executable, outs):
        t = entry.traced
        n_state = len(t.state_paths)
        flat = [None] * (n_state + len(t.aux_paths))
        for j, value in zip(entry.results, outs):
            flat[j] = value
        return (jax.tree_util.tree_unflatten(t.state_def, wrap_keys(flat[:n_state], t.key_leaves)),
                jax.tree_util.tree_unflatten(t.aux_def, flat[n_state:]))


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


def _place(x, sharding):
    """`x` as a device array with `sharding` (no copy when it already has an equal one)."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    return jax.device_put(x, sharding)


def _aval(x):
    """The abstract value of a leaf for the cache key (weak types traced as strong ones)."""
    try:
        aval = x.aval
        return aval.strip_weak_type() if aval.weak_type else aval
    except AttributeError:  # numpy arrays and Python scalars
        x = np.asarray(x)
        return jax.core.ShapedArray(x.shape, jax.dtypes.canonicalize_dtype(x.dtype))


def compile_step(fn: Callable, *, donate: bool = True, dump_ir: str | Path | None = None, passes=None,
                 keep_aux=None, steps: int | None = None, device=None, devices=None, sharding=None,
                 xla_options=None) -> Step:
    """Compile ``fn(state, batch) -> (new_state, aux)`` as a whole step through loopfuse's passes.

    donate:   update state in place (params and optimizer state buffers are reused).
    dump_ir:  folder for the IR after tracing and after every pass (or $LOOPFUSE_DUMP_IR).
    passes:   optimization passes (pipeline string or names), default ``pipeline.DEFAULT_PASSES``.
    keep_aux: aux leaf paths to return, e.g. ``("loss",)``; others are not computed (None: all).
    steps:    run that many updates per call in one device loop; aux gains a leading [steps] axis.
    device:   the one device to run on (default: the first).
    devices, sharding: run SPMD over a mesh of `devices`; "data" (default) splits the batch and
              replicates the state, "params" also splits large state leaves (see `sharding`).
    xla_options: XLA compile options merged over loopfuse's per-platform defaults
              (`runtime.XLA_DEFAULTS`: copy-free loop carry), e.g.
              ``{"xla_cpu_copy_insertion_use_region_analysis": False}`` turns that default off.
    """
    return Step(fn, donate=donate, dump_ir=dump_ir, passes=passes, keep_aux=keep_aux, steps=steps,
                device=device, devices=devices, sharding=sharding, xla_options=xla_options)
