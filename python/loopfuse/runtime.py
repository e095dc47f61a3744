"""PJRT runtime: compile a StableHLO module with jaxlib's client and run it on device arrays."""
from dataclasses import dataclass

import jax
import jax.extend.backend as jeb
import numpy as np

from . import _jax_compat


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
        s = executable.get_compiled_memory_stats()
        return cls(s.argument_size_in_bytes, s.output_size_in_bytes, s.alias_size_in_bytes, s.temp_size_in_bytes)


def compile_options(devices, shardy: bool):
    """SPMD options over `devices` (one partition per device), as jax.jit builds them."""
    n = len(devices)
    opts = jeb.get_compile_options(num_replicas=1, num_partitions=n,
                                   device_assignment=np.array([[d.id for d in devices]]))
    build = opts.executable_build_options
    build.use_spmd_partitioning = n > 1
    build.use_shardy_partitioner = shardy
    return opts


def compile_module(text: str, devices):
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several): a LoadedExecutable."""
    backend = jeb.get_backend(devices[0].platform)
    opts = compile_options(devices, shardy="sdy.mesh" in text)
    return backend.compile_and_load(text, list(devices), opts)


def result_handlers(outputs) -> list:
    """C++ result handlers turning each executable result into a (global) jax Array.

    `outputs` gives (global shape, dtype, sharding) per result.
    """
    return [_jax_compat.result_handler(jax.core.ShapedArray(shape, dtype), sharding)
            for shape, dtype, sharding in outputs]


def execute(executable, args, handlers) -> list:
    """Run on device arrays `args` (already placed); results come back through `handlers`."""
    return executable.execute_sharded(args).consume_with_handlers(handlers)
