"""Schedules XLA:CPU needs: rewrites that compute the same values as the plain form, and steer
XLA's scheduler and copy insertion away from a copy or a buffer it would otherwise keep. Each is
here with the measurement that justifies it; roll-layers builds its loops with them.

1. `after`: a value computed from a loop's result (an op's), so that what reads it runs after it.
   XLA schedules an op that does not depend on a loop before it and keeps the result live through
   the loop; it folds the loop's counter, and drops an optimization barrier before scheduling. The
   backward loop's first carried rows (layer L-1's state), read from the inputs, were scheduled
   before the forward loop: one layer's state live through it, 2.5 MiB of an nnx GPT's peak. An
   update run's (after a micro-batch loop), read after no loop, kept a layer's rows live through the
   micro-batch loop: 9 MiB of the linen GPT's temporaries with 4 slices (65.9 against 56.8 MiB).
2. `write_first_rows`: writes after a loop, inside a loop of their own. XLA:CPU copies a loop's
   result before a dynamic-update-slice that follows the loop (a minimal program does it, with or
   without aliasing and region analysis): writing layer 0's rows after the backward loop copied
   every stack once a call, 108.5 MiB on the nnx GPT (53 copies in its program, 7 after).
3. `rebuilt_in_body`: a broadcast of a smaller value that a loop body reads is built again in the
   body, where XLA fuses it into its users; read from outside, it is a full-size buffer live across
   the loop (Adam's bias corrections broadcast to a leaf's shape: 5 MiB of the nnx GPT's peak).
4. (In roll_layers' backward loop, by its structure.) A layer's new stacked rows are carried to the
   next iteration and written there first, before anything reads the stack: written where they are
   computed, a read of another leaf's old row could follow that leaf's write (a moment's update that
   XLA recomputes inside the parameter's), and XLA copied every stack every iteration to keep it.
5. `read_before` and `write_pieces`: the rows a packed buffer holds besides a run's (layers left
   out of it: a stem, a last block). Read where the step reads them (a slice, which XLA fuses into
   each reader, wherever it is scheduled: the left-out layers' backward and update run after the
   loops that write the buffer in place) and written with the loops' rows as one concatenate, XLA
   copied every such buffer whole at the start of the call: 33 copies, 48.9 MiB at the peak of issue
   38's GPT with an unlike stem and last block (228.4 MiB of temporaries, 182.1 MiB without them).
   Read into buffers of their own inside a loop before anything else, and written over the last
   loop's result inside another (as 2), no buffer is copied. A value a loop only passes through
   does not do: XLA forwards it from the loop's operand.
"""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import rewriter as rw
from .dataflow import tensor_bytes


def after(op: ir.Operation, value: int) -> ir.Value:
    """The 0-d i32 `value`, computed from `op`'s results (a loop's carried values) so that what reads
    it is scheduled after `op` (`unfolded`)."""
    return unfolded(value, list(op.results))


def unfolded(value: int, of: list) -> ir.Value:
    """The 0-d i32 `value` computed from the values `of`: ``value + (x != x)`` for the first element
    x of the first floating-point one, which XLA cannot fold; `value` + 1 where x is NaN (the callers
    give that the same effect, by clamping or by repeating). `value` where none is floating-point."""
    for v in of:
        t = ir.RankedTensorType(v.type)
        if isinstance(t.element_type, ir.FloatType) and 0 not in t.shape:
            ones = ir.DenseI64ArrayAttr.get([1] * t.rank)
            x = rw.reshape(stablehlo.SliceOp(v, ir.DenseI64ArrayAttr.get([0] * t.rank), ones, ones).result, [])
            nan = stablehlo.CompareOp(x, x, stablehlo.ComparisonDirectionAttr.get("NE")).result
            return stablehlo.AddOp(rw.scalar(value), stablehlo.ConvertOp(rw.i32(), nan).result).result
    return rw.scalar(value)


def write_first_rows(loop: ir.Operation, stacks: list, rows: list, at: list) -> list:
    """`stacks` (results of `loop`) with row `at` (ints) of each replaced by the one of `rows`, written
    after `loop` (`_written_after`)."""
    if not stacks:
        return []
    return _written_after(loop, stacks, rows, lambda held, new: [
        rw.write_row(s, r, rw.scalar(k)) for s, r, k in zip(held, new, at)])


def _written_after(loop: ir.Operation, targets: list, values: list, write) -> list:
    """`targets` (computed from `loop`'s results) as ``write(targets, values)`` gives them, written inside a
    loop of its own that runs once, or twice with the same writes: a trip count XLA cannot fold (`after`),
    so it does not inline the body after `loop`."""
    writes = rw.Loop.counted(after(loop, 1), targets=targets, values=values)
    with ir.InsertionPoint(writes.body), loop.location:
        writes.next(targets=write(writes.arg("targets"), writes.arg("values")), values=writes.arg("values"))
    return writes.result("targets")


def read_before(buffers: list, pieces: list) -> list:
    """The `pieces` ((buffer index, first, last) element ranges of the 1-D `buffers`) read inside a loop
    of their own, here, that runs once (twice where a buffer's first element is NaN: the same reads):
    each a buffer of its own, read before anything that follows can write the buffers in place."""
    types = [ir.RankedTensorType.get([hi - lo], ir.RankedTensorType(buffers[b].type).element_type)
             for b, lo, hi in pieces]
    read = rw.Loop.counted(unfolded(1, buffers), buffers=buffers, pieces=[rw.zeros(t) for t in types])
    with ir.InsertionPoint(read.body):        # at the caller's location
        held = read.arg("buffers")
        read.next(buffers=held, pieces=[stablehlo.DynamicSliceOp(held[b], [rw.scalar(lo)], ir.DenseI64ArrayAttr.get(
            [hi - lo])).result for b, lo, hi in pieces])
    return read.result("pieces")


def write_pieces(loop: ir.Operation, buffers: list, pieces: list) -> list:
    """The 1-D `buffers` (computed from `loop`'s results) with their `pieces` (for each buffer, a list
    of (offset, 1-D value)) written over them (`_written_after`)."""
    def write(held: list, values: list) -> list:
        new, out = iter(values), []
        for buffer, written in zip(held, pieces):
            for offset, _ in written:
                buffer = stablehlo.DynamicUpdateSliceOp(buffer, next(new), [rw.scalar(offset)]).result
            out.append(buffer)
        return out
    return _written_after(loop, buffers, [v for written in pieces for _, v in written], write)


def rebuilt_in_body(op: ir.Operation) -> bool:
    """Whether a loop body that reads `op`'s value, the same at every iteration, builds `op` again
    instead: a ``stablehlo.broadcast_in_dim`` to a larger tensor."""
    return op.name == "stablehlo.broadcast_in_dim" and \
        tensor_bytes(op.operands[0].type) < tensor_bytes(op.results[0].type)
