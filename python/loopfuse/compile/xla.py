"""XLA: the options each program is compiled with (decided once, here: `program_options`) and the PJRT
compile of a StableHLO module with jaxlib's client (`compile_module`)."""
from types import MappingProxyType
from typing import Any, Mapping

import jax
import jax.extend.backend as jeb
import numpy as np
from jaxlib.mlir import ir

from .. import _jax_compat, validate
from ..passes import control_flow, wrap_loop
from ..run.runtime import ProgramOptions
from .mlir_context import parse_module

# Copy insertion with region analysis sees that a while loop overwrites each carried state buffer
# only after its last read, so a K-step loop updates parameters and optimizer moments in place
# instead of copying every one the backward pass reads at the top of each iteration. The option is
# exact on straight-line steps and wrap-loop's loop around them, but it changes the results of
# programs with loops and conditionals of their own (diffrax's ODE solves), so `program_options`
# turns it on only for programs without them (see `passes.control_flow`).
COPY_FREE = {"cpu": "xla_cpu_copy_insertion_use_region_analysis", "gpu": "xla_gpu_copy_insertion_use_region_analysis"}

# XLA:CPU merges every independent all-reduce of a program into one, whatever their size (XLA:GPU
# stops at 30 MiB). In a data-parallel step that one collective holds all gradients at once, as
# operands and as results: 64 MiB of temporaries for 32 MiB of gradients. A program whose
# replicated state reaches SPLIT_ALL_REDUCE_BYTES is compiled with the combiner off, so each
# gradient is reduced and applied as soon as it is computed (the same sums, bitwise); a smaller
# one keeps the single collective, which costs less latency than many small ones.
SPLIT_ALL_REDUCE = {"cpu": {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}}
SPLIT_ALL_REDUCE_BYTES = 32 << 20

# XLA:CPU runs the thunks of a computation (a while loop's body) one after the other on its thread
# only where every buffer they use has at most SEQUENTIAL_BYTES (ThunkExecutor's
# execute_sequential_buffer_threshold; no flag sets it); otherwise through its concurrent executor,
# which costs a tiny step about 1 us more per iteration. The loss history of a loop of more than 128
# float32 steps is such a buffer in the body of a step whose tensors are all smaller, so wrap-loop
# writes the histories of such a loop in blocks that small (`history_rows`).
SEQUENTIAL_BYTES = {"cpu": 512}


def program_options(module: ir.Module, platform: str, replicated_state_bytes: int = 0,
                    xla_options=None, adding_control_flow=()) -> ProgramOptions:
    """The XLA options of `module` on `platform`: the only place they are decided.

    - the copy-free loop carry (`COPY_FREE`) when the module has no control flow of its own, none of its passes
      adds some (`adding_control_flow`: their names, as roll-layers' loops) and it updates no tensor in place
      (a dynamic_update_slice or a scatter of its own);
    - all-reduces left uncombined when the floating-point state a mesh replicates reaches
      `SPLIT_ALL_REDUCE_BYTES`;
    - then the caller's `xla_options` over both (a value of None removes an option).

    Examples:
        >>> from loopfuse.compile.mlir_context import parse_module
        >>> m = parse_module("func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }")
        >>> dict(program_options(m, "cpu").values)
        {'xla_cpu_copy_insertion_use_region_analysis': True}
        >>> dict(program_options(m, "cpu", xla_options={COPY_FREE["cpu"]: None}).values)
        {}
    """
    values: dict[str, Any] = {}
    reasons = []
    flag = COPY_FREE.get(platform)
    if flag is not None:
        own = control_flow.own_control_flow(module.operation)
        if adding_control_flow:
            reasons.append(f"{flag}: off, {' and '.join(adding_control_flow)} adds control flow of its own, where "
                           "XLA's region analysis can change results")
        elif own:
            reasons.append(f"{flag}: off, the program has control flow of its own ({control_flow.describe(own[0])}"
                           f"{f' and {len(own) - 1} more' if len(own) > 1 else ''}), where XLA's region analysis "
                           "can change results")
        elif updates := control_flow.own_in_place_updates(module.operation):
            reasons.append(f"{flag}: off, the program updates a tensor in place ({control_flow.describe(updates[0])}"
                           f"{f' and {len(updates) - 1} more' if len(updates) > 1 else ''}), where XLA's region "
                           "analysis can change results")
        else:
            values[flag] = True
            reasons.append(f"{flag}: on (copy-free loop carry), the program has no control flow besides wrap-loop's "
                           "loop and no in-place update")
    if replicated_state_bytes >= SPLIT_ALL_REDUCE_BYTES and platform in SPLIT_ALL_REDUCE:
        values.update(SPLIT_ALL_REDUCE[platform])
        reasons.append(f"{SPLIT_ALL_REDUCE[platform]}: each gradient reduced on its own, the mesh replicates "
                       f"{replicated_state_bytes / 2**20:.1f} MiB of floating-point state")
    for name, value in validate.xla_options(xla_options).items():
        if value is None:
            values.pop(name, None)
            reasons.append(f"{name}: not set (xla_options)")
        else:
            values[name] = value
            reasons.append(f"{name}={value!r} (xla_options)")
    return ProgramOptions(MappingProxyType(dict(sorted(values.items()))), tuple(reasons))


def history_rows(module: ir.Module, platform: str, steps: int | None) -> int:
    """wrap-loop's ``rows`` for a loop of `steps` steps of `module` on `platform` (0: one loop; see
    `SEQUENTIAL_BYTES`)."""
    limit = SEQUENTIAL_BYTES.get(platform)
    return 0 if limit is None or steps is None else wrap_loop.history_rows(module.operation, steps, limit)


def uses_shardy(module: ir.Module) -> bool:
    """Whether the module is partitioned with Shardy (it declares an ``sdy.mesh``)."""
    return any(op.operation.name == "sdy.mesh" for op in module.body.operations)


def compile_options(devices, values: Mapping[str, Any], *, shardy: bool):
    """SPMD options over `devices` (one partition per device), as jax.jit builds them, with the XLA
    option `values` (from `program_options`)."""
    n = len(devices)
    opts = jeb.get_compile_options(num_replicas=1, num_partitions=n,
                                   device_assignment=np.array([[d.id for d in devices]]),
                                   env_options_overrides=dict(values))
    build = opts.executable_build_options
    build.use_spmd_partitioning = n > 1
    build.use_shardy_partitioner = shardy
    return opts


def compile_module(text: str, devices, options, *, host_callbacks=()):
    """Compile MLIR text for `devices` (one device, or an SPMD mesh of several) with the compile
    `options` (`compile_options`): a LoadedExecutable.

    `host_callbacks` are the Python callbacks the module's callback custom calls index into (from
    jax's lowering); the caller keeps them alive as long as the executable.
    """
    backend = jeb.get_backend(devices[0].platform)
    try:
        if host_callbacks:  # only the ir.Module overload takes callbacks
            return backend.compile_and_load(parse_module(text), _jax_compat.device_list(devices), options,
                                            host_callbacks=list(host_callbacks))
        return backend.compile_and_load(text, list(devices), options)
    except jax.errors.JaxRuntimeError as e:
        if "compile option" not in str(e) and "While setting option" not in str(e):
            raise
        overrides = dict(options.env_option_overrides)
        raise ValueError(f"XLA options {overrides}: {str(e).removeprefix('INVALID_ARGUMENT: ')} (names are "
                         f"XLA DebugOptions fields, e.g. {COPY_FREE['cpu']!r})") from None
