"""The private jax/jaxlib APIs loopfuse uses, behind one module (like Enzyme-JAX's compat shim).

Each private API is looked up and self-tested at first use. When it is missing, renamed or fails
its self-test, loopfuse warns once and takes the public route instead:

  private (fast)                                       public fallback
  jaxlib._jax.array_result_handler                     jax.make_array_from_single_device_arrays
                                                       (no weak types: a weak output comes back strong)
  jaxlib.mlir._mlir_libs._jax_mlir_ext dialects        jax.interpreters.mlir.make_ir_context
  jaxlib._jax.pjit (C++ dispatch of a step call)       loopfuse's Python call path
  jax's jaxpr dead-code elimination (`lower_pruned`)   the step lowered as traced (XLA may compile
                                                       a loop of it to other last bits than jax.jit)
  jax._src.config.trace_context (`trace_context`)      the public jax.config values that change tracing

The pass library, which imports MLIR bindings only, keeps its own in ``passes/_mlir_compat.py``.
``LOOPFUSE_JAX_COMPAT=fallback`` forces the public routes (the tests run both). Public APIs are
used directly where they exist: jax.extend.backend.get_compile_options (runtime) and
jaxlib.mlir.dialects.stablehlo.eval_module (the tests' reference interpreter).

Effects (host callbacks such as ``jax.debug.print``, ordered-effect tokens) and the values of the
arrays a step closes over that jax 0.11+ lowers as arguments (`lowering_constants`) have no public
route: the functions below use jax's own private objects, and when those are gone a step that needs
them is refused with `UnsupportedJaxError` (a step without them never needs them).

jax itself is imported by the functions that use it, so that making an MLIR context (all that
loopfuse-opt needs) does not import it.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Hashable, NamedTuple, Sequence

import numpy as np
from jaxlib.mlir import ir

if TYPE_CHECKING:
    import jax

FORCE_ENV = "LOOPFUSE_JAX_COMPAT"
_SELF_TEST_MODULE = """
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  %1 = chlo.erf %0 : tensor<2xf32> -> tensor<2xf32>
  return %1 : tensor<2xf32>
}"""
# the public jax.config values that change what a function traces to (`trace_context`'s fallback)
_TRACE_CONFIG = ("jax_enable_x64", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                 "jax_default_matmul_precision", "jax_softmax_custom_jvp", "jax_threefry_partitionable",
                 "jax_random_seed_offset", "jax_debug_key_reuse")


def status() -> dict:
    """Which route each feature takes: {"result_handler": "private" | "fallback", "dialects": ...,
    "dispatch": ..., "dce": ..., "trace_context": ...}."""
    return {"result_handler": "private" if _array_result_handler() else "fallback",
            "dialects": "private" if _register_jax_dialects() else "fallback",
            "dispatch": "private" if _cpp_dispatch() else "fallback",
            "dce": "private" if _prune() else "fallback",
            "trace_context": "private" if _trace_context() else "fallback"}


def result_handler(aval: jax.core.ShapedArray, sharding) -> Callable:
    """A callable turning one executable output's per-device arrays into a global jax Array with
    `sharding` (for ``ExecuteResults.consume_with_handlers``)."""
    import jax
    make = _array_result_handler()
    if make is not None:
        return make(aval, sharding)
    return functools.partial(jax.make_array_from_single_device_arrays, aval.shape, sharding)


def mlir_context() -> ir.Context:
    """A fresh MLIR context with the upstream dialects jax uses (func, arith, ...) registered and
    loaded; stablehlo/chlo/sdy are loaded by the caller (public bindings)."""
    register = _register_jax_dialects()
    if register is None:
        import jax.interpreters.mlir
        return jax.interpreters.mlir.make_ir_context()
    return _private_context(register)


class FastpathData(NamedTuple):
    """How jaxlib's C++ dispatcher repeats a call without Python (the fields jaxlib reads, by name):
    the loaded executable; the output pytree (dispatch registry: typed keys as their raw data) and
    per flat output its aval, sharding and committedness; per flat argument whether the executable
    takes it; per taken argument its sharding (where a host value or a misplaced array is put) and
    layout (None: default)."""

    xla_executable: Any
    out_pytree_def: Any
    in_shardings: Sequence
    out_shardings: Sequence
    out_avals: Sequence
    out_committed: Sequence
    kept_var_bitvec: Sequence
    in_device_local_layouts: Sequence
    const_args: Sequence = ()


def cpp_dispatcher(name: str, fun: Callable, cache_miss: Callable, static_argnames=()) -> Callable | None:
    """A C++ callable that runs ``fun(*args, **static)`` as jax.jit's C++ path does, or None when this
    jax lacks it (call `fun` then).

    On a new signature (tree structures, avals, shardings, static arguments) it calls
    ``cache_miss(*args, **static)``, which returns ``(outputs, FastpathData | None, False)``; with
    data, later calls of that signature flatten, place and execute in C++; with None they call
    `cache_miss` again. Under ``jax.disable_jit()`` it calls `fun`.
    """
    api = _cpp_dispatch()
    if api is None:
        return None
    pjit, cache_type, registry = api
    return pjit(name, fun, cache_miss, [], list(static_argnames), (), registry, _put, cache_type(capacity=4096))


def lower_pruned(traced: jax.stages.Traced) -> jax.stages.Lowered:
    """`traced` (a ``jax.jit(f, keep_unused=True).trace(...)``) lowered with the dead code jax.jit
    removes before lowering removed and every input kept: jax.jit's default (keep_unused=False)
    prunes its jaxpr, inside nested jits and loops too, while keep_unused=True lowers it as traced.
    As traced where this jax hides its DCE."""
    prune = _prune()
    return traced.lower() if prune is None else prune(traced).lower()


def trace_context() -> Hashable:
    """This thread's jax configuration that tracing reads (x64, dtype and rank promotion, matmul precision, ...,
    set globally or by a context manager): what jax.jit keys its caches on besides the arguments."""
    context = _trace_context()
    if context is None:
        import jax
        return tuple(getattr(jax.config, name, None) for name in _TRACE_CONFIG)
    return context()


def dispatch_flatten(tree) -> tuple[list, Any]:
    """(leaves, treedef) of `tree` as the C++ dispatcher flattens it (typed PRNG keys as their raw data)."""
    return _cpp_dispatch()[2].flatten(tree, None)


def _put(x, sharding, layout):
    """Where the C++ dispatcher cannot place an argument itself (host values on several devices,
    an array on another device count): put it with `sharding`."""
    import jax
    return jax.device_put(x, sharding)


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
        import jax
        warnings.warn(f"loopfuse: {feature} in jax {jax.__version__} failed its self-test "
                      f"({type(e).__name__}: {e}); using the public fallback", stacklevel=3)
        return None


def _load_array_result_handler():
    """`make(aval, sharding)` over jaxlib's array_result_handler, committed, unchecked where it checks:
    jaxlib 0.12 no longer checks and dropped the `_skip_checks` keyword (read from its signature)."""
    from jaxlib import _jax
    make = _jax.array_result_handler
    skip = {"_skip_checks": True} if "_skip_checks" in (make.__doc__ or "") else {}
    return functools.partial(make, committed=True, **skip)


def _test_array_result_handler(make) -> None:
    import jax
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0])
    data = np.arange(2, dtype=np.float32)
    out = make(jax.core.ShapedArray((2,), np.float32), sharding)([jax.device_put(data, sharding)])
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


def _load_cpp_dispatch():
    from jax._src.tree_util import dispatch_registry
    from jaxlib import _jax
    return _jax.pjit, _jax.PjitFunctionCache, dispatch_registry


_DONATING_MODULE = """
func.func public @main(%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<f32>) -> tensor<2xf32> {
  %0 = stablehlo.broadcast_in_dim %b, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %1 = stablehlo.add %a, %0 : tensor<2xf32>
  return %1 : tensor<2xf32>
}"""


def _test_cpp_dispatch(api) -> None:
    """A donating executable run through the dispatcher: one cache miss, then C++ calls that
    consume the donated argument, put a host scalar, and rebuild the output pytree."""
    import jax
    import jax.extend.backend as jeb
    pjit, cache_type, registry = api
    device = jax.devices()[0]
    executable = jeb.get_backend(device.platform).compile_and_load(
        _DONATING_MODULE, [device], jeb.get_compile_options(num_replicas=1, num_partitions=1))
    sharding = jax.sharding.make_single_device_sharding(device)
    misses = []

    def cache_miss(x, b):
        misses.append(b)
        out = {"y": jax.device_put(np.asarray(x) + b, sharding)}
        leaves, tree = registry.flatten(out, None)
        return out, FastpathData(executable, tree, [sharding] * 2, [sharding], [y.aval for y in leaves],
                                 [True], [True, True], [None, None]), False

    call = pjit("loopfuse_self_test", None, cache_miss, [], [], (), registry, _put, cache_type(capacity=4))
    call(jax.device_put(np.zeros(2, np.float32), sharding), np.float32(1))   # typed: a Python float is f64 under x64
    x = jax.device_put(np.arange(2, dtype=np.float32), sharding)
    out = call(x, np.float32(2))
    if not (misses == [1.0] and x.is_deleted() and list(out) == ["y"] and out["y"].sharding == sharding
            and np.array_equal(out["y"], [2.0, 3.0])):
        raise AssertionError(f"misses {misses}, donated input deleted: {x.is_deleted()}, output {out!r}")


@functools.cache
def _cpp_dispatch():
    return _detect("jaxlib._jax.pjit", _load_cpp_dispatch, _test_cpp_dispatch)


def _load_prune():
    """``prune(traced) -> Traced``: a copy of `traced` holding jax's recursive DCE of its jaxpr, every
    input kept, unused closed-over constants dropped (as jax.jit's own DCE before lowering; jax
    0.10's ClosedJaxpr, or 0.12's Jaxpr that holds its constants), lowered without a second trace."""
    import copy

    from jax._src.interpreters import partial_eval as pe

    def prune(traced):
        jaxpr = traced._params["jaxpr"]
        closed = hasattr(jaxpr, "jaxpr")   # a ClosedJaxpr (jax 0.10)
        inner = jaxpr.jaxpr if closed else jaxpr
        kept, used_consts, _ = pe.dce_jaxpr_consts(
            inner, [True] * len(inner.outvars), [False] * len(inner.constvars) + [True] * len(inner.invars))
        if closed:
            kept = type(jaxpr)(kept, [c for c, used in zip(jaxpr.consts, used_consts) if used])
        out = copy.copy(traced)
        out._params, out._lojax = {**traced._params, "jaxpr": kept}, None
        return out
    return prune


def _test_prune(prune) -> None:
    import jax
    import jax.numpy as jnp
    table = np.arange(3, dtype=np.float32)

    def f(x, unused):   # a dead output of a nested jit: jax.jit prunes it inside the nested call
        return jax.jit(lambda y: (jnp.sin(y) + table, jnp.cos(y)))(x)[0]
    args = np.float32(1), np.float32(2)
    traced = jax.jit(f, keep_unused=True).trace(*args)
    lowered = prune(traced).lower()
    text = lowered.as_text()
    if "cosine" in text or "sine" not in text or len(lowered.in_avals[0]) != 2:
        raise AssertionError(f"dead-code elimination lowered {text}")
    if not np.array_equal(lowered.compile()(*args), jax.jit(f)(*args)):
        raise AssertionError("the pruned program computed another value than jax.jit's")
    if "cosine" not in traced.lower().as_text():
        raise AssertionError("pruning changed the Traced it copied")


@functools.cache
def _prune():
    return _detect("jax's jaxpr dead-code elimination", _load_prune, _test_prune)


def _load_trace_context():
    from jax._src import config
    return config.trace_context


def _test_trace_context(context) -> None:
    """The context is hashable, the same again once a change is undone, and tells x64 on from off and strict
    dtype promotion from standard (thread-local context managers: nothing outside this test sees them)."""
    import jax
    before = context()
    with jax.enable_x64(True):
        x64 = context()
    with jax.enable_x64(False):
        x32 = context()
    with jax.numpy_dtype_promotion("strict"):
        strict = context()
    with jax.numpy_dtype_promotion("standard"):
        standard = context()
    if not (before == context() and hash(before) == hash(context()) and x64 != x32 and strict != standard):
        raise AssertionError(f"trace contexts {before!r}; x64 {x64!r} vs {x32!r}; strict {strict!r} vs {standard!r}")


@functools.cache
def _trace_context():
    return _detect("jax._src.config.trace_context", _load_trace_context, _test_trace_context)


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


def lowering_constants(lowered) -> list | None:
    """The values of the arguments jax 0.11+ adds in front of `lowered`'s ``@main`` for the arrays the function
    closes over (over ``jax_embedded_constants_max_bytes``), which jax.jit's callers pass, or None if this jax
    hides them."""
    try:
        return list(lowered._lowering.const_args)
    except (AttributeError, TypeError):
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
    import jax
    try:
        from jax._src.core import Token
    except ImportError as e:
        raise UnsupportedJaxError(f"ordered effects need jax._src.core.Token ({e})") from None
    if len(bufs) == 1:
        return Token(bufs[0])
    devices = [next(iter(b.sharding.device_set)) for b in bufs]
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, "x"), jax.sharding.PartitionSpec("x"))
    return Token(jax.make_array_from_single_device_arrays((0,), sharding, bufs))
