"""Trace ``fn(state, batch) -> (new_state, aux)`` to StableHLO tagged for loopfuse's passes.

The traced ``@main`` takes the flat state leaves, then the flat batch leaves, then (for a
`Dataset` batch) an int32 step index, and returns the flat new-state leaves then the flat aux
leaves. Tags: state arguments and results carry ``loopfuse.state = "<leaf path>"``, every
result carries ``loopfuse.result = <flat output index>``, aux results the caller did not keep
carry ``loopfuse.unused``, and the step index carries ``loopfuse.step_index``.
"""
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from .data import Dataset
from .errors import StateMismatchError
from .passes._func import STATE, STEP_INDEX, UNUSED, arg_attrs, main_func, result_attrs, set_arg_attrs, set_result_attrs

RESULT = "loopfuse.result"


def leaf_spec(x) -> jax.ShapeDtypeStruct:
    """The abstract value of one leaf (typed PRNG keys travel as their raw uint32 data)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.ShapeDtypeStruct(jax.random.key_data(x).shape, jnp.uint32)
    return jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(x.dtype))


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


def _keep(path: str, keep_aux) -> bool:
    return keep_aux is None or any(path == k or path.startswith(k + ".") or path.startswith(k + "[")
                                   for k in keep_aux)


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
class Traced:
    """A traced step: its tagged module and what is needed to map flat values back to pytrees."""

    module: ir.Module
    state_paths: list
    state_def: Any
    key_leaves: list          # per state leaf: the typed-key template, or None
    aux_def: Any
    aux_paths: list
    aux_kept: list
    has_step_index: bool
    arg_shardings: list | None     # per argument, under a Placement (None: one device)
    out_dtypes: list               # per flat output (typed keys as their raw uint32 data)


def trace(fn: Callable, state, batch, static: dict, keep_aux, placement=None) -> Traced:
    """Trace `fn` on the abstract values of `state` and `batch` (static kwargs passed through).

    With a `sharding.Placement`, arguments and results carry its shardings (SPMD over a mesh).
    """
    state_leaves, state_def = jax.tree_util.tree_flatten_with_path(state)
    batch_leaves, batch_def = jax.tree_util.tree_flatten_with_path(batch)
    state_values, batch_values = [x for _, x in state_leaves], [x for _, x in batch_leaves]
    key_leaves = [x if is_key(x) else None for x in state_values]
    has_step = isinstance(batch, Dataset)
    n_state, n_batch = len(state_leaves), len(batch_leaves)
    out_info = {}

    def flat(*args):
        s = jax.tree_util.tree_unflatten(state_def, wrap_keys(args[:n_state], state_values))
        b = jax.tree_util.tree_unflatten(batch_def, wrap_keys(args[n_state:n_state + n_batch], batch_values))
        if has_step:
            b = b.batch(args[-1])
            if placement is not None:
                b = placement.constrain_batch(batch.batch_size, b)
        new_state, aux = _split_output(fn(s, b, **static))
        _check_same_state(state, new_state)
        aux_leaves, aux_def = jax.tree_util.tree_flatten_with_path(aux)
        out_info["aux_def"], out_info["aux_paths"] = aux_def, [dotted(p) for p, _ in aux_leaves]
        return _raw(jax.tree_util.tree_leaves(new_state)), _raw(x for _, x in aux_leaves)

    state_specs = [_input_spec("state", p, x) for p, x in state_leaves]
    specs = state_specs + [_input_spec("batch", p, x) for p, x in batch_leaves]
    if has_step:
        specs.append(jax.ShapeDtypeStruct((), jnp.int32))
    state_paths = [jax.tree_util.keystr(p) for p, _ in state_leaves]
    in_sh = None
    if placement is None:
        jitted = jax.jit(flat, keep_unused=True)
    else:
        state_sh = [placement.state(x) for x in state_specs]
        batch_sh = ([placement.replicated] * (len(specs) - n_state) if has_step else
                    [placement.batch(jax.tree_util.keystr(p), x) for (p, _), x in zip(batch_leaves, specs[n_state:])])
        in_sh = state_sh + batch_sh
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh) for x, sh in zip(specs, in_sh)]
        jitted = jax.jit(flat, keep_unused=True, in_shardings=tuple(in_sh),
                         out_shardings=(state_sh, placement.replicated))
    lowered = jitted.lower(*specs)
    out_dtypes = [x.dtype for x in jax.tree_util.tree_leaves(lowered.out_info)]
    aux_kept = [_keep(p, keep_aux) for p in out_info["aux_paths"]]
    module = _tag(lowered.compiler_ir("stablehlo"), state_paths, aux_kept, has_step)
    return Traced(module, state_paths, state_def, key_leaves, out_info["aux_def"], out_info["aux_paths"],
                  aux_kept, has_step, in_sh, out_dtypes)


def _raw(leaves) -> list:
    return [jax.random.key_data(x) if is_key(x) else x for x in leaves]


def is_key(x) -> bool:
    """Whether `x` is a typed PRNG key array (it crosses the executable boundary as raw data)."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def wrap_keys(raw, templates) -> list:
    """Raw uint32 key data back to typed keys where the template leaf is a typed key."""
    return [jax.random.wrap_key_data(a, impl=jax.random.key_impl(t)) if is_key(t) else a
            for a, t in zip(raw, templates)]


def _split_output(out):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise StateMismatchError(
            f"the step function must return (new_state, aux); it returned {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
    return out


def _check_same_state(state, new_state) -> None:
    """new_state must have state's tree structure, shapes and dtypes; name the first leaf that differs."""
    old, old_def = jax.tree_util.tree_flatten_with_path(state)
    new, new_def = jax.tree_util.tree_flatten_with_path(new_state)
    if old_def != new_def:
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


def _tag(lowered: ir.Module, state_paths, aux_kept, has_step: bool) -> ir.Module:
    """A tagged copy of jax's lowered module, in jax's context (jax's own module is left untouched)."""
    with lowered.context:
        module = _copy(lowered)
        f = main_func(module.operation)
        args = arg_attrs(f)
        for i, path in enumerate(state_paths):
            args[i][STATE] = ir.StringAttr.get(path)
        if has_step:
            args[-1][STEP_INDEX] = ir.UnitAttr.get()
        set_arg_attrs(f, args)
        results = result_attrs(f)
        i32 = ir.IntegerType.get_signless(32)
        for j, attrs in enumerate(results):
            attrs[RESULT] = ir.IntegerAttr.get(i32, j)
            if j < len(state_paths):
                attrs[STATE] = ir.StringAttr.get(state_paths[j])
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
