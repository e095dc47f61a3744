"""PJRT runtime: compile a StableHLO module with jaxlib's client and run it on device arrays."""
from dataclasses import dataclass

import jax
import jax.extend.backend as jeb
import numpy as np

from . import _jax_compat
from .mlir_context import parse_module


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


# XLA options loopfuse sets on each executable it compiles, per device platform (`Device.platform`).
# Copy insertion with region analysis sees that a while loop overwrites each carried state buffer
# only after its last read, so a K-step loop updates parameters and optimizer moments in place
# instead of copying every one the backward pass reads at the top of each iteration.
XLA_DEFAULTS = {
    "cpu": {"xla_cpu_copy_insertion_use_region_analysis": True},
    "gpu": {"xla_gpu_copy_insertion_use_region_analysis": True},
}

# XLA:CPU merges every independent all-reduce of a program into one, whatever their size (XLA:GPU
# stops at 30 MiB). In a data-parallel step that one collective holds all gradients at once, as
# operands and as results: 64 MiB of temporaries for 32 MiB of gradients. A program whose
# replicated state reaches SPLIT_ALL_REDUCE_BYTES is compiled with the combiner off, so each
# gradient is reduced and applied as soon as it is computed (the same sums, bitwise); a smaller
# one keeps the single collective, which costs less latency than many small ones.
SPLIT_ALL_REDUCE = {"cpu": {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}}
SPLIT_ALL_REDUCE_BYTES = 32 << 20


def program_xla_options(platform: str, replicated_state_bytes: int, xla_options=None) -> dict:
    """The XLA options of one program beyond its platform's `XLA_DEFAULTS`: all-reduces left
    uncombined when `replicated_state_bytes` (of a program over several devices) reach
    `SPLIT_ALL_REDUCE_BYTES`, then the caller's `xla_options` over them."""
    split = SPLIT_ALL_REDUCE.get(platform, {}) if replicated_state_bytes >= SPLIT_ALL_REDUCE_BYTES else {}
    return {**split, **check_xla_options(xla_options)}


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


def compile_options(devices, shardy: bool, xla_options=None):
    """SPMD options over `devices` (one partition per device), as jax.jit builds them, with
    loopfuse's XLA options for their platform and `xla_options` merged over them."""
    n = len(devices)
    overrides = {**XLA_DEFAULTS.get(devices[0].platform, {}), **check_xla_options(xla_options)}
    opts = jeb.get_compile_options(num_replicas=1, num_partitions=n,
                                   device_assignment=np.array([[d.id for d in devices]]),
                                   env_options_overrides=dict(sorted(overrides.items())))
    build = opts.executable_build_options
    build.use_spmd_partitioning = n > 1
    build.use_shardy_partitioner = shardy
    return opts


def module_options(text: str, devices, xla_options=None):
    """The compile options of MLIR `text` on `devices` (what `compile_module` compiles with)."""
    return compile_options(devices, shardy="sdy.mesh" in text, xla_options=xla_options)


def compile_module(text: str, devices, *, host_callbacks=(), xla_options=None):
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several): a LoadedExecutable.

    `host_callbacks` are the Python callbacks the module's callback custom calls index into (from
    jax's lowering); the caller keeps them alive as long as the executable. `xla_options` override
    loopfuse's per-platform XLA options (`XLA_DEFAULTS`).
    """
    backend = jeb.get_backend(devices[0].platform)
    opts = module_options(text, devices, xla_options)
    try:
        if host_callbacks:  # only the ir.Module overload takes callbacks
            return backend.compile_and_load(parse_module(text), _jax_compat.device_list(devices), opts,
                                            host_callbacks=list(host_callbacks))
        return backend.compile_and_load(text, list(devices), opts)
    except jax.errors.JaxRuntimeError as e:
        if "compile option" not in str(e) and "While setting option" not in str(e):
            raise
        raise ValueError(f"xla_options {xla_options!r}: {str(e).removeprefix('INVALID_ARGUMENT: ')} (names are "
                         f"XLA DebugOptions fields, e.g. {XLA_DEFAULTS})") from None


def result_handlers(outputs) -> list:
    """C++ result handlers turning each executable result into a (global) jax Array.

    `outputs` gives (global shape, dtype, weak type, sharding) per result.
    """
    return [_jax_compat.result_handler(jax.core.ShapedArray(shape, dtype, weak_type=weak), sharding)
            for shape, dtype, weak, sharding in outputs]


def execute(executable, args, handlers, effects=None) -> list:
    """Run on device arrays `args` (already placed); results come back through `handlers`.

    With `effects` (a `trace.Effects`), the call joins jax's effect ordering as a jax.jit call
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

