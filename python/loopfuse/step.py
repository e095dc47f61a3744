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
from .errors import DonatedArrayError, StateMismatchError
from .passes._func import main_func, result_attrs
from .trace import RESULT, Traced, leaf_spec, trace


@dataclass
class Executable:
    """One executable for one abstract signature, with what it took to build it."""

    traced: Traced
    executable: Any
    results: list                  # flat output index of each executable result
    stacked: bool                  # aux results carry a leading [steps] axis
    stages: dict = field(default_factory=dict)     # stage name -> MLIR text (when lowered)
    seconds: dict = field(default_factory=dict)    # trace / each pass / xla

    @property
    def memory(self) -> runtime.MemoryStats:
        return runtime.MemoryStats.of(self.executable)


class Step:
    """A compiled ``fn(state, batch) -> (new_state, aux)``; see `compile_step`."""

    def __init__(self, fn: Callable, *, donate=True, dump_ir=None, passes=None, keep_aux=None, steps=None,
                 device=None):
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        self.fn, self.donate, self.dump_ir, self.passes, self.steps = fn, donate, dump_ir, passes, steps
        self.keep_aux = None if keep_aux is None else tuple(keep_aux)
        self.device = device
        self.compile_count = 0
        self._cache: dict = {}

    def loop(self, steps: int) -> "Step":
        """The same step run `steps` times per call inside one device loop."""
        return Step(self.fn, donate=self.donate, dump_ir=self.dump_ir, passes=self.passes,
                            keep_aux=self.keep_aux, steps=steps, device=self.device)

    # ---- compiling -------------------------------------------------------------------------
    def _key(self, state, batch, static):
        s_leaves, s_def = jax.tree_util.tree_flatten(state)
        b_leaves, b_def = jax.tree_util.tree_flatten(batch)
        try:
            static_key = tuple(sorted(static.items()))
            hash(static_key)
        except TypeError as e:
            raise TypeError(f"static keyword arguments must be hashable: {e}") from None
        avals = tuple((np.shape(x), str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype))
                      for x in s_leaves + b_leaves)
        return (s_def, b_def, avals, static_key)

    def _compile(self, state, batch, static, keep_stages=False) -> Executable:
        seconds = {}
        t0 = time.perf_counter()
        traced = trace(self.fn, state, batch, static, self.keep_aux)
        seconds["trace"] = time.perf_counter() - t0
        specs = pipeline.build(self.passes, steps=self.steps, donate=self.donate)
        stages = {}
        dump = pipeline.dump_dir(self.dump_ir)
        folder = dump / self._dump_name(traced) if dump is not None else None
        writers = [pipeline.dump_to(folder)] if folder else []
        if keep_stages:
            writers.append(lambda name, m: stages.__setitem__(name, str(m)))
        on_stage = (lambda name, m: [w(name, m) for w in writers]) if writers else None
        seconds.update(pipeline.run(traced.module, specs, on_stage, repro_dir=folder))
        text = str(traced.module)
        if folder:
            (folder / f"{len(specs) + 1:02d}-final.mlir").write_text(text)
        if keep_stages:
            stages["final"] = text
        t0 = time.perf_counter()
        executable = runtime.compile_module(text, [self._device()])
        seconds["xla"] = time.perf_counter() - t0
        self.compile_count += 1
        with traced.module.context:
            results = [ir.IntegerAttr(a[RESULT]).value for a in result_attrs(main_func(traced.module.operation))]
        return Executable(traced, executable, results, self.steps is not None, stages, seconds)

    def _dump_name(self, traced: Traced) -> str:
        name = getattr(self.fn, "__name__", "step")
        with traced.module.context:
            digest = hashlib.sha1(str(traced.module).encode()).hexdigest()[:8]
        return f"{name}-{digest}"

    def _device(self):
        return self.device or jax.devices()[0]

    def compiled(self, state, batch, **static) -> Executable:
        """The executable for this signature (compiled on first use, then cached)."""
        key = self._key(state, batch, static)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._compile(state, batch, static)
        return entry

    def lower(self, state, batch, **static) -> dict:
        """The IR at every stage: {"00-traced": text, "01-after-<pass>": text, ..., "final": text}."""
        return self._compile(state, batch, static, keep_stages=True).stages

    def memory_stats(self, state, batch, **static) -> runtime.MemoryStats:
        """Argument/output/alias/temp bytes of the compiled executable for this signature."""
        return self.compiled(state, batch, **static).memory

    # ---- running ---------------------------------------------------------------------------
    def __call__(self, state, batch, *, start: int = 0, **static):
        """Run one step (or `steps` steps) and return ``(new_state, aux)``.

        With a `Dataset` batch, `start` is the global step index of the first step (it picks the
        batch and the epoch). The caller's donated state arrays are consumed: use the returned state.
        """
        _check_alive(state, "state")
        _check_alive(batch, "batch")
        if isinstance(batch, Dataset):
            batch.validate()
        entry = self.compiled(state, batch, **static)
        args = self._arguments(entry.traced, state, batch, start)
        outs = runtime.execute(entry.executable, args, [(None, None)] * len(entry.results))
        return self._unflatten(entry, outs)

    def _arguments(self, traced: Traced, state, batch, start) -> list:
        device = self._device()
        s_leaves = jax.tree_util.tree_flatten_with_path(state)[0]
        args, seen = [], set()
        for (path, x), key in zip(s_leaves, traced.key_leaves):
            x = jax.random.key_data(x) if key is not None else x
            x = _on_device(x, device)
            if self.donate and id(x) in seen:  # one buffer cannot be donated twice
                x = x.copy()
            seen.add(id(x))
            args.append(x)
        for x in jax.tree_util.tree_leaves(batch):
            args.append(_on_device(jax.random.key_data(x) if _is_key(x) else x, device))
        if traced.has_step_index:
            args.append(jax.device_put(np.int32(start), device))
        return args

    def _unflatten(self, entry: Executable, outs):
        t = entry.traced
        n_state = len(t.state_paths)
        flat = [None] * (n_state + len(t.aux_paths))
        for j, value in zip(entry.results, outs):
            flat[j] = value
        state_leaves = [jax.random.wrap_key_data(v, impl=jax.random.key_impl(k)) if k is not None else v
                        for v, k in zip(flat[:n_state], t.key_leaves)]
        return (jax.tree_util.tree_unflatten(t.state_def, state_leaves),
                jax.tree_util.tree_unflatten(t.aux_def, flat[n_state:]))


def _check_alive(tree, what: str) -> None:
    """Raise DonatedArrayError naming the first leaf whose buffer an earlier donation deleted."""
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(x, jax.Array) and x.is_deleted():
            raise DonatedArrayError(
                f"{what} leaf {jax.tree_util.keystr(path)} was donated to an earlier loopfuse call and its "
                "buffer is gone; pass the state that call returned (state, aux = step(state, batch)), "
                "or compile with donate=False to keep inputs alive")


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


def _on_device(x, device):
    if isinstance(x, jax.Array) and x.devices() == {device}:
        return x
    return jax.device_put(x, device)


def compile_step(fn: Callable, *, donate: bool = True, dump_ir: str | Path | None = None, passes=None,
                 keep_aux=None, steps: int | None = None, device=None) -> Step:
    """Compile ``fn(state, batch) -> (new_state, aux)`` as a whole step through loopfuse's passes.

    donate:   update state in place (params and optimizer state buffers are reused).
    dump_ir:  folder for the IR after tracing and after every pass (or $LOOPFUSE_DUMP_IR).
    passes:   optimization passes (pipeline string or names), default ``pipeline.DEFAULT_PASSES``.
    keep_aux: aux leaf paths to return, e.g. ``("loss",)``; others are not computed (None: all).
    steps:    run that many updates per call in one device loop; aux gains a leading [steps] axis.
    """
    return Step(fn, donate=donate, dump_ir=dump_ir, passes=passes, keep_aux=keep_aux, steps=steps,
                        device=device)
