"""PJRT runtime: compile a StableHLO module with jaxlib's client and run it on device arrays."""
from dataclasses import dataclass

import jax
import jax.extend.backend as jeb
import jaxlib._jax as xc
import numpy as np


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


def compile_options(devices, shardy: bool) -> xc.CompileOptions:
    """SPMD options over `devices` (one partition per device)."""
    n = len(devices)
    opts = xc.CompileOptions()
    opts.num_replicas, opts.num_partitions = 1, n
    build = opts.executable_build_options
    build.num_replicas, build.num_partitions = 1, n
    build.use_spmd_partitioning = n > 1
    build.use_shardy_partitioner = shardy
    opts.device_assignment = xc.DeviceAssignment.create(np.array([[d.id] for d in devices]).reshape(1, n))
    return opts


def module_options(text: str, devices) -> xc.CompileOptions:
    """The compile options of MLIR `text` on `devices`."""
    return compile_options(devices, shardy="sdy.mesh" in text)


def compile_module(text: str, devices) -> "xc.LoadedExecutable":
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several)."""
    backend = jeb.get_backend(devices[0].platform)
    return backend.compile_and_load(text, xc.DeviceList(tuple(devices)), module_options(text, devices))


def result_handlers(outputs) -> list:
    """C++ result handlers turning each executable result into a (global) jax Array.

    `outputs` gives (global shape, dtype, sharding) per result.
    """
    return [xc.array_result_handler(jax.core.ShapedArray(shape, dtype), sharding, committed=True,
                                    _skip_checks=True) for shape, dtype, sharding in outputs]


def execute(executable, args, handlers) -> list:
    """Run on device arrays `args` (already placed); results come back through `handlers`."""
    return executable.execute_sharded(args).consume_with_handlers(handlers)
