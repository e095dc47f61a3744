"""cond-to-select: a two-way ``stablehlo.case`` in ``@main`` whose branches are cheap becomes selects.

Rewrites: a ``stablehlo.case`` of two branches in ``@main``'s block whose branches hold only cheap ops
(`cheap`: elementwise ops, constants, iotas, broadcasts, reshapes, slices, concatenates, pads, dynamic
slices, reductions with an elementwise body, calls of functions made of those) runs both branches' ops
before where it stood, and each result becomes ``select(index != 0, branch 1's value, branch 0's)``
(where the index is ``convert(p)`` of a boolean ``p``, as jax lowers ``lax.cond``: ``select(p, ..)``).
A case for one of whose results both branches return the same value stays a case (`Selects`).

Why: ``optax.MultiSteps`` (gradient accumulation) and other wrappers that update the state only on some
steps do it in a ``lax.cond`` over the whole state. A cond's branches are regions that roll-layers
cannot see into, and with the state's layers stacked (``pack(state, layers=True)``) XLA copies every
stacked buffer the cond reads and then writes back: the rolled program held 1.84x jax.jit's
temporaries where, made selects, the update rolls into the backward loop, in place (0.52x). Under
jax.jit XLA compiled that program's cond to selects too (its optimized HLO has no conditional), though
it keeps a small cond of elementwise branches as a conditional.

Why it is exact (in the reference interpreter; XLA may fuse the moved ops with their neighbours and
round in another last bit, so it runs within roll-layers, opt-in): the branches' ops have no effects
and read only values defined before the case (a case's branches take no arguments), so moved before it
they compute the same values; a select returns, element for element, one of its operands' values
unchanged, the one of the branch the case runs (branch 1 for any index but 0, as ``stablehlo.case``
runs its last branch for an index out of range). What it costs: the branch not taken runs too, ops
that each read and write their operands once, no matrix product, sort, gather, scatter, loop or call
of another kind. The pass runs as roll-layers' first step and as ``cond-to-select`` on its own.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from .functions import callee, main_func
from .matchers import ELEMENTWISE, producer
from .module_pass import ModulePass

# ops that read and write each element a bounded number of times, with no effect
CHEAP = ELEMENTWISE | frozenset(f"stablehlo.{n}" for n in (
    "constant iota broadcast_in_dim reshape slice concatenate pad dynamic_slice reduce return").split())


def cheap(op: ir.Operation, known: dict) -> bool:
    """Whether `op` and the ops in its regions are all `CHEAP`, or calls of functions whose ops are
    (`known`: function name -> answer, filled as they are read)."""
    if op.name == func.CallOp.OPERATION_NAME:
        name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        if name not in known:
            known[name] = False      # a recursive call is not cheap
            known[name] = all(cheap(o.operation, known) for o in callee(op.opview).body.blocks[0].operations)
        return known[name]
    if op.name == func.ReturnOp.OPERATION_NAME:
        return True
    return op.name in CHEAP and all(cheap(o.operation, known) for r in op.regions for b in r.blocks
                                    for o in b.operations)


@dataclass
class _Selected:
    """One case made selects, and what `Selects.undo` needs to put it back as it was."""
    location: ir.Location
    index: ir.Value
    types: list
    attributes: list                   # (name, attribute) of the case
    branches: list                     # per branch: the ops moved out of it, its return op's location
    returned: list                     # per branch: the values it returned
    made: list                         # the ops built where the case stood: the index's test, then `selects`
    selects: list                      # per result, the select that stands for it


class Selects:
    """Each two-way case in `main`'s block whose branches are `cheap` and return a value of their own for each
    result (not both the same one), rewritten as selects, first to last; `undo` puts them back (roll-layers
    keeps them only where layers roll). A select stands for each result, so `undo` finds every use of a
    result as its select's uses, also where a later case's branch returned it."""

    def __init__(self, main: func.FuncOp):
        known: dict = {}
        self.done = [_to_selects(op) for op in [view.operation for view in main.body.blocks[0].operations]
                     if op.name == "stablehlo.case" and len(op.regions) == 2 and len(op.results) > 0
                     and all(isinstance(r.type, ir.RankedTensorType) for r in op.results)
                     and all(cheap(o.operation, known) for r in op.regions for o in r.blocks[0].operations)
                     and all(a != b for a, b in zip(*(_returned(r) for r in op.regions)))]

    def __len__(self) -> int:
        return len(self.done)

    def held(self) -> frozenset:
        """The ops `undo` reads again (no other rewrite may erase them): those it moves back into the branches,
        and those whose values a case read or returned."""
        values = [v for s in self.done for v in (s.index, *(v for found in s.returned for v in found))]
        return frozenset([op for s in self.done for ops, _ in s.branches for op in ops]
                         + [v.owner.operation for v in values if isinstance(v.owner, ir.OpView)])

    def undo(self) -> None:
        """Each case back where it stood, last first, its branches' ops back in it and its uses its results."""
        for s in reversed(self.done):
            case = stablehlo.CaseOp(s.types, s.index, 2, loc=s.location, ip=ir.InsertionPoint(s.made[0])).operation
            for name, attr in s.attributes:
                case.attributes[name] = attr
            for region, (ops, where), values in zip(case.regions, s.branches, s.returned):
                block = region.blocks.append()
                for op in ops:
                    block.append(op)
                stablehlo.ReturnOp(values, loc=where, ip=ir.InsertionPoint(block))
            for select, result in zip(s.selects, case.results):
                select.result.replace_all_uses_with(result)
            for op in reversed(s.made):
                op.erase()
        self.done = []


def _returned(region: ir.Region) -> list:
    """The values `region`'s block returns."""
    return list(list(region.blocks[0].operations)[-1].operands)


def _moved_out(region: ir.Region, case: ir.Operation) -> tuple:
    """((the ops of `region`'s block, moved before `case`, its return's location), the values it returns).
    No reference to the return op outlives this call: erasing the case frees it."""
    ops = [view.operation for view in region.blocks[0].operations]
    for inner in ops[:-1]:
        inner.move_before(case)
    return (ops[:-1], ops[-1].location), list(ops[-1].operands)


def _to_selects(case: ir.Operation) -> _Selected:
    branches, returned = zip(*[_moved_out(region, case) for region in case.regions])
    made: list = []
    index = case.operands[0]
    with ir.InsertionPoint(case), case.location:
        convert = producer(index, stablehlo.ConvertOp)
        if convert is not None and ir.RankedTensorType(convert.operands[0].type).element_type == ir.IntegerType.get_signless(1):
            one = convert.operands[0]
        else:
            zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                index.type, ir.IntegerAttr.get(ir.RankedTensorType(index.type).element_type, 0)))
            test = stablehlo.CompareOp(index, zero.result, stablehlo.ComparisonDirectionAttr.get("NE"))
            made += [zero.operation, test.operation]
            one = test.result
        selects = [stablehlo.SelectOp(one, second, first).operation for first, second in zip(*returned)]
    for r, select in zip(case.results, selects):
        r.replace_all_uses_with(select.result)
    attrs = case.attributes
    selected = _Selected(case.location, index, [r.type for r in case.results],
                         [(attrs[i].name, attrs[i].attr) for i in range(len(attrs))], list(branches),
                         list(returned), made + selects, selects)
    case.erase()
    return selected


@dataclass(frozen=True)
class CondToSelect(ModulePass):
    """Examples:
        >>> from loopfuse.compile.mlir_context import parse_module
        >>> from loopfuse.compile.pass_manager import run_pass
        >>> from loopfuse.passes import CondToSelect
        >>> m = parse_module('''
        ... func.func @main(%p: tensor<i1>, %x: tensor<4xf32>) -> tensor<4xf32> {
        ...   %i = stablehlo.convert %p : (tensor<i1>) -> tensor<i32>
        ...   %r = "stablehlo.case"(%i) ({
        ...     stablehlo.return %x : tensor<4xf32>
        ...   }, {
        ...     %y = stablehlo.negate %x : tensor<4xf32>
        ...     stablehlo.return %y : tensor<4xf32>
        ...   }) : (tensor<i32>) -> tensor<4xf32>
        ...   return %r : tensor<4xf32>
        ... }''')
        >>> run_pass(m, CondToSelect())
        >>> print(str(m).count("stablehlo.case"), str(m).count("stablehlo.select"))
        0 1
    """

    name = "cond-to-select"
    summary = "Run both branches of a two-way case of cheap ops and select their results"

    def apply(self, module_op: ir.Operation) -> None:
        converts: list = []        # a lax.cond's index, converted from its boolean (a cond and its transpose share it)
        for s in Selects(main_func(module_op)).done:
            if (op := producer(s.index, stablehlo.ConvertOp)) is not None and not any(op == c for c in converts):
                converts.append(op)
        for op in converts:
            if not any(True for _ in op.result.uses):
                op.erase()
