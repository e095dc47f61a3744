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
The step of a loop started from its init (`Step.loop`'s ``init``) is traced on the init's state, and its
module also holds the init as ``@loopfuse_init`` (`with_init`), which fold-init makes its start.
"""
from dataclasses import replace
from typing import Any, Callable

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .. import _jax_compat
from ..errors import InitFoldError, StateMismatchError
from ..passes.functions import (arg_attrs, main_func, module_functions, result_attrs, retype, set_arg_attrs,
                               set_result_attrs)
from ..passes.vocabulary import INIT, PACKED, RESULT, STATE, STEP_INDEX, STOP, STOPPED, TOKEN_PATH, UNUSED
from ..state.leaves import (aux_kept, check_same_state, dotted, input_spec, is_weak, key_impls, keyed, leaf_name,
                             raw, wrap_keys)
from .mlir_context import copy_module, parse_module
from .traced import Effects, Traced


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


def fn_name(fn: Callable) -> str:
    """The step function's name, as dumps, messages and the dispatcher give it."""
    return getattr(fn, "__name__", "step")


def _constants_embedded(lowered, module: ir.Module) -> None:
    """jax 0.11+ lowers an array the function closes over (over ``jax_embedded_constants_max_bytes``) as a
    leading ``@main`` argument tagged ``jax.const``, which jax.jit's callers pass; loopfuse's programs take the
    state and the batch only. Each becomes a constant of the module again, every one through one optimization
    barrier: XLA folds no op of it at compile time (it computes with it as with jax.jit's argument), and
    loopfuse's passes see a module of the shape they know."""
    main = main_func(module.operation)
    attrs = arg_attrs(main)
    at = [i for i, a in enumerate(attrs) if "jax.const" in a]     # (after the effects' tokens, where it has some)
    if not at:
        return
    values = _jax_compat.lowering_constants(lowered)
    if values is None or len(values) != len(at):
        raise _jax_compat.UnsupportedJaxError(
            f"the step closes over arrays that jax {jax.__version__} passes as arguments, and its lowering no "
            "longer says their values; pass them as part of the batch (or the data) instead")
    entry = main.regions[0].blocks[0]
    args = list(entry.arguments)
    with module.context, main.location, ir.InsertionPoint.at_block_begin(entry):
        constants = [_constant(v, args[i].type) for v, i in zip(values, at)]
        barrier = stablehlo.OptimizationBarrierOp(constants)
    for i, value in zip(at, barrier.results):
        args[i].replace_all_uses_with(value)
    for i in reversed(at):
        entry.erase_argument(i)
    with module.context:
        retype(main)
        set_arg_attrs(main, [a for i, a in enumerate(attrs) if i not in at])


def _constant(value, type_: ir.Type) -> ir.Value:
    """A ``stablehlo.constant`` of `value` (a jax or numpy array; typed PRNG keys as their raw data) of `type_`."""
    if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    x = np.asarray(value)
    if x.dtype.kind not in "biufc":      # bfloat16, float8, ...: their bits, which MLIR reads by the type
        x = x.view(f"u{x.dtype.itemsize}")
    tensor = ir.RankedTensorType(type_)
    attr = ir.DenseElementsAttr.get(np.ascontiguousarray(x).data, type=tensor.element_type, shape=list(tensor.shape))
    return stablehlo.ConstantOp(attr).result


def trace(fn: Callable, state, batch, static: dict, keep_aux, placement=None, stop=None,
          stopped_arg: bool = False, loop: bool = False, packed_paths: list | None = None,
          dataset: bool = False) -> Traced:
    """Trace `fn` on the abstract values of `state` and `batch` (static kwargs passed through).

    With a `sharding.Placement`, arguments and results carry its shardings (SPMD over a mesh).
    With `stop` (from `stopping.flag`), ``stop(new_state, aux, kept aux leaves)`` is one more output;
    with `stopped_arg` too, a scalar bool, the loop's initial stopped flag, is one more (last) argument.
    With `loop` (the step of a device loop), a weakly typed state leaf whose new value is strongly
    typed (optax's L-BFGS state, say, starts with weak scalars) is promoted: the program takes it strongly
    typed, so every call of the loop, the first included, runs one program (`Traced.promoted` lists those
    leaves). The step is traced once, on the state as given; that trace is the promoted program, a leaf
    whose new value depends on a promoted one promoted too, unless it shows that weak types decide a
    dtype, where the step is traced again with the promoted leaves strongly typed (`_carried`).
    `packed_paths` (a `packed.PackedState`'s): per state leaf, the key paths of the leaves it packs, or None.
    `dataset`: `batch` is a `data.Dataset`; the program takes a step index and the step sees ``batch.batch(index)``.
    """
    if placement is not None:
        _check_no_explicit_mesh()
    state_leaves, state_def = jax.tree_util.tree_flatten_with_path(state)
    batch_leaves, batch_def = jax.tree_util.tree_flatten_with_path(batch)
    state_keys, batch_keys = key_impls(x for _, x in state_leaves), key_impls(x for _, x in batch_leaves)
    n_state, n_batch = len(state_leaves), len(batch_leaves)
    out_info = {}

    def flat(*args):
        s = jax.tree_util.tree_unflatten(state_def, wrap_keys(args[:n_state], state_keys))
        b = jax.tree_util.tree_unflatten(batch_def, wrap_keys(args[n_state:n_state + n_batch], batch_keys))
        if dataset:
            b = b.batch(args[n_state + n_batch])
            if placement is not None:
                b = placement.constrain_batch(batch.batch_size, b)
        new_state, aux = _split_output(fn(s, b, **static))
        _check_arrays(fn, new_state, aux)
        check_same_state(state, new_state)
        aux_leaves, aux_def = jax.tree_util.tree_flatten_with_path(aux)
        out_info["aux_def"], out_info["aux_paths"] = aux_def, [dotted(p) for p, _ in aux_leaves]
        out_info["aux_keys"] = key_impls(x for _, x in aux_leaves)
        outs = [raw(x) for x in jax.tree_util.tree_leaves(new_state)], [raw(x) for _, x in aux_leaves]
        out_info["weak"] = [is_weak(x) for x in jax.tree_util.tree_leaves(outs)]  # lowered.out_info drops it
        if stop is None:
            return outs
        returned = {p: x for p, (_, x), k in zip(out_info["aux_paths"], aux_leaves,
                                                 aux_kept(out_info["aux_paths"], keep_aux)) if k}
        out_info["weak"].append(False)
        return *outs, stop(new_state, aux, returned)

    state_specs = [input_spec("state", p, x) for p, x in state_leaves]
    specs = state_specs + [input_spec("batch", p, x) for p, x in batch_leaves]
    if dataset:
        specs.append(jax.ShapeDtypeStruct((), jnp.int32))
    stopped_arg = stopped_arg and stop is not None
    if stopped_arg:         # the loop's initial stopped flag (wrap-loop), unused by the step
        specs.append(jax.ShapeDtypeStruct((), jnp.bool_))
    state_paths = [keyed(p) for p, _ in state_leaves]
    in_sh = None
    shardings: dict[str, Any] = {}
    if placement is not None:
        state_sh = [placement.state(x) for x in state_specs]
        batch_sh = ([placement.replicated] * (len(specs) - n_state) if dataset else
                    [placement.batch(leaf_name("batch", p), x) for (p, _), x in zip(batch_leaves, specs[n_state:])]
                    + [placement.replicated] * stopped_arg)
        in_sh = state_sh + batch_sh
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh) for x, sh in zip(specs, in_sh)]
        out_sh = (state_sh, placement.replicated) + ((placement.replicated,) if stop is not None else ())
        shardings = {"in_shardings": tuple(in_sh), "out_shardings": out_sh}
    jitted = jax.jit(flat, keep_unused=True, **shardings)
    traced = jitted.trace(*specs)
    _check_no_refs(fn, traced)
    if placement is None:
        _check_one_device(fn, traced.jaxpr)
    promoted = tuple(i for i in range(n_state) if loop and specs[i].weak_type and not out_info["weak"][i])
    carried = _carried(traced.jaxpr, promoted, [x.weak_type for x in specs[:n_state]], out_info["weak"]) \
        if promoted else ()
    if carried is None:
        try:    # trace it again with the promoted leaves strongly typed
            traced = jitted.trace(*[jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if i in promoted
                                    else x for i, x in enumerate(specs)])
        except StateMismatchError:   # strongly typed, the step changes a leaf's dtype (lax.scan refuses it)
            promoted = ()
    else:                            # the trace serves as the promoted program
        promoted = carried
        for i in carried:
            out_info["weak"][i] = False
    # keep_unused=True keeps every argument in place but also skips the dead-code elimination that jax.jit
    # does by default; lower the pruned jaxpr, as jax.jit does, or XLA may compile a loop of the step to
    # other last bits than jax.jit's (a diffrax L-BFGS fit with jaxlib 0.12)
    lowered = _jax_compat.lower_pruned(traced)
    kept = aux_kept(out_info["aux_paths"], keep_aux)
    out_specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=weak)
                 for x, weak in zip(jax.tree_util.tree_leaves(lowered.out_info), out_info["weak"])]
    lowered_module = lowered.compiler_ir("stablehlo")
    assert lowered_module is not None  # None only for a dialect jax cannot lower to
    _constants_embedded(lowered, lowered_module)
    effects = _effects(lowered, lowered_module)
    module = _tag(lowered_module, state_paths, kept, dataset, len(effects.ordered), stop is not None, stopped_arg,
                  packed_paths)
    return Traced(module, state_paths, state_def, state_keys, out_info["aux_def"],
                  out_info["aux_paths"], out_info["aux_keys"], kept, dataset, in_sh, out_specs, effects,
                  stop is not None, promoted, stopped_arg)


def _check_no_explicit_mesh() -> None:
    """A ValueError where a program over `devices=` is traced inside ``jax.set_mesh`` of a mesh with Explicit axes:
    loopfuse lays the state and the batch out over a mesh of its own (Auto axes), which jax refuses to mix
    with the one in effect (a ValueError about mismatched meshes, from inside the trace)."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and jax.sharding.AxisType.Explicit in tuple(mesh.axis_types):
        raise ValueError(f"compile_step(devices=...) lays the state and the batch out over a mesh of its own, which "
                         f"jax cannot mix with the mesh with Explicit axes in effect ({mesh}): call the step outside "
                         "jax.set_mesh, or under a mesh with Auto axes")


def _check_one_device(fn: Callable, jaxpr) -> None:
    """A ValueError where a step traced for one device names a sharding or a mesh over several (a
    ``with_sharding_constraint``, a ``shard_map``): jax.jit runs such a step over those devices, a program
    for one device drops the constraint (other last bits than jax.jit's, silently); ``devices=`` runs it so."""
    found = _multi_device(getattr(jaxpr, "jaxpr", jaxpr))
    if found is not None:
        primitive, n = found
        raise ValueError(f"{fn_name(fn)} lays values out over {n} devices ({primitive}), which jax.jit would run it "
                         "over; compile_step without devices= runs it on one device and would drop that layout: pass "
                         "the devices, compile_step(..., devices=mesh.devices.flat), to run it over them")


def _multi_device(jaxpr) -> tuple[str, int] | None:
    """(the primitive, the device count) of the first equation of `jaxpr`, or of one it calls, whose parameters
    name a sharding or a mesh over more than one device; None where none does."""
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            n = _device_count(value)
            if n > 1:
                return eqn.primitive.name, n
        for inner in jax.extend.core.jaxprs_in_params(eqn.params):
            found = _multi_device(inner)
            if found is not None:
                return found
    return None


def _device_count(value) -> int:
    """The devices a sharding or a concrete mesh names (one for anything else: an abstract mesh names none)."""
    if isinstance(value, jax.sharding.NamedSharding):
        value = value.mesh
    if isinstance(value, jax.sharding.Mesh):
        return value.devices.size
    return len(value.device_set) if isinstance(value, jax.sharding.Sharding) else 1


def _check_no_refs(fn: Callable, traced) -> None:
    """A TypeError where the step closes over a mutable array (``jax.new_ref``): jax.jit's callers pass it and
    get it back written; a loopfuse program's state is what the step takes and returns (its constants would
    lose the writes)."""
    ref = getattr(jax, "Ref", None)
    if ref is not None and any(isinstance(c, ref) for c in traced.jaxpr.consts):
        raise TypeError(f"{fn_name(fn)} closes over a mutable array (jax.new_ref): loopfuse "
                        "carries state as what the step takes and returns; pass its value in the state instead")


def _check_arrays(fn: Callable, new_state, aux) -> None:
    """A TypeError naming the first leaf of the step's outputs that is no array (nor a Python or numpy number),
    by its path, where jax.jit's would name an output position of loopfuse's own traced function."""
    for what, tree in (("state", new_state), ("aux", aux)):
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
                raise TypeError(f"{fn_name(fn)} returned a {type(x).__name__} as "
                                f"{leaf_name('new ' + what if what == 'state' else what, path)}: every leaf of "
                                "(new_state, aux) must be an array or a number")


def with_init(traced: Traced, init: Callable, x, batch) -> Traced:
    """`traced`, the step of a loop, with its initial state ``init(x, batch)`` as ``@loopfuse_init`` in its
    module (public until fold-init makes it the program's start, so that no pass drops it as unused): a
    function of the flat `x` then batch leaves (each kept, used or not) returning the flat state leaves, its
    functions renamed ``loopfuse_init.<name>`` apart from the step's, their locations kept. The step was traced
    on init's state (`compiler.trace`: its abstract value), so the results line up. An InitFoldError where the
    step or the init has what a folded program cannot hold: ordered effects (the step's tokens are state the init
    does not make), or an init with effects or module-level ops of its own (a host callback and its mesh)."""
    if traced.effects.ordered:
        raise InitFoldError("a loop with ordered effects (jax.debug.print(..., ordered=True), an ordered "
                            "io_callback) cannot start from its init: its effect tokens are state the init does "
                            "not make")
    x_leaves, x_def = jax.tree_util.tree_flatten_with_path(x)
    batch_leaves, batch_def = jax.tree_util.tree_flatten_with_path(batch)
    x_keys, batch_keys = key_impls(v for _, v in x_leaves), key_impls(v for _, v in batch_leaves)

    def flat(*args):
        state = init(jax.tree_util.tree_unflatten(x_def, wrap_keys(args[:len(x_leaves)], x_keys)),
                     jax.tree_util.tree_unflatten(batch_def, wrap_keys(args[len(x_leaves):], batch_keys)))
        return [raw(v) for v in jax.tree_util.tree_leaves(state)]
    specs = [input_spec("init's x", p, v) for p, v in x_leaves] + [input_spec("batch", p, v) for p, v in batch_leaves]
    lowered = _jax_compat.lower_pruned(jax.jit(flat, keep_unused=True).trace(*specs))
    init_module = lowered.compiler_ir("stablehlo")
    assert init_module is not None
    _constants_embedded(lowered, init_module)
    own_ops = len(list(init_module.body.operations))
    if _effects(lowered, init_module).any or len(list(module_functions(init_module.operation))) < own_ops:
        raise InitFoldError("an init with effects (a host callback, jax.debug.print) cannot run inside the loop's "
                            "program: compute the initial state apart and pass it as the state")
    module = copy_module(traced.module)
    own = parse_module(init_module.operation.get_asm(enable_debug_info=True), module.context)
    with module.context:
        functions = list(module_functions(own.operation))
        for f in functions:
            old = f.sym_name.value
            new = INIT if old == "main" else f"{INIT}.{old}"
            ir.SymbolTable.replace_all_symbol_uses(old, new, own.operation)
            f.attributes["sym_name"] = ir.StringAttr.get(new)
        for f in functions:
            module.body.append(f.operation)
    return replace(traced, module=module, promoted=())


def _carried(jaxpr, promoted: tuple, weak_in: list, weak_out: list) -> tuple | None:
    """The state leaves a loop carries strongly typed, from `jaxpr`, the step traced with the leaves given
    weakly typed (`weak_in`, per state leaf; `weak_out`, per output) whose new values are strong
    (`promoted`), or None when only tracing it again with those strongly typed can tell.

    Weak types decide dtypes through jax's type promotion, which converts its operands to the promoted
    dtype: where it converted a weakly typed value to another dtype, a strongly typed one may have gone
    the other way (weak float32 with bfloat16 is bfloat16, strong float32 with it float32). Where it
    never did (weak and strong float32 alike; an integer to float32), tracing any weak input strongly
    typed computes the same values, but for conversions between weak and strong float32, which change no
    value, and only outputs that depend on such an input may lose their weak type. So the trace serves
    as the promoted program, those outputs strongly typed: a weak state leaf whose new value depends on
    a promoted one is promoted too (carried strongly typed, Adam's first moment of weak params); a weakly
    typed aux leaf that does leaves the answer to a second trace (None). A step that reads a weak type
    itself (``jnp.result_type(leaf, x)`` as the dtype of another value) is beyond what the trace shows.
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)   # a ClosedJaxpr (jax 0.10) or a Jaxpr holding its constants
    if _converts_weak(inner):
        return None
    carried = set(promoted)
    while True:
        tainted = set(inner.invars[i] for i in carried)
        for eqn in inner.eqns:
            if any(v in tainted for v in eqn.invars if not isinstance(v, jax.extend.core.Literal)):
                tainted.update(eqn.outvars)
        losing = {j for j, v in enumerate(inner.outvars)
                  if weak_out[j] and not isinstance(v, jax.extend.core.Literal) and v in tainted}
        more = {j for j in losing if j < len(weak_in) and weak_in[j]} - carried
        if not more:
            return None if losing - carried else tuple(sorted(carried))
        carried |= more


def _converts_weak(jaxpr) -> bool:
    """Whether `jaxpr` or one it calls converts a weakly typed value to another dtype."""
    for eqn in jaxpr.eqns:
        x = eqn.invars[0] if eqn.primitive.name == "convert_element_type" else None
        if (x is not None and not isinstance(x, jax.extend.core.Literal) and x.aval.weak_type
                and eqn.params["new_dtype"] != x.aval.dtype):
            return True
        if any(_converts_weak(j) for j in jax.extend.core.jaxprs_in_params(eqn.params)):
            return True
    return False


def _split_output(out):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise StateMismatchError(
            f"the step function must return (new_state, aux); it returned {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
    return out


def _tag(lowered: ir.Module, state_paths, kept, has_step: bool, n_tokens: int, stops: bool,
         stopped_arg: bool, packed_paths: list | None = None) -> ir.Module:
    """A tagged copy of jax's lowered module, in jax's context (jax's own module is left untouched)."""
    with lowered.context:
        module = copy_module(lowered)
        f = main_func(module.operation)
        args = arg_attrs(f)
        tokens = [TOKEN_PATH.format(t) for t in range(n_tokens)]
        for i, path in enumerate(tokens + state_paths):
            args[i][STATE] = ir.StringAttr.get(path)
        for i, held in enumerate(packed_paths or ()):
            if held:
                args[n_tokens + i][PACKED] = ir.ArrayAttr.get([ir.StringAttr.get(p) for p in held])
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
            elif not kept[j - len(state_paths)]:
                attrs[UNUSED] = ir.UnitAttr.get()
        set_result_attrs(f, results)
    return module

