"""Sink into a micro-batch loop's body the ops micro-batch computed once before it from state leaves alone.

micro-batch runs every op that does not read the batch once, before its loop (a gate's ``sigmoid(g)``, a
layer norm's scale broadcast to the activations' rank), and the body reads their results. Inside the body
a layer's ops then read values made outside it, not their layer's leaves, so roll-layers finds no op
that reads each layer's leaves, nothing to line the layers up by. `sink` clones those ops at the top of the
body and lets the body read the clones: the body then computes from the leaves as a step without
micro-batches does. `Sunk.undo` puts the body back as it was where nothing rolled; `Sunk.finish` erases
the originals no op reads any more.

What sinks: an op before the loop in ``@main``'s block that the body reads (directly or through another
sunk op), without regions or effects, elementwise or one that only moves elements (broadcast, reshape,
transpose, slice, concatenate, reverse, pad), computing from state leaves and constants alone; and the
constants the body reads, so that the layers' copies of one constant are one value in the body, as they
are in a step without micro-batches. Its work is linear in a leaf's size; in the body it runs once per
slice.

Why it is exact: a clone computes the same op on the same operands (the leaves, constants and values
made before the loop, which the body reads from outside it as it did), so every value the body reads is
the value it read before.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from . import rewriter as rw
from .dead_code import has_side_effects, is_dead
from .matchers import ELEMENTWISE

MADE = frozenset(("stablehlo.constant", "stablehlo.iota"))
MOVES = frozenset(f"stablehlo.{n}" for n in ("broadcast_in_dim", "reshape", "transpose", "slice", "concatenate",
                                             "reverse", "pad"))


@dataclass
class Sunk:
    """The clones `sink` made at the top of a loop body, and the originals they stand for."""

    block: ir.Block            # the entry block of ``@main``
    loop: ir.Operation         # the micro-batch loop
    pairs: list                # (original, clone), in program order

    def undo(self) -> None:
        """The body reads the originals again; the clones are erased (the module as before `sink`)."""
        for original, new in reversed(self.pairs):
            for r, c in zip(original.results, new.results):
                c.replace_all_uses_with(r)
            new.erase()
        self.pairs = []

    def finish(self, leaves: list) -> None:
        """After a rewrite: erase the ops `sink` would sink (from the state leaves `leaves` as they are
        now) that nothing reads any more, the originals of the sunk ones among them."""
        for op in reversed(_candidates(self.block, self.loop, leaves)):
            if is_dead(op):
                op.erase()
        self.pairs = []


def sink(main: func.FuncOp, body: ir.Block, leaves: list) -> Sunk | None:
    """Clone into `body`, a micro-batch loop's body, the ops before the loop computed from the state
    leaves `leaves` (values of ``@main``) that it reads (see the module docstring); None where `body`
    is ``@main``'s own block or nothing sinks."""
    entry = main.body.blocks[0]
    loop = body.owner.operation
    if body == entry:
        return None
    found = _candidates(entry, loop, leaves)
    made: dict[ir.Value, ir.Operation] = {r: op for op in found for r in op.results}
    uses = []                      # (op inside the loop, operand index, value to sink)

    def visit(op: ir.Operation) -> ir.WalkResult:
        for k, v in enumerate(op.operands):
            if v in made:
                uses.append((op, k, v))
        return ir.WalkResult.ADVANCE
    for inner in body.operations:
        inner.operation.walk(visit)
    needed: set = set()
    pending = [made[v] for _, _, v in uses]
    while pending:
        op = pending.pop()
        if op not in needed:
            needed.add(op)
            pending += [made[v] for v in op.operands if v in made]
    if not needed:
        return None
    copies: dict = {}
    pairs = []
    first = next(iter(body.operations)).operation
    with rw.Builder.before(first):
        for op in found:
            if op in needed:
                new = rw.clone(op, [copies.get(v, v) for v in op.operands])
                copies.update(zip(op.results, new.results))
                pairs.append((op, new))
    for op, k, v in uses:
        op.operands[k] = copies[v]
    return Sunk(entry, loop, pairs)


def _candidates(entry: ir.Block, loop: ir.Operation, leaves: list) -> list[ir.Operation]:
    """The ops before `loop` in `entry` that may sink, in program order: constants, and ops of the kinds
    that sink computing from the state leaves `leaves` and constants alone."""
    derived: set[ir.Value] = set(leaves)
    found = []
    for view in entry.operations:
        op = view.operation
        if op == loop:
            break
        if op.name in MADE or ((op.name in ELEMENTWISE or op.name in MOVES) and len(op.regions) == 0
                               and not has_side_effects(op) and all(v in derived for v in op.operands)):
            found.append(op)
            derived.update(op.results)
    return found
