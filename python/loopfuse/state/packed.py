"""Packed state: a state's small leaves kept as flat buffers between calls (`pack`, `PackedState`).

The `pack-state` pass carries small leaves as flat buffers inside one call's device loop, but the
call still takes and returns the state leaf by leaf: 900 donated buffers in and out per call for
Adam over 300 leaves, which costs as much as ten of its steps (BENCHMARKS.md, "Packed state").
`pack(state)` moves the packing to the caller, as a hand-written ``ravel_pytree`` program does,
without losing the pytree: a `PackedState` is a pytree whose leaves are 1-D buffers holding the
small leaves (one per element type and mirrored subtree: the parameters and each optimizer moment
apart) and the other leaves as they are. A `Step` called with it runs the user's step on
``state.unpack()`` and packs the new state again inside the compiled program, so the call passes
a few buffers, and the loop carries them. ``state.unpack()`` returns the pytree.

Why it is exact: packing reshapes to 1-D and concatenates, unpacking slices and reshapes back; both
only move elements, and every slice reads back the elements its leaf put there. The step computes
on the same values; XLA sees slices and concatenates around the same arithmetic (what `pack-state`
rewrites the loop to), and like that pass it may fuse them to other last bits in a few programs
(`tests/py/test_packed.py` says which, and by how much). So packing is the caller's choice.

Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import loopfuse
    >>> state = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "step": jnp.int32(0)}
    >>> packed = loopfuse.pack(state)
    >>> [x.shape for x in jax.tree_util.tree_leaves(packed)]   # one f32 buffer, the int32 leaf alone
    [(9,), ()]
    >>> packed.unpack()["w"].tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import warn
from ..passes.layer_runs import keyed_runs, runs
from ..passes.pack_state import PackState
from .leaves import check_same_state, is_key, is_weak, keyed, keyed_paths

MAX_LEAF_ELEMENTS = PackState.max_leaf_elements


@dataclass(frozen=True)
class Layout:
    """Where each leaf of a state lives: `places[i]` is ``(buffer, offset)`` for a packed leaf,
    ``(None, position among the kept leaves)`` for one kept as it is."""

    treedef: Any
    shapes: tuple
    places: tuple
    buffer_dtypes: tuple

    def pack(self, state) -> "PackedState":
        """`state` (of this layout's structure) as a `PackedState`; traceable. Each buffer holds its leaves
        in offset order, which is not leaf order where a run of layers is stacked by index from keys that
        sort otherwise (``h_10`` before ``h_2``)."""
        leaves = self.treedef.flatten_up_to(state)
        pieces: list[list] = [[] for _ in self.buffer_dtypes]
        kept = []
        for x, (b, at) in zip(leaves, self.places):
            if b is None:
                kept.append(x)
            else:
                pieces[b].append((at, jnp.reshape(x, (-1,))))
        return PackedState(self, tuple(lax.concatenate([x for _, x in sorted(p, key=lambda t: t[0])], 0)
                                       for p in pieces), tuple(kept))

    def unpack(self, buffers, kept):
        """The state pytree of `buffers` and `kept`; traceable."""
        return self.unflatten(lambda b, at, shape: jnp.reshape(lax.slice(buffers[b], (at,), (at + math.prod(shape),)),
                                                             shape), kept)

    def held_paths(self) -> list[list[str]]:
        """Per leaf of a `PackedState` (its buffers, then its kept leaves), the key paths of the state
        leaves it holds: a buffer's in offset order, a kept leaf's own."""
        paths = keyed_paths(self.treedef.unflatten([0] * self.treedef.num_leaves))
        held: list[list] = [[] for _ in self.buffer_dtypes]
        kept: list[list] = []
        for path, (b, at) in sorted(zip(paths, self.places), key=lambda item: (item[1][0] is None, item[1])):
            if b is None:
                kept.append([path])
            else:
                held[b].append(path)
        return held + kept

    def unflatten(self, piece: Callable, kept):
        """The state pytree: each packed leaf ``piece(buffer, offset, shape)``, the others from `kept`."""
        return jax.tree_util.tree_unflatten(self.treedef, [kept[at] if b is None else piece(b, at, shape)
                                                           for shape, (b, at) in zip(self.shapes, self.places)])


class PackedState:
    """A state whose small leaves live in flat buffers (see the module docstring); a pytree whose
    leaves are the buffers, then the leaves kept as they are."""

    def __init__(self, layout: Layout, buffers: tuple, kept: tuple):
        self.layout, self.buffers, self.kept = layout, buffers, kept

    def unpack(self):
        """The state as the step function takes it (new arrays; this packed state stays valid)."""
        if not _concrete(self):
            return self.layout.unpack(self.buffers, self.kept)
        hosts = [np.asarray(b) for b in self.buffers]    # sliced on the host: no program per layout to compile
        return self.layout.unflatten(
            lambda b, at, shape: jax.device_put(hosts[b][at:at + math.prod(shape)].reshape(shape),
                                                self.buffers[b].sharding),
            [_copy(x) for x in self.kept])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{x.dtype}[{x.shape[0]}]" for x in self.buffers)
        return f"PackedState({len(self.layout.places)} leaves: buffers {sizes or 'none'}, {len(self.kept)} kept)"


def _children(p: PackedState) -> tuple[list, Layout]:
    return ([(jax.tree_util.GetAttrKey(f"buffers[{i}]"), x) for i, x in enumerate(p.buffers)]
            + [(jax.tree_util.GetAttrKey(f"kept[{i}]"), x) for i, x in enumerate(p.kept)]), p.layout


def _rebuild(layout: Layout, xs) -> PackedState:
    xs, n = tuple(xs), len(layout.buffer_dtypes)
    return PackedState(layout, xs[:n], xs[n:])


jax.tree_util.register_pytree_with_keys(PackedState, _children, _rebuild)


def pack(state, *, max_leaf_elements: int = MAX_LEAF_ELEMENTS, layers: bool = False) -> PackedState:
    """`state` with its small leaves packed: the array leaves of at most `max_leaf_elements`
    elements on one device, grouped by dtype and by mirrored subtree (`_mirrors`: the parameters
    and each optimizer moment apart), each group of two or more leaves one 1-D buffer in leaf
    order. Weakly typed leaves, PRNG keys, sharded leaves and leaves alone in their group stay as
    they are. `state` itself is not consumed. Call a `Step` with the result, and ``.unpack()``
    what it returns.

    layers: also stack each leaf of a run of alike layers (`passes.layer_runs`: a Python list of
    layers, whatever their size, or, where no index proposes a run, a dict of alike layers under
    names, in key order, the order a step iterating the dict reads them) across the layers, one
    buffer per leaf, layer after layer: the layout ``compile_step(..., memory_budget=b)`` rolls in
    place, so that a call neither stacks nor unstacks the layers' leaves (see README, "Rolling
    repeated layers"). A step reading named layers in another order rolls them stacked inside the
    call instead (a copy), as it would without `layers`."""
    if isinstance(state, PackedState):
        raise TypeError("the state is packed already")
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    leaves = [x for _, x in with_paths]
    groups: dict = {}
    if layers:
        groups = _layer_groups([keyed(p) for p, _ in with_paths], leaves)
    stacked = {i for g in groups.values() for i in g}
    for i, (x, part) in enumerate(zip(leaves, _mirrors(treedef))):
        if i not in stacked and _packable(x, max_leaf_elements):
            groups.setdefault((np.dtype(x.dtype), part), []).append(i)
    groups = {d: g for d, g in groups.items() if len(g) >= 2}
    places: list = [None] * len(leaves)
    for b, g in enumerate(groups.values()):
        offset = 0
        for i in g:
            places[i] = (b, offset)
            offset += math.prod(np.shape(leaves[i]))
    n_kept = 0
    for i, place in enumerate(places):
        if place is None:
            places[i], n_kept = (None, n_kept), n_kept + 1
    layout = Layout(treedef, tuple(tuple(np.shape(x)) for x in leaves), tuple(places),
                    tuple(np.dtype(leaves[g[0]].dtype) for g in groups.values()))
    buffers = []
    for g in groups.values():   # on the host: one concatenation, not a program of one op per leaf to compile
        flat = np.concatenate([np.asarray(leaves[i]).reshape(-1) for i in g])
        buffers.append(jax.device_put(flat, getattr(leaves[g[0]], "sharding", None)))
    kept = tuple(_copy(x) for x, (b, _) in zip(leaves, places) if b is None)
    return PackedState(layout, tuple(buffers), kept)


def _layer_groups(paths: list, leaves: list) -> dict:
    """One group per leaf of each run of alike layers (`layer_runs.runs`, or `keyed_runs` in leaf
    order where no index proposes one), its layers in order. A group of weakly typed leaves stays apart
    (a buffer would make them strongly typed), with a warning naming them: a model's leaf made from a
    Python scalar without a dtype (``jnp.full(shape, 0.01)``) is weak, and its layers then roll stacked
    inside each call, or not at all."""
    types = [f"{x.dtype}{list(np.shape(x))}" if _packable(x, math.inf, weak=True) else None for x in leaves]
    groups: dict = {}
    weak: list = []
    named = [p if t is not None else None for p, t in zip(paths, types)]
    for run in runs(named, types) or keyed_runs(named, types, list(range(len(named)))):   # keys: in leaf order
        for prefix, per_layer in sorted(run.families.items()):
            for suffix in sorted(per_layer[0]):
                group = [layer[suffix] for layer in per_layer]
                if any(is_weak(leaves[i]) for i in group):
                    weak += [paths[i] for i in group]
                elif not any(i in g for g in groups.values() for i in group):
                    groups[("layers", prefix, suffix)] = group
    if weak:
        more = f" and {len(weak) - 3} more" if len(weak) > 3 else ""
        warn(f"loopfuse.pack(layers=True): {len(weak)} layer leaves are weakly typed and stay unstacked "
             f"({', '.join(weak[:3])}{more}): a buffer would make them strongly typed. A leaf made from a "
             "Python scalar without a dtype is weak (jnp.full(shape, 0.01)); give it one "
             "(jnp.full(shape, 0.01, jnp.float32)) to stack it with its layers")
    return groups


def on_packed(fn: Callable, layout: Layout) -> Callable:
    """``fn(state, batch, **static)`` as the step of states packed by `layout`."""
    @functools.wraps(fn)
    def packed_fn(packed, batch, **static):
        state = packed.unpack()
        out = fn(state, batch, **static)
        if isinstance(out, tuple) and len(out) == 2:
            check_same_state(state, out[0])
            out = layout.pack(out[0]), out[1]
        return out      # not (new_state, aux): tracing names the problem
    return packed_fn


def buffer_paths(state) -> list | None:
    """Per leaf of `state` as a step takes it, the key paths of the state leaves it holds
    (`Layout.held_paths`), or None for a state that is not packed."""
    return state.layout.held_paths() if isinstance(state, PackedState) else None


def check_not_nested(state) -> None:
    """Raise TypeError naming a `PackedState` inside `state`: a step runs a packed state only as the
    whole state (it would see the PackedState object, not the pytree it packs)."""
    found, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, PackedState))
    for path, x in found:
        if path and isinstance(x, PackedState):
            raise TypeError(f"state{keyed(path)} is a PackedState inside the state pytree; a "
                            "step runs a packed state only as the whole state: pack the whole state "
                            "(loopfuse.pack(state)) instead")


def until_on_packed(until: Callable | None) -> Callable | None:
    """A loop's ``until(state, aux)`` on the packed state."""
    return None if until is None else functools.wraps(until)(lambda packed, aux: until(packed.unpack(), aux))


def _mirrors(treedef) -> list:
    """Per leaf, which mirrored subtree holds it (None: none). Mirrored subtrees: the outermost
    subtrees (of two or more leaves) whose structure occurs under two or more different parents, as
    an optimizer's moments mirror the parameters (repeated siblings, the layers of one list, are
    not mirrors). Packed apart, they are whole buffers of the per-role groups pack-state forms with
    ``flatten=true``, which then needs no copy to regroup them."""
    nodes: list = []          # (structure, first leaf, parent node)

    def walk(node, start: int, parent) -> None:
        me = len(nodes)
        nodes.append((node, start, parent))
        for child in node.children():
            walk(child, start, me)
            start += child.num_leaves
    walk(treedef, 0, None)
    parents: dict = {}
    for node, _, parent in nodes:
        if node.num_leaves >= 2:
            parents.setdefault(node, set()).add(parent)
    part: list = [None] * treedef.num_leaves
    for node, start, _ in nodes:          # outer subtrees first
        end = start + node.num_leaves
        if len(parents.get(node, ())) >= 2 and all(p is None for p in part[start:end]):
            part[start:end] = [start] * (end - start)
    return part


def _packable(x, max_leaf_elements: float, weak: bool = False) -> bool:
    """Whether `x` may live in a buffer: an array of one device, not a key, not empty, of at most
    `max_leaf_elements` elements, and strongly typed unless `weak`."""
    if (not hasattr(x, "dtype") or is_key(x) or is_weak(x) and not weak
            or not 0 < math.prod(np.shape(x)) <= max_leaf_elements):
        return False
    sharding = getattr(x, "sharding", None)
    return sharding is None or len(sharding.device_set) == 1


def _concrete(packed: PackedState) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(packed))


def _copy(x):
    """A new buffer for a jax Array (donating one of the two leaves the other), anything else as it is."""
    return x.copy() if isinstance(x, jax.Array) else x
