"""State leaves that are not arrays (an equinox model's activation function, a name): held as part of the
state's structure, as `equinox.filter_jit` holds them, not traced.

An equinox user's state is the model itself, ``(model, opt_state)``, and `eqx.nn.MLP` keeps its activation
function as a leaf. jax.jit refuses such a leaf; loopfuse `wrap`s it in a `Static` node, a pytree node with no
children whose auxiliary data is the object. The wrapped state's leaves are its arrays, its tree structure holds
the rest, so every part of loopfuse that reads leaves (signatures, donation, packing, checkpoints, ensembles)
sees arrays only, and a program is compiled per static object, as jax.jit compiles per static argument. The
step itself sees the state as the user holds it (`unwrap`), and the objects it returns must be the ones it was
given (the same tree structure).

A Python number stays a leaf, traced as jax.jit traces it (weakly typed), except inside an equinox Module, whose
every leaf that is not an array is held, as `eqx.filter_jit` holds it (`eqx.nn.Dropout`'s ``inference`` flag,
its rate): what an equinox user compares with.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> state = {"w": jnp.ones(2), "act": jnp.tanh, "name": "mlp", "lr": 0.1}
    >>> wrapped = wrap(state)
    >>> [type(x).__name__ for x in jax.tree_util.tree_leaves(wrapped)]      # arrays and numbers only
    ['float', 'ArrayImpl']
    >>> unwrap(wrapped)["act"] is jnp.tanh, present(state), present(wrapped)
    (True, True, False)
"""
import functools
import sys
from typing import Any, Callable

import jax
import numpy as np

from ..errors import StateMismatchError
from .leaves import keyed


class Static:
    """A pytree node with no children holding one non-array leaf, `value`, as its auxiliary data (compared by
    ``==``, hashed by ``hash``, as jax compares tree structures)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Static({self.value!r:.60})"


jax.tree_util.register_pytree_node(Static, lambda s: ((), s.value), lambda value, _: Static(value))


_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)     # (a ShapeDtypeStruct stands for one)
_ARRAY, _NUMBER, _OTHER = 0, 1, 2
_KINDS: dict[type, int] = {bool: _NUMBER, int: _NUMBER, float: _NUMBER, complex: _NUMBER}


def _kind(x) -> int:
    """_ARRAY, _NUMBER (a Python number) or _OTHER, for the leaf `x`, kept per type (an `isinstance` of jax.Array,
    which a tracer passes by its instance check, costs more than a lookup, on every leaf of every call)."""
    found = _KINDS.get(type(x))
    if found is None:
        found = _KINDS[type(x)] = _ARRAY if isinstance(x, _ARRAYS) else _OTHER
    return found


def held_leaves(tree) -> tuple[list, list]:
    """(the leaves of `tree`, per leaf whether it is held as structure): one that is not an array, a numpy scalar or
    a Python number; inside an equinox Module, one that is not an array or a numpy scalar (`eqx.is_array`)."""
    leaves = jax.tree_util.tree_leaves(tree)
    kinds = [_kind(x) for x in leaves]
    eqx = sys.modules.get("equinox")      # (no Module without it)
    if eqx is None or _NUMBER not in kinds:   # (what the Modules decide: their numbers)
        return leaves, [k == _OTHER for k in kinds]
    held = []
    for piece in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, eqx.Module)):
        inner = [_kind(x) for x in jax.tree_util.tree_leaves(piece)] if isinstance(piece, eqx.Module) else None
        held += [k != _ARRAY for k in inner] if inner is not None else [_kind(piece) == _OTHER]
    return leaves, held


def present(tree) -> bool:
    """Whether `tree` has a leaf to `wrap`."""
    return any(held_leaves(tree)[1])


def wrap(tree, what: str = "state"):
    """`tree` with each leaf that is not an array (`held_leaves`) in a `Static` node (`tree` itself where it has
    none); a StateMismatchError naming a leaf that cannot be (not hashable: jax hashes tree structures)."""
    leaves, held = held_leaves(tree)
    if not any(held):
        return tree
    for i, x in enumerate(leaves):
        if held[i] and getattr(type(x), "__hash__", None) is None:
            path = jax.tree_util.tree_flatten_with_path(tree)[0][i][0]
            raise StateMismatchError(
                f"{what} leaf {keyed(path)} is a {type(x).__name__}, neither an array nor hashable: loopfuse holds a "
                "leaf that is not an array as part of the state's structure (as equinox.filter_jit does), which "
                "must be hashable")
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree),
                                        [Static(x) if h else x for x, h in zip(leaves, held)])


def unwrap(tree):
    """`tree` with each `Static` node replaced by the object it holds (`tree` itself where it has none)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, Static))
    if not any(isinstance(x, Static) for x in leaves):
        return tree
    return jax.tree_util.tree_unflatten(treedef, [x.value if isinstance(x, Static) else x for x in leaves])


def held(fn: Callable) -> Callable:
    """``fn(state, batch, **static)`` as the step of the wrapped state: `fn` sees the state unwrapped and, where it
    held some leaves, its new state is wrapped (a step that does not return ``(new_state, aux)``, or returns a leaf
    that is no array where it was given one, is left to tracing to name)."""
    if getattr(fn, "_loopfuse_held", False):
        return fn

    @functools.wraps(fn)
    def step(state, batch, **static):
        given = unwrap(state)
        out = fn(given, batch, **static)
        if not isinstance(out, tuple) or len(out) != 2 or given is state:
            return out
        new_state = wrap(out[0], "new state")
        _check_same_held(state, new_state)
        return new_state, out[1]
    step._loopfuse_held = True      # type: ignore[attr-defined]
    return step


def _check_same_held(state, new_state) -> None:
    """A StateMismatchError naming the first held leaf the step returned other than it was given (where the paths
    match: a structure that differs otherwise is named by the state's own check)."""
    def held(tree):
        return {keyed(p): x.value for p, x in jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: isinstance(x, Static))[0] if isinstance(x, Static)}
    given, returned = held(state), held(new_state)
    for path, value in given.items():
        if path in returned and not (returned[path] is value or returned[path] == value):
            raise StateMismatchError(
                f"new state leaf {path} is {returned[path]!r:.60} where the step was given {value!r:.60}: a leaf that "
                "is not an array is held as the state's structure (as equinox.filter_jit holds it), and a step must "
                "return it as given")


def on_wrapped(fn: Callable) -> Callable:
    """`fn`, a step of loopfuse's own that takes the state wrapped (an ensemble's, calling the user's `held`
    step inside), marked so that `held` leaves it as it is."""
    @functools.wraps(fn)
    def step(state, batch, **static):
        return fn(state, batch, **static)
    step._loopfuse_held = True      # type: ignore[attr-defined]
    return step


class Held:
    """A loop's ``until(new_state, aux)`` or ``init(x, batch)`` on the wrapped state (`until_on_wrapped`,
    `init_on_wrapped`): `fn` sees it unwrapped, an init's state is wrapped. Equal to another of the same `fn`
    (a loop's programs are kept per predicate and init)."""

    def __init__(self, fn: Callable, wraps_result: bool):
        self.fn, self.wraps_result = fn, wraps_result

    def __call__(self, tree, other):
        out = self.fn(unwrap(tree), other)
        return wrap(out) if self.wraps_result else out

    def __eq__(self, other) -> bool:
        return isinstance(other, Held) and (other.fn, other.wraps_result) == (self.fn, self.wraps_result)

    def __hash__(self) -> int:
        return hash((self.fn, self.wraps_result))


def until_on_wrapped(until: Callable | None) -> Callable | None:
    """`until` as a `Held` predicate (None and a held one as they are)."""
    return until if until is None or isinstance(until, Held) else Held(until, False)


def init_on_wrapped(init: Callable | None) -> Callable | None:
    """`init` as a `Held` init, its state wrapped (None and a held one as they are)."""
    return init if init is None or isinstance(init, Held) else Held(init, True)
