"""micro-batch{slices=m}: run the loss and gradient over m slices of the batch, one slice at a time.

Rewrites ``@main``'s step as

* the ops that do not depend on the batch, as they were (before the loop where the loop reads them);
* one ``stablehlo.while`` of m trips (tagged ``loopfuse.micro_batch = m``) whose body runs the ops
  that read per-example values on slice i (the batch arguments' chunk i, each replicated operand
  aligned with them cut alike: a broadcast built at slice size, another value sliced) and carries
  one accumulator per partial sum that leaves it: each reduce-add over the batch axis, dot_general
  contracting it (a weight's gradient) or scatter-add of per-example rows (an embedding's gradient),
  added slice 0, 1, ..., m-1 in order (max, min, and, or where the reduction is one of those); where
  the step adds such sums that nothing else reads (the terms of a gradient jax sums over a leaf's uses:
  a leaf every layer reads, a tied embedding), their elements moved on the way (a transpose) or not,
  the body adds its slice's parts and the loop accumulates the one sum; a per-example value the step
  returns is written back chunk by chunk;
* the ops that read the sums (the loss value, its normalisation, the optimizer update), once after
  the loop, on the accumulated sums.

The step then holds the activations of one slice at a time, and computes the same optimizer update
as on the whole batch. Under ``devices=`` the batch axis is D runs of m chunks, one run per device
(``[B, ...]`` viewed as ``[D, m, B / (D m), ...]``, slice i is ``[:, i]``), so every slice is spread
evenly over the devices; D is read from the batch arguments' (or a Dataset batch's) Shardy sharding.

Why it is exact up to the order of a sum: `batch_axis` gives every value of the step a fact (the same
for every slice, split along a dim like the batch, a partial sum over the batch axis, or computed
from partial sums), following dims, never sizes, op by op with a rule for each; the loop body runs
only ops whose rule says that chunk i of their operands gives chunk i of their result, or their part
of a sum over the batch axis. An op reading both a partial sum and a per-example value (batch norm's
statistics in the normalisation, a masked mean's 1/sum(mask) in the per-example cotangent), an op
that picks, sorts, gathers or pairs examples, and any op with a per-example operand that no rule
knows (custom calls, RNG, loops of the user's) mean the loss does not decompose over the examples:
the pass then leaves the step as it is and its report names that op and its line. A mean's 1/B is a
replicated constant multiplying a partial sum (or broadcast into the per-example cotangent), so it
stays 1/B of the whole batch. A batch whose rows do not divide into m slices (on each device) is an
error naming the argument.

Floating point: each accumulated sum adds m partial sums where the step summed the whole batch axis
at once (and a leaf's terms are added within each slice, then over the slices, where the step added
the terms' whole-batch sums), so it is reassociated and the results differ from jax.jit's in the last
bits. The stated
tolerance (tests/py/test_micro_batch.py): each gradient within 1e-5 of its leaf's largest value
(measured 6e-6 on an MLP, 6e-7 on a small transformer), the state after a few Adam or SGD steps
within 1e-5 of each leaf's largest value plus 1e-6, the loss within 1e-5 relative; a step whose sums
are exact (integer-valued floats) is bitwise equal under the StableHLO reference interpreter. The
pass is opt-in (``compile_step(fn, micro_batches=m)``); its report says what it cut or why not.

Calls that read the batch are inlined first (jax's ``_where``, ``take_along_axis``, ...), their
callees erased once nothing calls them; where the step does not decompose, ``@main`` is put back as
it was and the callees stay.

Where it stops: the loop is one while over the slices, found by its ``loopfuse.micro_batch``
attribute; roll-layers, after it, rolls the layers inside its body (one slice through the rolled
loops, `roll_layers.layers_block`). Over devices, XLA all-reduces each slice's partial sums inside the
loop (m all-reduces of the gradients per step where the whole batch has one).
"""
from collections import Counter
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from . import rewriter as rw
from .batch_axis import AFTER, COMBINE, Plan, Refusal, analyze, batch_inputs
from .dataflow import ARG, Dataflow
from .dead_code import erase_dead_ops, pure_callees
from .functions import erase_uncalled, main_func
from .locations import described, line
from .matchers import producer, splat
from .module_pass import ModulePass, PassError, option, reports
from .rewriter import Builder, Loop
from .vocabulary import MICRO_BATCH

@dataclass(frozen=True)
class MicroBatch(ModulePass):
    """Examples:
        >>> from loopfuse.compile.pass_manager import parse_pipeline
        >>> parse_pipeline("micro-batch{slices=4}")
        [MicroBatch(slices=4)]
    """

    name = "micro-batch"
    summary = "Run the loss and gradient over slices of the batch in a device loop, summing the gradients"

    slices: int = option(1, "slices of the batch the step runs one at a time (1: the step as it is)",
                         minimum=1, maximum=2**31 - 1)

    def adds_control_flow(self) -> bool:
        return self.slices > 1

    def added_control_flow(self, module_op: ir.Operation) -> bool:
        """Whether the batch was cut (its loop), as the report says."""
        return reports(module_op).get(self.name, "").startswith("micro-batched")

    def apply(self, module_op: ir.Operation) -> None:
        if self.slices == 1:
            self.report(module_op, "slices=1: the step is left as it is")
            return
        main = main_func(module_op)
        as_traced = main.operation.clone(ip=ir.InsertionPoint(main.operation))   # put back if it does not cut
        inlined = _inline_batch_calls(main)
        pure = pure_callees(module_op)
        try:
            plan = analyze(main, self.slices, pure)
        except Refusal as e:
            main.operation.erase()
            self.report(module_op, f"did not micro-batch: {e}")
            return
        except PassError as e:
            main.operation.erase()
            raise PassError(as_traced, str(e)) from None
        as_traced.erase()
        text = _describe(plan)        # before the rewrite erases the ops it names
        _rewrite(main, plan, pure)
        erase_uncalled(module_op, inlined)
        self.report(module_op, text)


def _inline_batch_calls(main: func.FuncOp) -> set[str]:
    """Inline every call in `main`'s block that reads a value computed from the batch (directly, or inside a
    region), until none is left; returns the callees' names."""
    inlined: set[str] = set()
    block = main.body.blocks[0]
    while True:
        tainted = {block.arguments[i] for i in batch_inputs(main)}
        calls = []
        for view in block.operations:
            op = view.operation
            if any(v in tainted for v in _reads(op)):
                tainted.update(op.results)
                if isinstance(view, func.CallOp):
                    calls.append(op)
        if not calls:
            return inlined
        for op in calls:
            inlined.add(op.opview.callee.value)
            rw.inline(op)


def _reads(op: ir.Operation) -> list:
    """The values `op` reads: its operands, and what its regions' ops read (values from outside among them)."""
    found = list(op.operands)
    if len(op.regions):
        def visit(inner: ir.Operation) -> ir.WalkResult:
            found.extend(inner.operands)
            return ir.WalkResult.ADVANCE
        op.walk(visit)
    return found


def _rewrite(main: func.FuncOp, plan: Plan, pure: frozenset) -> None:
    g, m = plan.g, plan.slices
    at = g.ops[plan.at]
    for n in plan.hoist:
        g.ops[n].move_before(at)
    roots = plan.roots
    ret = g.ops[-1]
    with Builder.before(at):
        inits = [_start(g.ops[n], plan.cuts[n].combine) for n in roots]
        buffers = [rw.zeros(ir.RankedTensorType(ret.operands[k].type)) for k in plan.outputs]
        loop = Loop.counted(m, partials=inits, rows=buffers)
    loop.op.attributes[MICRO_BATCH] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), m)
    with Builder.at_end(loop.body, at.location):
        body = _Body(plan, loop.counter)
        for n, cut in plan.cuts.items():
            body.run(n, cut)
        partials = [COMBINE[plan.cuts[n].combine](acc, body.values[g.results[n][0]]).result
                    for acc, n in zip(loop.arg("partials"), roots)]
        rows = [rw.write_chunk(buf, body.values[g.operands[len(g.ops) - 1][k]], d, loop.counter, m, plan.runs)
                for buf, (k, d) in zip(loop.arg("rows"), plan.outputs.items())]
        loop.next(partials=partials, rows=rows)
    for acc, n in zip(loop.result("partials"), roots):
        g.values[g.results[n][0]].replace_all_uses_with(acc)
    for buf, k in zip(loop.result("rows"), plan.outputs):
        ret.operands[k] = buf
    for n in reversed(list(plan.cuts)):
        g.erase(g.ops[n])
    erase_dead_ops(main.body.blocks[0], pure)   # the whole-batch broadcasts the slices built at their size


def _start(op: ir.Operation, combine: str) -> ir.Value:
    """The accumulator's value before slice 0: zeros for a sum, else the reduction's own initial value
    (checked the identity of its op), broadcast."""
    t = ir.RankedTensorType(op.results[0].type)
    return rw.zeros(t) if combine == "stablehlo.add" else rw.broadcast(op.operands[1], t.shape)


class _Body:
    """The loop body being built: each cut op run on slice `index`, its operands cut as the plan says."""

    def __init__(self, plan: Plan, index: ir.Value):
        self.plan, self.index = plan, index
        self.values: dict = {}       # value id -> its value in the body (the slice's)
        self.cut_values: dict = {}   # (value id, dim) -> a value made outside, cut to the slice

    def run(self, n: int, cut) -> None:
        g, m = self.plan.g, self.plan.slices
        op = g.ops[n]
        operands = [self.values[v] if v in self.values else g.values[v] if dim is None else self.cut(v, dim)
                    for v, dim in zip(g.operands[n], cut.operands)]
        new = rw.clone(op, operands)
        for r, d in zip(new.results, cut.results):
            if d is not None:
                r.set_type(_cut_type(r.type, d, m))
        for name, k in cut.resize:
            sizes = list(ir.DenseI64ArrayAttr(new.attributes[name]))
            sizes[k] //= m
            new.attributes[name] = ir.DenseI64ArrayAttr.get(sizes)
        self.values.update(zip(g.results[n], new.results))

    def cut(self, v: int, dim: int) -> ir.Value:
        key = (v, dim)
        if key not in self.cut_values:
            value = self.plan.g.values[v]
            self.cut_values[key] = rw.slice_chunk(value, dim, self.index, self.plan.slices, self.plan.runs) \
                if v in self.plan.inputs else self._replicated(value, dim)
        return self.cut_values[key]

    def _replicated(self, value: ir.Value, dim: int) -> ir.Value:
        """A replicated value's chunk along `dim`: a broadcast, splat or iota built at the slice's size
        (a broadcast of a value that spans `dim`, of that value's chunk), else sliced."""
        t = _cut_type(value.type, dim, self.plan.slices)
        b = producer(value, stablehlo.BroadcastInDimOp)
        if b is not None:
            dims = list(ir.DenseI64ArrayAttr(b.attributes["broadcast_dimensions"]))
            x = b.operands[0]
            if dim in dims and ir.RankedTensorType(x.type).shape[dims.index(dim)] > 1:
                x = self._replicated(x, dims.index(dim))
            return stablehlo.BroadcastInDimOp(t, x, dims).result
        scalar = splat(value)
        if scalar is not None:
            return rw.splat(scalar, t.shape)
        iota = producer(value, stablehlo.IotaOp)
        if iota is not None and (along := ir.IntegerAttr(iota.attributes["iota_dimension"]).value) != dim:
            return stablehlo.IotaOp(t, along).result
        return rw.slice_chunk(value, dim, self.index, self.plan.slices, self.plan.runs)


def _by_line(where: str) -> tuple:
    file, _, number = where.rpartition(":")
    return file, int(number)


def _cut_type(t: ir.Type, dim: int, slices: int) -> ir.RankedTensorType:
    t = ir.RankedTensorType(t)
    shape = list(t.shape)
    shape[dim] //= slices
    return ir.RankedTensorType.get(shape, t.element_type, t.encoding)


def _describe(plan: Plan) -> str:
    """The report: the slices, the inputs cut, the ops run per slice, the partial sums accumulated."""
    g, m = plan.g, plan.slices
    inputs = ", ".join(f"{'argument ' + str(v) if g.owner[v] == ARG else described(g.ops[g.owner[v]])} "
                       f"{g.values[v].type} along dim {d}" for v, d in plan.inputs.items())
    lines = [f"micro-batched into {m} slices" + (f", each spread over {plan.runs} devices" if plan.runs > 1 else "")
             + f": the batch ({inputs}) cut into {m}"]
    counts = Counter(g.ops[n].name for n in plan.cuts)
    lines.append(f"ran {len(plan.cuts)} ops once per slice: "
                 + ", ".join(f"{c} {name}" for name, c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))))
    where = sorted({w for n in plan.cuts if (w := line(g.ops[n]))}, key=_by_line)
    if where:
        lines.append("  from " + ", ".join(where))
    roots = plan.roots
    lines.append(f"accumulated {len(roots)} partial sums over the slices, in slice order:")
    lines += [f"  {described(g.ops[n])} -> {g.ops[n].results[0].type}"
              + ("" if plan.cuts[n].combine == "stablehlo.add" else f" (combined by {plan.cuts[n].combine})")
              for n in roots]
    after = sum(1 for n in range(len(g.ops) - 1) if any(plan.facts[r] is AFTER for r in g.results[n]))
    lines.append(f"ran {after} ops after the loop, on the sums")
    if plan.outputs:
        lines.append("wrote back per slice the per-example results " + ", ".join(str(k) for k in plan.outputs))
    return "\n".join(lines)
