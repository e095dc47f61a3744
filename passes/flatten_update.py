"""flatten-update{min-group=2}: compute an update repeated over many leaves once, on one flat vector.

Rewrites: an *expression tree* in ``@main`` is a maximal tree of elementwise ops (add, subtract,
multiply, divide, maximum, minimum, power, sqrt, rsqrt, negate, abs, exponential, log, compare,
select, convert) on statically shaped tensors of one shape (rank >= 1), each inner value used
once, by its parent. Its leaves are *per-leaf tensors* (arguments, results of other ops, values
used more than once) or *shared scalars* (a splat constant, or a ``broadcast_in_dim`` of a 0-d
value). Trees with the same signature (the same ops with the same attributes and element types
in the same operand order, the same repetition of per-leaf operands and of shared scalars) but
possibly different shapes and scalar values form a group: the Adam moment update
``b1 * m + (1 - b1) * g`` of every parameter leaf, say, whatever each leaf's learning rate. At
least ``min-group`` trees of a group are rewritten together: each per-leaf operand is reshaped to
1-D and concatenated over the trees, the tree is computed once on the flat vectors (a shared
scalar broadcast to the flat shape; where the trees' scalars differ, a per-leaf learning rate or a
per-leaf mean's 1/n, each tree's broadcast to its size, concatenated), and each tree's result is
sliced out and reshaped back. A flat operand made exactly of consecutive slices of an earlier group's flat result
(tree for tree, in order) is that result itself, or one slice of it, so a chain of updates (moments,
bias correction, the parameter step) stays flat; the trees are ordered to make that so. The same
holds for flat values the `Flattener` is told of (pack-state's state buffers). On update chains
only (pack-state's ``flatten=true``, `feeding`), a chain that reads the result of another tree (the
``p - t`` of a per-leaf loss, which the loss reads too) gets its own copy of that tree when the copy
reads at most one per-leaf operand besides known flat values (`Flattener.recompute`): flattened
with the chain, it is computed from the buffer, and no more is concatenated than before.

Why it is safe: an elementwise op computes each element from the elements at the same index, so
the flat op computes, element for element, exactly what the tree's op did: the same op with the
same attributes on the same element types and operand order, with the same scalar at that element,
hence the same bits. A copied tree computes the same bits as the tree it copies. Reshape (row
major), concatenate and slice only move elements. The flat code goes right before the first use of
any rewritten tree's result (a use inside a region counts at its enclosing op), which must come
after the definition of everything the trees read. A group is taken in program order, in batches:
a tree that breaks this (it reads an earlier tree's result, or an operand computed from one) starts
the next batch. Ops left unused without side effects are erased.

Limits: only the top-level block of ``@main`` is searched and no op is moved, so per-leaf work
interleaved with reductions (a forward pass) splits into batches of one and stays; 0-d trees are
left alone (they are the scalars). One walk builds every tree and its signature, a hashable tuple,
and the groups are dict entries, so matching is linear in the size of ``@main``.

Whether it is profitable is decided by benchmarks: XLA may already fuse the per-leaf loops
horizontally, and the concatenation copies every per-leaf operand once (built as a tree of
concatenates of at most 16 operands, `_concat.split_wide_concatenates`, which XLA compiles faster).
"""
import math
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import rewriter as rw
from ._concat import split_wide_concatenates
from .dead_code import erase_dead_ops
from .functions import main_func
from .matchers import producer, splat
from .module_pass import ModulePass, option

ELEMENTWISE = (
    stablehlo.AddOp, stablehlo.SubtractOp, stablehlo.MulOp, stablehlo.DivOp, stablehlo.MaxOp, stablehlo.MinOp,
    stablehlo.PowOp, stablehlo.SqrtOp, stablehlo.RsqrtOp, stablehlo.NegOp, stablehlo.AbsOp, stablehlo.ExpOp,
    stablehlo.LogOp, stablehlo.CompareOp, stablehlo.SelectOp, stablehlo.ConvertOp)


@dataclass
class Tree:
    """One expression tree; trees with equal signatures are computed alike, whatever their shapes."""

    nodes: list       # the tree's ops, operands before users, the root last
    slots: list       # (op, operand index) of the first use of each distinct per-leaf operand
    scalar_slots: list  # (op, operand index) of the first use of each distinct shared scalar
    signature: tuple  # per node: (name, attributes, result element type, operand refs)

    @property
    def root(self) -> ir.Value:
        return self.nodes[-1].result

    @property
    def size(self) -> int:
        return math.prod(self.root.type.shape)

    def operands(self) -> list[ir.Value]:
        return [op.operands[i] for op, i in self.slots]

    @property
    def scalars(self) -> list[tuple]:
        """Each distinct shared scalar: ("splat", attribute) or ("value", 0-d value), read now (a
        0-d state leaf the tree broadcasts becomes a slice of a buffer when pack-state packs it)."""
        return [_shared_scalar(op.operands[i]) for op, i in self.scalar_slots]


@dataclass(frozen=True)
class FlattenUpdate(ModulePass):
    name = "flatten-update"
    summary = "Compute an elementwise update repeated over many leaves once, on one flat vector"

    min_group: int = option(2, "rewrite a group of alike trees only when it has at least this many", minimum=2)

    def apply(self, module_op: ir.Operation) -> None:
        flattener = Flattener(main_func(module_op).body.blocks[0])
        flattener.flatten(self.min_group)
        flattener.erase_unused()
        split_wide_concatenates(flattener.block)


def trees_of(block: ir.Block):
    """The expression trees of `block`, in the program order of their roots."""
    ops = [op.operation for op in block.operations]
    candidates = {op for op in ops if _elementwise(op)}
    inner = set()
    for op in candidates:
        uses = list(op.result.uses)
        if len(uses) == 1 and uses[0].owner.operation in candidates:
            inner.add(op)
    for op in ops:
        if op in candidates and op not in inner and _has_uses(op.result):
            yield _tree(op, inner)


def _elementwise(op: ir.Operation) -> bool:
    """A supported elementwise op whose operands and result share one static shape of rank >= 1."""
    if not isinstance(op.opview, ELEMENTWISE) or len(op.results) != 1:
        return False
    t = op.result.type
    if not (isinstance(t, ir.RankedTensorType) and t.has_static_shape and t.rank >= 1):
        return False
    return all(isinstance(v.type, ir.RankedTensorType) and v.type.shape == t.shape for v in op.operands)


def _tree(root: ir.Operation, inner: set) -> Tree:
    """The tree under `root` (whose inner nodes are in `inner`), walked operands first, in operand order."""
    nodes: list[ir.Operation] = []
    index: dict[ir.Operation, int] = {}
    slots: list[tuple[ir.Operation, int]] = []
    slot_of: dict[ir.Value, int] = {}
    scalar_slots: list[tuple[ir.Operation, int]] = []
    scalar_of: dict[tuple, int] = {}
    signature: list[tuple] = []
    producers: dict[ir.Operation, list] = {}   # each op's operand producers, looked up once
    stack = [(root, False)]
    while stack:
        op, ready = stack.pop()
        if not ready:
            producers[op] = [producer(v) for v in op.operands]
            stack.append((op, True))
            stack.extend((d, False) for d in reversed(producers[op]) if d is not None and d in inner)
            continue
        refs: list[tuple] = []
        for i, (v, d) in enumerate(zip(op.operands, producers[op])):
            if d is not None and d in inner:
                refs.append(("node", index[d]))
            elif d is not None and d.name in _SCALAR_OPS and (scalar := _shared_scalar(v)) is not None:
                if scalar not in scalar_of:
                    scalar_of[scalar] = len(scalar_slots)
                    scalar_slots.append((op, i))
                refs.append(("scalar", scalar_of[scalar], v.type.element_type))
            else:
                if v not in slot_of:
                    slot_of[v] = len(slots)
                    slots.append((op, i))
                refs.append(("leaf", slot_of[v], v.type.element_type))
        index[op] = len(nodes)
        nodes.append(op)
        attrs = op.attributes
        signature.append((op.name, tuple((name, attrs[name]) for name in attrs), op.result.type.element_type,
                          tuple(refs)))
    return Tree(nodes, slots, scalar_slots, tuple(signature))


def feeding(trees: list[Tree], sink: ir.Operation) -> list[Tree]:
    """Among `trees` (all of a block's, `trees_of`), those whose root is used only by `sink` or by a
    node of another such tree (an update chain into the return, not a forward pass into a
    reduction). A user comes after the root it reads, so one backward walk over the roots decides."""
    tree_of = {op: n for n, tree in enumerate(trees) for op in tree.nodes}
    kept: set[int] = set()
    for n in reversed(range(len(trees))):
        if all((user := u.owner.operation) == sink or tree_of.get(user) in kept for u in trees[n].root.uses):
            kept.add(n)
    return [tree for n, tree in enumerate(trees) if n in kept]


_SCALAR_OPS = ("stablehlo.broadcast_in_dim", "stablehlo.constant")  # what a shared scalar is made by


def _shared_scalar(value: ir.Value):
    """("splat", scalar attribute) for a splat constant (possibly broadcast), ("value", v) for a broadcast
    0-d value v, else None."""
    op = producer(value, stablehlo.BroadcastInDimOp)
    if op is not None:
        scalar = op.operands[0]
        if not (isinstance(scalar.type, ir.RankedTensorType) and scalar.type.rank == 0):
            return None
        attr = splat(scalar)
        return ("value", scalar) if attr is None else ("splat", attr)
    attr = splat(value)
    return None if attr is None else ("splat", attr)


class Flattener:
    """Rewrites batches of trees in one block, remembering the flat vectors it built (and those it is
    told of: `slice_of`)."""

    def __init__(self, block: ir.Block):
        self.block = block
        self.slice_of: dict[ir.Value, tuple[ir.Value, int]] = {}  # a value sliced out of a flat result -> (flat result, offset)
        self.concat_of: dict[tuple, ir.Value] = {}  # tuple of values -> their concatenation

    def flatten(self, min_group: int, sink: ir.Operation | None = None, trees: list[Tree] | None = None,
                max_size: int | None = None) -> None:
        """Rewrite every group of at least `min_group` alike trees of the block, batch by batch; with
        a `sink`, only the trees whose results flow into nothing but `sink` and such trees (each given
        its copy of what it reads, `recompute`); with `max_size`, only trees of at most that many
        elements. `trees`: the block's (`trees_of`), if found already."""
        trees = list(trees_of(self.block)) if trees is None else trees
        if max_size is not None:
            trees = [t for t in trees if t.size <= max_size]
        if sink is not None:
            trees = self.recompute(trees, feeding(trees, sink), sink)
        groups: dict[tuple, list[Tree]] = {}
        for tree in trees:
            groups.setdefault(tree.signature, []).append(tree)
        for trees in groups.values():
            trees = [t for t in trees if _has_uses(t.root)]  # earlier groups may have consumed some
            if len(trees) < min_group:
                continue
            while len(trees) >= min_group:
                n, anchor = self.batch(trees)
                if n >= min_group and anchor is not None:
                    self.rewrite(trees[:n], anchor)
                trees = trees[n:]

    def recompute(self, trees: list[Tree], kept: list[Tree], sink: ir.Operation) -> list[Tree]:
        """Give the `kept` trees (update chains, `feeding`) their own copy of each other tree of
        `trees` (all of the block's) whose result they read, where that copy reads at most one
        per-leaf operand that is not a slice of a known flat value (`slice_of`) or a kept tree's
        result: the gradient ``2 * (p - t)`` of a per-leaf loss, read by the loss too. Flattened
        with the chain, the copy reads the flat buffer and concatenates no more than the chain did
        (its result); the original stays for its other users. Returns the kept trees after it: a
        tree that reads one copy holds it; a copy read twice is a kept tree of its own (a new walk)."""
        kept_at = {op: n for n, t in enumerate(kept) for op in t.nodes}
        flat = {t.root for t in kept} | set(self.slice_of)
        copies = []   # decided before any rewrite: an op's hash changes with its operands
        for tree in trees:
            if tree.nodes[-1] in kept_at or sum(v not in flat for v in tree.operands()) > 1:
                continue
            uses = [(op, u.operand_number, kept_at[op]) for u in tree.root.uses if (op := u.owner.operation) in kept_at]
            if uses:
                copies.append((tree, uses))
        grown: dict[int, list[ir.Operation]] = {}   # kept tree -> the copies it reads
        shared = False                                # a copy read by more than one op
        for tree, uses in copies:
            ops = _copy_tree(tree, _earliest(op for op, *_ in uses))
            for op, i, _ in uses:
                op.operands[i] = ops[-1].result
            if len(uses) == 1:
                grown.setdefault(uses[0][2], []).extend(ops)
            else:
                shared = True
        if shared:
            return feeding(list(trees_of(self.block)), sink)
        kept = list(kept)
        for n, ops in grown.items():
            inner = set(kept[n].nodes[:-1]) | set(ops)   # built now that the operands are final
            kept[n] = _tree(kept[n].nodes[-1], inner)
        return kept

    def batch(self, trees: list[Tree]):
        """How many leading `trees` one point of the block can compute together, and that point: the
        first use of any of their results, which must come after the definition of all they read."""
        latest, first, roots = None, None, set()
        for n, tree in enumerate(trees):
            operands = tree.operands()
            if any(v in roots for v in operands):
                return n, first
            values = [producer(x) for kind, x in tree.scalars if kind == "value"]
            last_input = _latest([latest, *map(producer, operands), *values])
            first_use = _earliest([first, *(_in_block(u.owner.operation, self.block) for u in tree.root.uses)])
            if last_input is not None and first_use is not None and not last_input.is_before_in_block(first_use):
                return n, first
            latest, first = last_input, first_use
            roots.add(tree.root)
        return len(trees), first

    def rewrite(self, trees: list[Tree], anchor: ir.Operation) -> None:
        """Compute `trees` once on flat vectors, before `anchor`, and erase them."""
        trees = self._forwarding_order(trees)
        sizes = [t.size for t in trees]
        total = sum(sizes)
        columns = zip(*(t.operands() for t in trees))
        with ir.InsertionPoint(anchor), trees[0].nodes[-1].location:
            leaves = [self.flat(list(col), sizes, anchor) for col in columns]
            scalars: dict[int, ir.Value] = {}
            values: list[ir.Value] = []
            for name, attrs, et, refs in trees[0].signature:
                operands = []
                for ref in refs:
                    if ref[0] == "node":
                        operands.append(values[ref[1]])
                    elif ref[0] == "leaf":
                        operands.append(leaves[ref[1]])
                    else:
                        if ref[1] not in scalars:
                            scalars[ref[1]] = _scalars([t.scalars[ref[1]] for t in trees], sizes)
                        operands.append(scalars[ref[1]])
                flat_type = ir.RankedTensorType.get([total], et)
                values.append(ir.Operation.create(name, [flat_type], operands, dict(attrs)).result)
            flat, offset = values[-1], 0
            for tree, n in zip(trees, sizes):
                piece = rw.flat_piece(flat, offset, tree.root.type)
                tree.root.replace_all_uses_with(piece)
                self.slice_of[piece] = (flat, offset)
                offset += n
        for tree in trees:
            for op in reversed(tree.nodes):   # users before what they read
                op.erase()

    def _forwarding_order(self, trees: list[Tree]) -> list[Tree]:
        """`trees` ordered so that an operand column is exactly an earlier flat result, if one can be."""
        operands = [t.operands() for t in trees]
        for k in range(len(trees[0].slots)):
            if not all(ops[k] in self.slice_of for ops in operands):
                continue
            at = [self.slice_of[ops[k]] for ops in operands]
            order = sorted(range(len(trees)), key=lambda i: at[i][1])
            if self._source([operands[i][k] for i in order], [trees[i].size for i in order]) is not None:
                return [trees[i] for i in order]
        return trees

    def _source(self, values: list, sizes: list):
        """(flat, start, end) when `values` are exactly the consecutive slices [start:end] of an
        earlier flat result, or None."""
        first = self.slice_of.get(values[0])
        if first is None:
            return None
        flat, start = first
        offset = start
        for v, n in zip(values, sizes):
            if self.slice_of.get(v) != (flat, offset):
                return None
            offset += n
        return flat, start, offset

    def flat(self, values: list, sizes: list, anchor: ir.Operation) -> ir.Value:
        """`values` as one 1-D vector: (a slice of) an earlier flat result or concatenation if there
        is one, else the concatenation of their reshapes. Call it at an insertion point before `anchor`."""
        source = self._source(values, sizes)
        if source is not None:
            return rw.static_rows(*source)
        known = self._concatenation(values, anchor)
        if known is not None:
            return known
        flat = self.concat_of[tuple(values)] = rw.flat_concat(values)
        return flat

    def _concatenation(self, values: list, anchor: ir.Operation):
        """An earlier concatenation of `values` placed before `anchor`, or None. Its operands are
        checked rather than trusted to the key: an erased value's address may now be a new value's."""
        known = self.concat_of.get(tuple(values))
        concat = None if known is None else producer(known)
        if concat is None or not concat.is_before_in_block(anchor):
            return None
        for piece, v in zip(concat.operands, values):
            reshape = producer(piece, stablehlo.ReshapeOp)
            if piece != v and not (reshape is not None and reshape.operands[0] == v):
                return None
        return known

    def erase_unused(self) -> None:
        """Erase the block's side-effect-free ops left unused (slices no flat chain read, operands
        of erased trees), back to front. One sweep, not a worklist of ops: an op's hash changes
        with its operands in these bindings, so a set of ops goes stale as the rewrite proceeds."""
        erase_dead_ops(self.block)


def _copy_tree(tree: Tree, before: ir.Operation) -> list[ir.Operation]:
    """A copy of `tree`'s ops right before `before` (which comes after the tree's root), reading
    what the tree reads, operands before users."""
    copies: dict[ir.Operation, ir.Operation] = {}
    for op in tree.nodes:
        copy = op.clone(ip=ir.InsertionPoint(before))
        for i, v in enumerate(op.operands):
            if (d := producer(v)) in copies:
                copy.operands[i] = copies[d].result
        copies[op] = copy
    return list(copies.values())


def _scalars(column: list[tuple], sizes: list[int]) -> ir.Value:
    """The shared scalars of a batch of trees, one per tree, as a 1-D vector over their flat
    concatenation: one broadcast when they are all the same, else each tree's broadcast to its size,
    concatenated (a per-leaf learning rate, a per-leaf mean's 1/n)."""
    if all(x == column[0] for x in column):
        return _broadcast(column[0], sum(sizes))
    return rw.concat([_broadcast(x, n) for x, n in zip(column, sizes)])


def _broadcast(scalar: tuple, size: int) -> ir.Value:
    """A shared scalar as a 1-D vector of `size` elements."""
    kind, x = scalar
    if kind == "splat":
        return rw.splat(x, [size])
    return rw.broadcast(x, [size])


def _has_uses(value: ir.Value) -> bool:
    return any(True for _ in value.uses)


def _in_block(op: ir.Operation, block: ir.Block) -> ir.Operation:
    while op.block != block:
        parent = op.parent
        assert parent is not None, "op is not nested in block"
        op = parent.operation
    return op


def _latest(ops):
    """The op among `ops` (Nones skipped) that comes last in their block."""
    return _extreme(ops, lambda a, b: a.is_before_in_block(b))


def _earliest(ops):
    """The op among `ops` (Nones skipped) that comes first in their block."""
    return _extreme(ops, lambda a, b: b.is_before_in_block(a))


def _extreme(ops, replaced_by):
    best = None
    for op in ops:
        if op is not None and (best is None or replaced_by(best, op)):
            best = op
    return best
