"""Per-step calls through jaxlib's C++ dispatcher, the path jax.jit's calls take.

The first call of a signature runs loopfuse's Python path (flatten, place, execute, unflatten) and
hands the dispatcher `fastpath` data: loopfuse's own executable (after its passes, with its
aliasing, so donation still consumes the state), where each argument goes and what each output
is. Later calls of that signature flatten, place and execute in C++. A signature the data cannot
describe takes the Python path on every call: a step with effects (jax does the same), a Dataset
step index that is no int32 scalar, an array sharded otherwise than the executable takes it.
"""
import jax
import numpy as np

from .. import _jax_compat
from ..state.leaves import dtype, is_deleted


def dispatcher(name: str, python, cache_miss, static_argnames=()):
    """The C++ dispatcher calling `cache_miss` on a new signature (see `_jax_compat.cpp_dispatcher`),
    or `python` itself when this jax has none."""
    return _jax_compat.cpp_dispatcher(name, python, cache_miss, static_argnames) or python


def fastpath(executable, args: tuple, outs) -> "_jax_compat.FastpathData | None":
    """How the dispatcher repeats the call ``executable(args) -> outs`` for arguments of the same
    signature, or None when it must not. `args`: state and batch, then as the call passed them (none
    where the executable takes no more) the step index and, for a loop that can stop, the initial
    stopped flag."""
    t = executable.traced
    if t.effects.any:
        return None
    flat, _ = _jax_compat.dispatch_flatten(args)
    out_leaves, out_tree = _jax_compat.dispatch_flatten(outs)
    results = executable.results
    if len(out_leaves) != len(results) or results != sorted(results):  # outputs not in flat order
        return None
    if t.has_step_index and not _int32_scalar(args[2]) or t.stopped_arg and not _bool_scalar(args[3]):
        return None
    extra = [t.has_step_index, True][:len(args) - 2]   # the step index is taken only for a Dataset
    kept = [True] * (len(flat) - len(extra)) + extra
    taken = [x for x, keep in zip(flat, kept) if keep]
    targets = executable.arg_targets
    n = len(targets[0].device_set) if targets else 1
    if n > 1 and any(isinstance(x, jax.Array) and len(x.sharding.device_set) == n and x.sharding != s
                     for x, s in zip(taken, targets)):  # the dispatcher would pass it as it is
        return None
    return _jax_compat.FastpathData(
        executable.executable, out_tree, targets, [x.sharding for x in out_leaves], [x.aval for x in out_leaves],
        [True] * len(out_leaves), kept, [None] * len(targets))


def refused(tree) -> bool:
    """Whether the C++ path refuses the arguments `tree` before running (so nothing was consumed):
    a leaf whose buffer an earlier call donated, or one array passed as two leaves (it cannot be
    donated twice)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return len(set(map(id, leaves))) < len(leaves) or any(map(is_deleted, leaves))


def _bool_scalar(x) -> bool:
    return np.shape(x) == () and dtype(x) == np.bool_


def _int32_scalar(x) -> bool:
    try:
        return np.shape(x) == () and dtype(x) == np.int32
    except TypeError:
        return False
