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


# XLA options loopfuse sets on each executable it compiles, per device platform (`Device.platform`).
# Copy insertion with region analysis sees that a while loop overwrites each carried state buffer
# only after its last read, so a K-step loop updates parameters and optimizer moments in place
# instead of copying every one the backward pass reads at the top of each iteration.
XLA_DEFAULTS = {
    "cpu": {"xla_cpu_copy_insertion_use_region_analysis": True},
    "gpu": {"xla_gpu_copy_insertion_use_region_analysis": True},
}


def check_xla_options(xla_options) -> dict:
    """`xla_options` (None or a mapping of XLA option name to bool/int/float/str) as a dict."""
    if xla_options is None:
        return {}
    if not hasattr(xla_options, "items"):
        raise TypeError(f"xla_options must be a mapping of XLA option names to values, got {xla_options!r}")
    for name, value in xla_options.items():
        if not isinstance(name, str) or not isinstance(value, (bool, int, float, str)):
            raise TypeError(f"xla_options[{name!r}] = {value!r}: names must be str and values bool, int, "
                            "float or str")
    return dict(xla_options)


def compile_options(devices, shardy: bool, xla_options=None) -> xc.CompileOptions:
    """SPMD options over `devices` (one partition per device), with loopfuse's XLA options for
    their platform and `xla_options` merged over them."""
    n = len(devices)
    opts = xc.CompileOptions()
    overrides = {**XLA_DEFAULTS.get(devices[0].platform, {}), **check_xla_options(xla_options)}
    opts.env_option_overrides = sorted(overrides.items())
    opts.num_replicas, opts.num_partitions = 1, n
    build = opts.executable_build_options
    build.num_replicas, build.num_partitions = 1, n
    build.use_spmd_partitioning = n > 1
    build.use_shardy_partitioner = shardy
    opts.device_assignment = xc.DeviceAssignment.create(np.array([[d.id] for d in devices]).reshape(1, n))
    return opts


def compile_module(text: str, devices, xla_options=None) -> "xc.LoadedExecutable":
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several); `xla_options`
    override loopfuse's per-platform XLA options (`XLA_DEFAULTS`)."""
    backend = jeb.get_backend(devices[0].platform)
    opts = compile_options(devices, shardy="sdy.mesh" in text, xla_options=xla_options)
    try:
        return backend.compile_and_load(text, xc.DeviceList(tuple(devices)), opts)
    except jax.errors.JaxRuntimeError as e:
        if "compile option" not in str(e) and "While setting option" not in str(e):
            raise
        raise ValueError(f"xla_options {xla_options!r}: {str(e).removeprefix('INVALID_ARGUMENT: ')} (names are "
                         f"XLA DebugOptions fields, e.g. {XLA_DEFAULTS})") from None


def result_handlers(outputs) -> list:
    """C++ result handlers turning each executable result into a (global) jax Array.

    `outputs` gives (global shape, dtype, sharding) per result.
    """
    return [xc.array_result_handler(jax.core.ShapedArray(shape, dtype), sharding, committed=True,
                                    _skip_checks=True) for shape, dtype, sharding in outputs]


def execute(executable, args, handlers) -> list:
    """Run on device arrays `args` (already placed); results come back through `handlers`."""
    return executable.execute_sharded(args).consume_with_handlers(handlers)
