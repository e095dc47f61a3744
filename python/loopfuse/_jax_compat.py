"""The private jax/jaxlib APIs loopfuse uses, behind one module (like Enzyme-JAX's compat shim).

Each private API is looked up and self-tested at first use. When it is missing, renamed or fails
its self-test, loopfuse warns once and takes the public route instead:

  private (fast)                                       public fallback
  jaxlib._jax.array_result_handler                     jax.make_array_from_single_device_arrays
  jaxlib.mlir._mlir_libs._jax_mlir_ext dialects        jax.interpreters.mlir.make_ir_context

``LOOPFUSE_JAX_COMPAT=fallback`` forces the public routes (the tests run both). Public APIs are
used directly where they exist: jax.extend.backend.get_compile_options (runtime) and
jaxlib.mlir.dialects.stablehlo.eval_module (the tests' reference interpreter).

Effects (host callbacks such as ``jax.debug.print``, ordered-effect tokens) have no public route:
the functions under "effects" below use jax's own private objects, and when those are gone a step
that has effects is refused with `UnsupportedJaxError` (a step without effects never needs them).
"""
import functools
import os
import warnings
from typing import Callable

import jax
import numpy as np
from jaxlib.mlir import ir

FORCE_ENV = "LOOPFUSE_JAX_COMPAT"
_SELF_TEST_MODULE = """
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  %1 = chlo.erf %0 : tensor<2xf32> -> tensor<2xf32>
  return %1 : tensor<2xf32>
}"""


def status() -> dict:
    """Which route each feature takes: {"result_handler": "private" | "fallback", "dialects": ...}."""
    return {"result_handler": "private" if _array_result_handler() else "fallback",
            "dialects": "private" if _register_jax_dialects() else "fallback"}


def result_handler(aval: jax.core.ShapedArray, sharding) -> Callable:
    """A callable turning one executable output's per-device arrays into a global jax Array with
    `sharding` (for ``ExecuteResults.consume_with_handlers``)."""
    make = _array_result_handler()
    if make is not None:
        return make(aval, sharding, committed=True, _skip_checks=True)
    return functools.partial(jax.make_array_from_single_device_arrays, aval.shape, sharding)


def mlir_context() -> ir.Context:
    """A fresh MLIR context with the upstream dialects jax uses (func, arith, ...) registered and
    loaded; stablehlo/chlo/sdy are loaded by the caller (public bindings)."""
    register = _register_jax_dialects()
    if register is None:
        return jax.interpreters.mlir.make_ir_context()
    return _private_context(register)


# ---- detection -------------------------------------------------------------------------------
def _detect(feature: str, load: Callable, self_test: Callable):
    """`load()` if its result passes `self_test`, else None (with one warning naming the failure)."""
    if os.environ.get(FORCE_ENV) == "fallback":
        return None
    try:
        api = load()
        self_test(api)
        return api
    except Exception as e:  # missing, renamed or changed in this jax: any failure means the fallback
        warnings.warn(f"loopfuse: {feature} in jax {jax.__version__} failed its self-test "
                      f"({type(e).__name__}: {e}); using the public fallback", stacklevel=3)
        return None


def _load_array_result_handler():
    from jaxlib import _jax
    return _jax.array_result_handler


def _test_array_result_handler(make) -> None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    data = np.arange(2, dtype=np.float32)
    out = make(jax.core.ShapedArray((2,), np.float32), sharding, committed=True, _skip_checks=True)(
        [jax.device_put(data, sharding)])
    if not (isinstance(out, jax.Array) and out.sharding == sharding and np.array_equal(out, data)):
        raise AssertionError(f"a result handler returned {out!r}")


@functools.cache
def _array_result_handler():
    return _detect("jaxlib._jax.array_result_handler", _load_array_result_handler, _test_array_result_handler)


def _load_jax_dialects():
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    return _jax_mlir_ext.register_dialects


def _private_context(register) -> ir.Context:
    registry = ir.DialectRegistry()
    register(registry)
    ctx = ir.Context()
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    return ctx


def _test_jax_dialects(register) -> None:
    from jaxlib.mlir.dialects import chlo, stablehlo
    ctx = _private_context(register)
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    with ctx:
        ir.Module.parse(_SELF_TEST_MODULE).operation.verify()


@functools.cache
def _register_jax_dialects():
    return _detect("jaxlib.mlir._mlir_libs._jax_mlir_ext.register_dialects", _load_jax_dialects, _test_jax_dialects)


# ---- effects: private only (a step with effects is refused when they are gone) ---------------
class UnsupportedJaxError(RuntimeError):
    """This jax lacks a private API that a feature of the traced step needs."""


def lowering_effects(lowered) -> dict | None:
    """The host callbacks and effects jax's own compile of `lowered` would use (keys
    host_callbacks, keepalive, ordered_effects, unordered_effects), or None if this jax hides them."""
    try:
        args = lowered._lowering.compile_args
        return {k: args[k] for k in ("host_callbacks", "keepalive", "ordered_effects", "unordered_effects")}
    except (AttributeError, KeyError, TypeError):
        return None


def device_list(devices):
    """jaxlib's DeviceList of `devices` (the compile overload that takes host callbacks needs one)."""
    try:
        from jaxlib import _jax
        return _jax.DeviceList(tuple(devices))
    except (ImportError, AttributeError) as e:
        raise UnsupportedJaxError(f"compiling host callbacks needs jaxlib._jax.DeviceList ({e})") from None


def runtime_tokens():
    """jax's per-thread tokens that order effectful computations (so loopfuse calls join them)."""
    try:
        from jax._src import dispatch
        return dispatch.runtime_tokens
    except (ImportError, AttributeError) as e:
        raise UnsupportedJaxError(f"ordered effects need jax._src.dispatch.runtime_tokens ({e})") from None


def effect_token(bufs):
    """One effect's output token buffers (one per device) as a jax Token."""
    try:
        from jax._src.core import Token
    except ImportError as e:
        raise UnsupportedJaxError(f"ordered effects need jax._src.core.Token ({e})") from None
    if len(bufs) == 1:
        return Token(bufs[0])
    devices = [next(iter(b.sharding.device_set)) for b in bufs]
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, "x"), jax.sharding.PartitionSpec("x"))
    return Token(jax.make_array_from_single_device_arrays((0,), sharding, bufs))
