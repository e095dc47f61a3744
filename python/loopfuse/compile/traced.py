"""What a traced step is, apart from `trace`, which makes one (so that the executable calling it needs no tracer):
`Traced`, its tagged module and the calling convention that maps flat values back to pytrees, and `Effects`,
its side effects."""
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir


@dataclass
class Effects:
    """The side effects of a traced step, as jax's lowering reports them.

    ``host_callbacks`` must be handed to the compiler (the module's callback custom calls index
    into them) and, with ``keepalive``, kept alive as long as the executable.
    """

    host_callbacks: list
    keepalive: Any
    ordered: list                  # the ordered effects, one token argument and result each
    unordered: list

    @property
    def any(self) -> bool:
        return bool(self.host_callbacks or self.ordered or self.unordered)


@dataclass(frozen=True)
class Traced:
    """A traced step: its tagged module and what is needed to map flat values back to pytrees."""

    module: ir.Module
    state_paths: list
    state_def: Any
    state_keys: list               # per state leaf: its PRNG key implementation if a typed key, else None
    aux_def: Any
    aux_paths: list
    aux_keys: list                 # per aux leaf: as state_keys
    aux_kept: list
    has_step_index: bool
    arg_shardings: list | None     # per non-token argument, under a Placement (None: one device)
    out_specs: list                # per flat output: dtype and weak type (typed keys as raw uint32 data)
    effects: "Effects"
    stops: bool = False            # a last flat output: the loop's stop flag (see `stopping`)
    promoted: tuple = ()           # state leaves given weakly typed, taken strongly typed (a loop's carry)
    stopped_arg: bool = False      # a last argument: the loop's initial stopped flag
