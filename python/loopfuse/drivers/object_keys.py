"""The key under which `minimize` keeps the program of an optimizer or an `until` predicate: objects that trace
the same program have equal keys, so ``optax.adam(1e-3)`` written inline in a loop of solves is one program (as
jax.jit keys a static argument by its equality, not its identity).

A function is keyed by its code, its module's globals, its defaults and what its closure holds, each keyed so in
turn (optax's transformations are closures over their hyperparameters and inner transformations); a bound method
by its function and its object; a `functools.partial` by its function and arguments; a tuple, list or dict by its
type and its items' keys; a Python number, string or None by its type and value (a float by its bits: -0.0 is not
0.0); any other hashable object by its type and itself (its own equality, as for a jax.jit static argument, such
as `loopfuse.gtol`'s tolerance); anything else (an array) by its identity, held while the key lives.

Examples:
    >>> import optax
    >>> object_key(optax.adam(1e-3)) == object_key(optax.adam(1e-3))
    True
    >>> object_key(optax.adam(1e-3)) == object_key(optax.adam(1e-2))
    False
    >>> object_key(lambda p, loss: loss < 1e-6) == object_key(lambda p, loss: loss < 1e-6)   # two code objects
    False
"""
import functools
import types
from typing import Any, Hashable

_DEPTH = 32          # nesting followed before an object is keyed by its identity (a chain of chains of ...)
_VALUES = (type(None), bool, int, str, bytes)


def object_key(obj: Any) -> Hashable:
    """`obj`'s key (see the module's docstring): equal for two objects that trace the same program."""
    return _key(obj, _DEPTH, frozenset())


class _Identity:
    """An object keyed by its identity; it is held, so that its id is not another object's while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


_EMPTY_CELL = object()


def _key(x, depth: int, seen: frozenset) -> Hashable:
    t = type(x)
    if t in _VALUES:
        return t, x
    if t is float:
        return t, x.hex()
    if t is complex:
        return t, x.real.hex(), x.imag.hex()
    if depth == 0 or id(x) in seen:             # too deep, or a cycle (a closure that holds itself)
        return _Identity(x)
    depth, seen = depth - 1, seen | {id(x)}
    if t is types.FunctionType:
        return (t, x.__code__, _Identity(x.__globals__), _key(x.__defaults__, depth, seen),
                _key(x.__kwdefaults__, depth, seen), tuple(_key(_contents(c), depth, seen) for c in x.__closure__ or ()))
    if t is types.MethodType:
        return t, _key(x.__func__, depth, seen), _key(x.__self__, depth, seen)
    if t is functools.partial:
        return t, _key(x.func, depth, seen), _key(x.args, depth, seen), _key(x.keywords, depth, seen)
    if isinstance(x, (tuple, list)):            # NamedTuples (optax's GradientTransformation) keep their type
        return t, tuple(_key(item, depth, seen) for item in x)
    if t is dict:
        return t, tuple((_key(k, depth, seen), _key(v, depth, seen)) for k, v in x.items())
    try:
        hash(x)
    except Exception:                           # noqa: BLE001 -- unhashable (or a hash that fails): identity
        return _Identity(x)
    return t, x


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:                          # a cell not yet filled
        return _EMPTY_CELL
