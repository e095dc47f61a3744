"""PJRT runtime: run a compiled executable on device arrays, and what it was compiled as (`ProgramOptions`,
`MemoryStats`); `xla` compiles it."""
from dataclasses import dataclass
from typing import Any, Mapping

import jax

from .. import _jax_compat


@dataclass(frozen=True)
class MemoryStats:
    """Bytes from the compiled executable; ``peak`` = arguments + outputs - aliased + temporaries."""

    argument: int
    output: int
    alias: int
    temp: int

    @property
    def peak(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    @classmethod
    def of(cls, executable) -> "MemoryStats":
        return cls.from_analysis(executable.get_compiled_memory_stats())

    @classmethod
    def from_analysis(cls, s) -> "MemoryStats":
        """From XLA's ``*_size_in_bytes`` fields (a PJRT executable's compiled memory stats, or
        ``jax.jit(f).lower(...).compile().memory_analysis()``)."""
        return cls(s.argument_size_in_bytes, s.output_size_in_bytes, s.alias_size_in_bytes, s.temp_size_in_bytes)


@dataclass(frozen=True)
class ProgramOptions:
    """The XLA options one program is compiled with (only those loopfuse or the caller set; XLA's
    defaults otherwise) and one line per decision saying why."""

    values: Mapping[str, Any]
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return "".join(f"{line}\n" for line in self.reasons)


def result_handlers(outputs) -> list:
    """C++ result handlers turning each executable result into a (global) jax Array.

    `outputs` gives (global shape, dtype, weak type, sharding) per result.
    """
    return [_jax_compat.result_handler(jax.core.ShapedArray(shape, dtype, weak_type=weak), sharding)
            for shape, dtype, weak, sharding in outputs]


def execute(executable, args, handlers, effects=None) -> list:
    """Run on device arrays `args` (already placed); results come back through `handlers`.

    With `effects` (a `traced.Effects`), the call joins jax's effect ordering as a jax.jit call
    does: it takes the current token of each ordered effect as its leading arguments, returns
    the new ones, and registers its runtime tokens (so `jax.effects_barrier()` waits for it).
    """
    if effects is None or not effects.any:
        return executable.execute_sharded(args).consume_with_handlers(handlers)
    tokens = _jax_compat.runtime_tokens()
    devices = executable.local_devices()
    ordered = effects.ordered
    token_args = [tokens.get_token_input(e, devices)._buf for e in ordered]
    results = executable.execute_sharded([*token_args, *args], with_tokens=True)
    token_results = results.consume_with_handlers([lambda bufs: bufs] * len(ordered), strict=False)
    runtime_token = results.consume_token()
    for i, device in enumerate(devices):
        tokens.set_output_runtime_token(device, runtime_token.get_token(i))
    for e, bufs in zip(ordered, token_results):
        tokens.set_token_result(e, _jax_compat.effect_token(bufs))
    return results.consume_with_handlers(handlers)

