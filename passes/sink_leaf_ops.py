"""Sink into a micro-batch loop's body the ops micro-batch computed once before it from state leaves alone.

micro-batch runs every op that does not read the batch once, before its loop (a gate's ``sigmoid(g)``, a
layer norm's scale broadcast to the activations' rank), and the body reads their results. Inside the body
a layer's ops then read values made outside it, not their layer's leaves, so roll-layers finds no op
that reads each layer's leaves, nothing to line the layers up by. `sink` clones those ops at the top of the
body and lets the body read the clones: the body then computes from the leaves as a step without
micro-batches does. Where nothing rolls, `Sunk.undo` puts the body back as it was; after a rewrite,
`Sunk.finish` moves the clones no rolled loop took (the ops of layers left out of the run, of the
embedding or the head) back before the loop, where micro-batch had them, so no op runs once per slice that
ran once before. The canonicalization after each rewrite erases the originals nothing reads any more.

What sinks: an op before the loop in ``@main``'s block, without regions or effects, elementwise or one
that only moves elements (broadcast, reshape, transpose, slice, concatenate, reverse, pad), computing
from a state leaf (and constants, iotas, or such ops on them alone, which sink with it), whose result
the body reads, directly or through another sunk op; and the constants the body reads, so that the
layers' copies of one constant are one value in the body, as they are in a step without micro-batches.

Why it is exact: a clone computes the same op on the same operands (the leaves, constants and values
made before the loop, which the body reads from outside it as it did), so every value the body reads is
the value it read before; moving an op back before the loop changes where it runs, not what it reads.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from . import rewriter as rw
from .dead_code import has_side_effects
from .matchers import ELEMENTWISE
from .vocabulary import SUNK

MADE = frozenset(("stablehlo.constant", "stablehlo.iota"))      # ops of no operands
MOVES = frozenset(f"stablehlo.{n}" for n in ("broadcast_in_dim", "reshape", "transpose", "slice", "concatenate",
                                             "reverse", "pad"))


@dataclass
class Sunk:
    """The clones `sink` made at the top of a micro-batch loop's body (each marked `SUNK`), and their originals."""

    pairs: list                # (original, clone), in program order

    def undo(self) -> None:
        """Before any rewrite: the body reads the originals again, and the clones are erased (the module
        prints as before `sink`)."""
        for original, new in reversed(self.pairs):
            for r, c in zip(original.results, new.results):
                c.replace_all_uses_with(r)
            new.erase()

    def finish(self, body: ir.Block) -> None:
        """After a rewrite: the clones still at the top of `body`, the micro-batch loop's body as found
        again (roll-layers may have rebuilt the loop around it), that read only values made outside the
        loop moved back before it, in order; the marks removed from every op (the rolled loops copied some)."""
        loop = body.owner.operation
        inside: set[ir.Value] = set(body.arguments)
        for view in list(body.operations):
            op = view.operation
            if SUNK in op.attributes and not any(v in inside for v in op.operands):
                op.move_before(loop)
                del op.attributes[SUNK]
            else:
                inside.update(op.results)

        def unmark(op: ir.Operation) -> ir.WalkResult:
            if SUNK in op.attributes:
                del op.attributes[SUNK]
            return ir.WalkResult.ADVANCE
        loop.walk(unmark)


def sink(main: func.FuncOp, body: ir.Block, leaves: list) -> Sunk | None:
    """Clone into `body`, a micro-batch loop's body, the ops before the loop computed from the state
    leaves `leaves` (values of ``@main``) that it reads, and the constants it reads (see the module
    docstring); None where `body` is ``@main``'s own block or nothing sinks."""
    entry = main.body.blocks[0]
    loop = body.owner.operation
    if body == entry:
        return None
    made, from_leaf = _candidates(entry, loop, leaves)
    uses = []                      # (op inside the loop, operand index, value to sink)

    def visit(op: ir.Operation) -> ir.WalkResult:
        for k, v in enumerate(op.operands):
            if v in made and (v in from_leaf or made[v].name == "stablehlo.constant"):
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
    with rw.Builder.before(next(iter(body.operations)).operation):
        for op in dict.fromkeys(made.values()):
            if op in needed:
                new = rw.clone(op, [copies.get(v, v) for v in op.operands])
                new.attributes[SUNK] = ir.UnitAttr.get()
                copies.update(zip(op.results, new.results))
                pairs.append((op, new))
    for op, k, v in uses:
        op.operands[k] = copies[v]
    return Sunk(pairs)


def _candidates(entry: ir.Block, loop: ir.Operation, leaves: list) -> tuple[dict, set]:
    """({result: its op} of the ops before `loop` in `entry` that may sink, in program order; the results
    among them computed from a state leaf of `leaves`): ops of no operands, and ops of the kinds that
    sink reading only the leaves and the candidates' results."""
    made: dict[ir.Value, ir.Operation] = {}
    from_leaf: set[ir.Value] = set(leaves)
    for view in entry.operations:
        op = view.operation
        if op == loop:
            break
        if op.name in MADE or ((op.name in ELEMENTWISE or op.name in MOVES) and not has_side_effects(op)
                               and all(v in from_leaf or v in made for v in op.operands)):
            made.update((r, op) for r in op.results)
            if any(v in from_leaf for v in op.operands):
                from_leaf.update(op.results)
    return made, from_leaf
