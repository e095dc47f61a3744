"""Trace ``fn(state, batch) -> (new_state, aux)`` to StableHLO tagged for loopfuse's passes.

The traced ``@main`` takes the flat state leaves, then the flat batch leaves, then (for a
`Dataset` batch) an int32 step index, then (for a loop that can stop early, traced so) a bool, its
initial stopped flag, and returns the flat new-state leaves then the flat aux leaves (then the stop flag).
Tags: state arguments and results carry ``loopfuse.state = "<leaf path>"``, every result carries
``loopfuse.result = <flat output index>``, aux results the caller did not keep carry
``loopfuse.unused``, the step index carries ``loopfuse.step_index``, the stop flag
``loopfuse.stop`` and the initial stopped flag ``loopfuse.stopped``.

A step with ordered effects (``jax.debug.print(..., ordered=True)``, ordered ``io_callback``)
follows jax's calling convention: one ``!stablehlo.token`` argument and result per effect come
first; they are tagged as state (``loopfuse.state = "<effect token N>"``, no
``loopfuse.result``) so a loop carries the token from one iteration to the next. The host
callbacks the module calls travel with the trace: the executable must be compiled with them.
A step traced with a stop function (see `stopping`) returns its flag last, tagged ``loopfuse.stop``.
"""
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from . import _jax_compat
from .data import Dataset
from .errors import AuxPathError, StateMismatchError
from .passes.functions import arg_attrs, main_func, result_attrs, set_arg_attrs, set_result_attrs
from .passes.vocabulary import RESULT, STATE, STEP_INDEX, STOP, STOPPED, TOKEN_PATH, UNUSED


def is_weak(x) -> bool:
    """Whether jax.jit traces `x` as a weakly typed value (Python scalars, `jnp.asarray(0.1)`)."""
    aval = getattr(x, "aval", None)
    return aval.weak_type if aval is not None else type(x) in (int, float, complex)


def leaf_spec(x) -> jax.ShapeDtypeStruct:
    """The abstract value of one leaf, weak type included (typed PRNG keys travel as their raw uint32 data)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    weak = is_weak(x)
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.ShapeDtypeStruct(jax.random.key_data(x).shape, jnp.uint32)
    return jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(x.dtype), weak_type=weak)


def _input_spec(what: str, path, x) -> jax.ShapeDtypeStruct:
    """leaf_spec of an input leaf, or a StateMismatchError naming the leaf that is no array."""
    try:
        spec = leaf_spec(x)
        ok = jnp.issubdtype(spec.dtype, jnp.number) or jnp.issubdtype(spec.dtype, jnp.bool_)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise StateMismatchError(f"{what} leaf {jax.tree_util.keystr(path)} is {type(x).__name__} "
                                 f"{x!r:.60}, not a numeric array or scalar")
    return spec


def _under(path: str, k: str) -> bool:
    return path == k or path.startswith(k + ".") or path.startswith(k + "[")


def aux_kept(aux_paths: list, keep_aux) -> list:
    """Per aux leaf: whether `keep_aux` asks for it; an entry naming no aux leaf is an AuxPathError."""
    if keep_aux is None:
        return [True] * len(aux_paths)
    unknown = [k for k in keep_aux if not any(_under(p, k) for p in aux_paths)]
    if unknown:
        raise AuxPathError(f"keep_aux names {', '.join(map(repr, unknown))}, which is no aux leaf or subtree; "
                           f"the step's aux leaves are {aux_paths}")
    return [any(_under(p, k) for k in keep_aux) for p in aux_paths]


def dotted(path) -> str:
    """A key path as `a.b[0]` (the form `keep_aux` entries use)."""
    out = ""
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out += ("." if out else "") + str(k.key)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out += ("." if out else "") + k.name
        else:
            out += f"[{getattr(k, 'idx', k)}]"
    return out


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


def _effects(lowered, module: ir.Module) -> Effects:
    """The host callbacks and effects jax's own compile of `lowered` would use."""
    args = _jax_compat.lowering_effects(lowered)
    if args is None:
        text = str(module)
        if "callback" in text or "!stablehlo.token" in text:
            raise _jax_compat.UnsupportedJaxError(
                f"the step calls host callbacks or has ordered effects, which loopfuse cannot compile with "
                f"jax {jax.__version__} (its lowering no longer exposes them)")
        return Effects([], None, [], [])
    return Effects(list(args["host_callbacks"]), args["keepalive"], list(args["ordered_effects"]),
                   list(args["unordered_effects"]))


@dataclass
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
    promoted: tuple = ()           # state leaves given weakly typed, traced strongly typed (a loop's carry)
    stopped_arg: bool = False      # a last argument: the loop's initial stopped flag


def trace(fn: Callable, state, batch, static: dict, keep_aux, placement=None, stop=None,
          stopped_arg: bool = False, loop: bool = False) -> Traced:
    """Trace `fn` on the abstract values of `state` and `batch` (static kwargs passed through).

    With a `sharding.Placement`, arguments and results carry its shardings (SPMD over a mesh).
    With `stop` (from `stopping.flag`), ``stop(new_state, aux, kept aux leaves)`` is one more output;
    with `stopped_arg` too, a scalar bool, the loop's initial stopped flag, is one more (last) argument.
    With `loop` (the step of a device loop), a weakly typed state leaf whose new value is strongly
    typed is traced strongly typed, as `lax.scan` and `lax.while_loop` promote their carry (optax's
    L-BFGS state, say, starts with weak scalars): every call of the loop, the first included, then
    runs one program (`Traced.promoted` lists those leaves).
    """
    state_leaves, state_def = jax.tree_util.tree_flatten_with_path(state)
    batch_leaves, batch_def = jax.tree_util.tree_flatten_with_path(batch)
    state_keys, batch_keys = key_impls(x for _, x in state_leaves), key_impls(x for _, x in batch_leaves)
    has_step = isinstance(batch, Dataset)
    n_state, n_batch = len(state_leaves), len(batch_leaves)
    out_info = {}

    def flat(*args):
        s = jax.tree_util.tree_unflatten(state_def, wrap_keys(args[:n_state], state_keys))
        b = jax.tree_util.tree_unflatten(batch_def, wrap_keys(args[n_state:n_state + n_batch], batch_keys))
        if has_step:
            b = b.batch(args[n_state + n_batch])
            if placement is not None:
                b = placement.constrain_batch(batch.batch_size, b)
        new_state, aux = _split_output(fn(s, b, **static))
        check_same_state(state, new_state)
        aux_leaves, aux_def = jax.tree_util.tree_flatten_with_path(aux)
        out_info["aux_def"], out_info["aux_paths"] = aux_def, [dotted(p) for p, _ in aux_leaves]
        out_info["aux_keys"] = key_impls(x for _, x in aux_leaves)
        outs = _raw(jax.tree_util.tree_leaves(new_state)), _raw(x for _, x in aux_leaves)
        out_info["weak"] = [is_weak(x) for x in jax.tree_util.tree_leaves(outs)]  # lowered.out_info drops it
        if stop is None:
            return outs
        returned = {p: x for p, (_, x), k in zip(out_info["aux_paths"], aux_leaves,
                                                 aux_kept(out_info["aux_paths"], keep_aux)) if k}
        out_info["weak"].append(False)
        return *outs, stop(new_state, aux, returned)

    state_specs = [_input_spec("state", p, x) for p, x in state_leaves]
    specs = state_specs + [_input_spec("batch", p, x) for p, x in batch_leaves]
    if has_step:
        specs.append(jax.ShapeDtypeStruct((), jnp.int32))
    stopped_arg = stopped_arg and stop is not None
    if stopped_arg:         # the loop's initial stopped flag (wrap-loop), unused by the step
        specs.append(jax.ShapeDtypeStruct((), jnp.bool_))
    state_paths = [jax.tree_util.keystr(p) for p, _ in state_leaves]
    in_sh = None
    shardings: dict[str, Any] = {}
    if placement is not None:
        state_sh = [placement.state(x) for x in state_specs]
        batch_sh = ([placement.replicated] * (len(specs) - n_state) if has_step else
                    [placement.batch(jax.tree_util.keystr(p), x) for (p, _), x in zip(batch_leaves, specs[n_state:])]
                    + [placement.replicated] * stopped_arg)
        in_sh = state_sh + batch_sh
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh) for x, sh in zip(specs, in_sh)]
        out_sh = (state_sh, placement.replicated) + ((placement.replicated,) if stop is not None else ())
        shardings = {"in_shardings": tuple(in_sh), "out_shardings": out_sh}
    jitted = jax.jit(flat, keep_unused=True, **shardings)

    def lower(specs):
        # keep_unused=True keeps every argument in place but also skips the dead-code elimination that
        # jax.jit does by default; lower the pruned jaxpr, as jax.jit does, or XLA may compile a loop of
        # the step to other last bits than jax.jit's (a diffrax L-BFGS fit with jaxlib 0.12)
        return _jax_compat.lower_pruned(jitted.trace(*specs))

    lowered = lower(specs)
    promoted = tuple(i for i in range(n_state) if loop and specs[i].weak_type and not out_info["weak"][i])
    if promoted:
        try:
            lowered = lower([jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if i in promoted else x
                             for i, x in enumerate(specs)])
        except StateMismatchError:   # strongly typed, the step changes a leaf's dtype (lax.scan refuses it)
            promoted = ()
            lowered = lower(specs)
    kept = aux_kept(out_info["aux_paths"], keep_aux)
    out_specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=weak)
                 for x, weak in zip(jax.tree_util.tree_leaves(lowered.out_info), out_info["weak"])]
    lowered_module = lowered.compiler_ir("stablehlo")
    assert lowered_module is not None  # None only for a dialect jax cannot lower to
    effects = _effects(lowered, lowered_module)
    module = _tag(lowered_module, state_paths, kept, has_step, len(effects.ordered), stop is not None, stopped_arg)
    return Traced(module, state_paths, state_def, state_keys, out_info["aux_def"],
                  out_info["aux_paths"], out_info["aux_keys"], kept, has_step, in_sh, out_specs, effects,
                  stop is not None, promoted, stopped_arg)


def _raw(leaves) -> list:
    return [jax.random.key_data(x) if is_key(x) else x for x in leaves]


def is_key(x) -> bool:
    """Whether `x` is a typed PRNG key array (it crosses the executable boundary as raw data)."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def key_impls(leaves) -> list:
    """Per leaf: its PRNG key implementation if it is a typed key, else None."""
    return [jax.random.key_impl(x) if is_key(x) else None for x in leaves]


def wrap_keys(raw, impls) -> list:
    """Raw uint32 key data back to typed keys where `impls` (see `key_impls`) names an implementation
    (None, an aux leaf the caller did not keep, stays None)."""
    return [a if impl is None or a is None else jax.random.wrap_key_data(a, impl=impl) for a, impl in zip(raw, impls)]


def _split_output(out):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise StateMismatchError(
            f"the step function must return (new_state, aux); it returned {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
    return out


def check_same_state(state, new_state) -> None:
    """new_state must have state's tree structure, shapes and dtypes; name the first leaf that differs."""
    old, old_def = jax.tree_util.tree_flatten_with_path(state)
    new, new_def = jax.tree_util.tree_flatten_with_path(new_state)
    if old_def != new_def:  # type: ignore[operator]  # jax's PyTreeDef names an unstubbed jaxlib class
        old_paths = {jax.tree_util.keystr(p) for p, _ in old}
        new_paths = {jax.tree_util.keystr(p) for p, _ in new}
        missing, extra = sorted(old_paths - new_paths), sorted(new_paths - old_paths)
        raise StateMismatchError(
            "the new state's pytree structure differs from the input state's: "
            + (f"missing leaves {missing} " if missing else "") + (f"extra leaves {extra} " if extra else "")
            + f"(input {old_def}, output {new_def})")
    for (path, a), (_, b) in zip(old, new):
        sa, sb = leaf_spec(a), leaf_spec(b)
        if sa.shape != sb.shape or sa.dtype != sb.dtype:
            raise StateMismatchError(
                f"state leaf {jax.tree_util.keystr(path) or '(the whole state)'} enters the step as {sa.dtype}{list(sa.shape)} "
                f"but leaves it as {sb.dtype}{list(sb.shape)}; an update must keep each leaf's shape and dtype")


def _tag(lowered: ir.Module, state_paths, aux_kept, has_step: bool, n_tokens: int, stops: bool,
         stopped_arg: bool) -> ir.Module:
    """A tagged copy of jax's lowered module, in jax's context (jax's own module is left untouched)."""
    with lowered.context:
        module = _copy(lowered)
        f = main_func(module.operation)
        args = arg_attrs(f)
        tokens = [TOKEN_PATH.format(t) for t in range(n_tokens)]
        for i, path in enumerate(tokens + state_paths):
            args[i][STATE] = ir.StringAttr.get(path)
        if has_step:
            args[len(args) - 1 - stopped_arg][STEP_INDEX] = ir.UnitAttr.get()
        if stopped_arg:
            args[-1][STOPPED] = ir.UnitAttr.get()
        set_arg_attrs(f, args)
        results = result_attrs(f)
        i32 = ir.IntegerType.get_signless(32)
        for t, attrs in enumerate(results[:n_tokens]):
            attrs[STATE] = ir.StringAttr.get(tokens[t])
        for j, attrs in enumerate(results[n_tokens:]):
            attrs[RESULT] = ir.IntegerAttr.get(i32, j)
            if j < len(state_paths):
                attrs[STATE] = ir.StringAttr.get(state_paths[j])
            elif stops and j == len(results) - n_tokens - 1:
                attrs[STOP] = ir.UnitAttr.get()
            elif not aux_kept[j - len(state_paths)]:
                attrs[UNUSED] = ir.UnitAttr.get()
        set_result_attrs(f, results)
    return module


def _copy(module: ir.Module) -> ir.Module:
    """A deep copy of `module` in its own context (cloning in memory: no print and re-parse)."""
    copy = ir.Module.create(module.operation.location)
    attrs = module.operation.attributes
    for name in attrs:
        copy.operation.attributes[name] = attrs[name]
    for op in module.body.operations:
        copy.body.append(op.clone(ip=False))
    return copy
