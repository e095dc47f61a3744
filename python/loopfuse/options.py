"""StepOptions: everything that changes a step's compiled program, each option documented here once."""
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import jax

from . import pipeline, runtime, stopping, validate
from .sharding import Placement


@dataclass(frozen=True)
class StepOptions:
    """Everything that changes the compiled program: `compile_step`'s keywords, and `Step.loop`'s.

    Attributes:
        donate: update the state in place (params and optimizer state buffers are reused); the
            state a call is given is consumed.
        passes: optimization passes (a pipeline string or names, e.g. ``"flatten-update{min-group=3}"``),
            default ``pipeline.DEFAULT_PASSES``.
        keep_aux: aux leaf paths to return, e.g. ``("loss",)``; the others are not computed (None: all).
        steps: run that many updates per call in one device loop; aux gains a leading [steps] axis.
        device: the one device to run on (default: the first).
        devices: run SPMD over a mesh of these devices (with `sharding`).
        sharding: over `devices`, "data" (default) splits the batch and replicates the state, "params"
            also splits large state leaves (see `sharding`).
        dump_ir: folder for the IR after tracing and after every pass (or $LOOPFUSE_DUMP_IR); each
            program gets its own subfolder ``<fn name>-<digest>`` (see `pipeline.dump_folder`).
        xla_options: XLA compile options (``{"xla_...": value}``) merged over the options loopfuse
            decides per program (`runtime.program_options`: the copy-free loop carry where it is safe),
            e.g. ``{"xla_cpu_copy_insertion_use_region_analysis": False}`` turns that off; a value of
            None leaves an option unset.
        until: a loop's stop predicate ``pred(new_state, aux) -> scalar bool`` (see `Step.loop`).
        stop_on_nonfinite: a loop stops after a step whose kept floating aux leaves hold a NaN or Inf
            (see `Step.loop`).
        cache_dir: folder of the persistent compile cache (or $LOOPFUSE_CACHE_DIR); a program compiled
            once on this machine loads from it instead of running the passes and XLA again.
        verify: check each new executable's first call against jax.jit of the step function on copies
            of the inputs and raise `MiscompileError` naming the first differing leaf and the pass or
            XLA option that causes it (default: $LOOPFUSE_VERIFY; see `verify`).
        memory_budget: roll repeated layers (a Python loop over alike layers) into a forward and a
            backward device loop over stacked leaves, recomputing activations (the ``roll-layers``
            pass): 0.0 keeps the least memory; b in (0, 1) also saves the matrix products dearest to
            recompute, up to b of their bytes; 1.0 (or None, the default) leaves the step as traced.
            A rolled program matches jax.jit within a tolerance, not bitwise (README, "Rolling
            repeated layers"); ``Executable.reports["roll-layers"]`` says what rolled.
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
    memory_budget: float | None = None
    placement: Placement | None = field(init=False, repr=False, compare=False)  # of `devices` (None: one device)

    def __post_init__(self) -> None:
        if self.memory_budget is not None:
            object.__setattr__(self, "memory_budget", validate.budget(self.memory_budget))
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
        object.__setattr__(self, "placement", None if self.devices is None else Placement(self.devices, self.sharding or "data"))

    def pipeline(self, rows: int = 0) -> list:
        """The passes the program runs (`pipeline.build` of these options; wrap-loop's `rows`, see
        `runtime.history_rows`)."""
        return pipeline.build(self.passes, steps=self.steps, donate=self.donate, memory_budget=self.memory_budget,
                              rows=rows)

    @property
    def stops(self) -> bool:
        """Whether the program is a loop that can stop early."""
        return self.steps is not None and (self.until is not None or self.stop_on_nonfinite)

    @property
    def program_devices(self) -> list:
        """The devices the program runs on: the mesh's, or the one device."""
        return self.placement.devices if self.placement else [self.device or jax.devices()[0]]
