"""One compiled executable and its calling convention: flat leaves in (placed, typed keys as raw
data, no buffer donated twice), pytrees out."""
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jax
import numpy as np
from jaxlib.mlir import ir

from ..passes.functions import main_func, result_attrs
from ..passes.module_pass import reports
from ..passes.vocabulary import RESULT, STEPS_RUN, STOPPED
from ..run import runtime
from ..state.leaves import is_key, raw, wrap_keys
from .traced import Traced


@dataclass
class Executable:
    """One executable for one abstract signature and its calling convention: flat leaves in
    (placed, keys as raw data, no buffer donated twice), pytrees out."""

    traced: Traced
    module: ir.Module              # the final module (after the passes): what XLA compiled
    executable: Any
    results: list                  # flat output index of each executable result
    handlers: list                 # result handler of each executable result (makes the jax Array)
    arg_targets: list              # sharding of each executable argument
    key_args: list                 # argument positions that hold typed PRNG keys (passed as raw data)
    donate: bool
    program: runtime.ProgramOptions                # the XLA options it was compiled with, and why
    passes: tuple                                  # the passes its module ran (loaded from the cache: would have)
    seconds: dict = field(default_factory=dict)    # trace / each pass / xla
    memory_plan: Any = None                        # the `memory_plan.MemoryPlan` that chose it (memory_limit)

    @classmethod
    def build(cls, traced: Traced, module: ir.Module, executable, leaves, placement, device, donate: bool,
              program: runtime.ProgramOptions, passes: tuple, seconds) -> "Executable":
        """The calling convention of `executable`, compiled from `traced` (its final `module`, after `passes`),
        for the flat input `leaves` (or their abstract values): which flat output each result is, where results
        land, where arguments must be."""
        with module.context:
            main = main_func(module.operation)
            tagged = [(a, t) for a, t in zip(result_attrs(main), main.type.results) if RESULT in a]
            results = [ir.IntegerAttr(a[RESULT]).value for a, _ in tagged]  # effect tokens have no RESULT
            specs = [jax.ShapeDtypeStruct((), np.int32) if STEPS_RUN in a else
                     jax.ShapeDtypeStruct((), np.bool_) if STOPPED in a else traced.out_specs[j]
                     for j, (a, _) in zip(results, tagged)]
            shapes = [tuple(ir.RankedTensorType(t).shape) for _, t in tagged]
            n_args = len(main.type.inputs) - len(traced.effects.ordered)
        if traced.arg_shardings is None:
            single = jax.sharding.make_single_device_sharding(device)
            arg_targets, out_shardings = [single] * n_args, [single] * len(results)
        else:
            n_state = len(traced.state_paths)
            arg_targets = traced.arg_shardings
            out_shardings = [arg_targets[j] if j < n_state else placement.replicated for j in results]
        handlers = runtime.result_handlers(
            [(s, spec.dtype, spec.weak_type, sh) for spec, s, sh in zip(specs, shapes, out_shardings)])
        key_args = [i for i, x in enumerate(leaves) if is_key(x)]
        return cls(traced, module, executable, results, handlers, arg_targets, key_args, donate, program, passes,
                   seconds)

    @property
    def xla_options(self) -> dict:
        """The XLA options loopfuse compiled this executable with (beyond XLA's defaults)."""
        return dict(self.program.values)

    @property
    def reports(self) -> dict[str, str]:
        """What the passes that report did (pass name -> text), e.g. ``reports["roll-layers"]``: which
        layers rolled, what is saved and recomputed, why a run did not roll; and under a memory limit,
        ``reports["memory-limit"]``: the plan chosen, its figures and the plans rejected."""
        found = reports(self.module.operation)
        return found if self.memory_plan is None else {**found, "memory-limit": str(self.memory_plan)}

    @cached_property
    def memory(self) -> runtime.MemoryStats:
        """XLA's compiled figures (read once: PJRT computes them on each request, 45 ms on a GPT's program)."""
        return runtime.MemoryStats.of(self.executable)

    def __call__(self, leaves: list, start: int = 0, stopped=False):
        """Run on the flat state+batch `leaves`; returns ``(new_state, aux)`` (and the steps run and
        whether the stop ended it, for a loop that can stop early: one that starts `stopped` runs none)."""
        outs = runtime.execute(self.executable, self._arguments(leaves, start, stopped), self.handlers,
                               self.traced.effects)
        return self._unflatten(outs)

    def _arguments(self, leaves, start, stopped) -> list:
        t = self.traced
        args = leaves + [np.int32(start)] * t.has_step_index + [stopped if isinstance(stopped, jax.Array)
                                                                else np.bool_(stopped)] * t.stopped_arg
        for i in self.key_args:
            args[i] = raw(args[i])
        args = [x if getattr(x, "sharding", None) is t else _place(x, t) for x, t in zip(args, self.arg_targets)]
        if self.donate and len(set(map(id, leaves))) < len(leaves):
            _unshare(args, leaves)
        return args

    def _unflatten(self, outs):
        t = self.traced
        n_state = len(t.state_paths)
        n_out = n_state + len(t.aux_paths)
        flat = [None] * (n_out + 2 * t.stops)     # a stopping loop's steps run and stopped flag
        for j, value in zip(self.results, outs):
            flat[j] = value
        return (jax.tree_util.tree_unflatten(t.state_def, wrap_keys(flat[:n_state], t.state_keys)),
                jax.tree_util.tree_unflatten(t.aux_def, wrap_keys(flat[n_state:n_out], t.aux_keys)), *flat[n_out:])


def _unshare(args: list, leaves: list) -> None:
    """Copy, in place, each argument whose leaf is an array an earlier leaf already is: one buffer
    passed as two leaves cannot be donated twice (even when placing it made two Array objects)."""
    seen = set()
    for i, x in enumerate(leaves):
        if id(x) in seen:
            args[i] = jax.device_put(args[i], args[i].sharding, may_alias=False)
        seen.add(id(x))


def _place(x, sharding):
    """`x` as a device array with `sharding` (no copy when it already has an equal one)."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    return jax.device_put(x, sharding)
