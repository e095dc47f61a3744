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


def compile_module(text: str, devices) -> "xc.LoadedExecutable":
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several)."""
    backend = jeb.get_backend(devices[0].platform)
    opts = compile_options(devices, shardy="sdy.mesh" in text)
    return backend.compile_and_load(text, xc.DeviceList(tuple(devices)), opts)


def execute(executable, args, outputs) -> list:
    """Run on global device arrays `args`; `outputs` gives (global shape, sharding or None) per result."""
    per_device = executable.execute_sharded(args).disassemble_into_single_device_arrays()
    return [shards[0] if sharding is None else jax.make_array_from_single_device_arrays(shape, sharding, shards)
            for shards, (shape, sharding) in zip(per_device, outputs)]
