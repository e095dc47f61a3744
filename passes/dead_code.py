"""Which ops have effects, and erasing the ops whose results nobody reads (shared by the passes)."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy, stablehlo

from .functions import module_functions

_EFFECTFUL = frozenset(c.OPERATION_NAME for c in (
    func.ReturnOp, stablehlo.ReturnOp, stablehlo.CustomCallOp, stablehlo.SendOp, stablehlo.RecvOp,
    stablehlo.OutfeedOp, stablehlo.InfeedOp, stablehlo.AfterAllOp, stablehlo.AllReduceOp,
    stablehlo.AllGatherOp, stablehlo.AllToAllOp, stablehlo.CollectivePermuteOp,
    stablehlo.ReduceScatterOp, stablehlo.RngBitGeneratorOp, sdy.ShardingConstraintOp))
_PURE_DIALECTS = ("stablehlo", "chlo")  # apart from _EFFECTFUL, their ops only compute their results


def has_side_effects(op: ir.Operation, pure_callees=frozenset()) -> bool:
    """Conservative: ops that must survive even when their results are unused."""
    name = op.name
    if name == func.CallOp.OPERATION_NAME:
        return ir.FlatSymbolRefAttr(op.attributes["callee"]).value not in pure_callees
    return name in _EFFECTFUL or name.split(".", 1)[0] not in _PURE_DIALECTS


def pure_callees(module_op: ir.Operation) -> frozenset:
    """Names of private functions whose bodies (regions included) contain no effectful op."""
    return frozenset(f.sym_name.value for f in module_functions(module_op)
                     if f.sym_name.value != "main" and first_effect(f.operation) is None)


def first_effect(op: ir.Operation, pure_callees=frozenset()) -> ir.Operation | None:
    """The first of `op` and the ops nested in it (at any depth) with side effects (`has_side_effects`,
    calls of `pure_callees` free of them), terminators and function definitions aside; None where none has."""
    found: list = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if inner.name not in _STRUCTURE and has_side_effects(inner, pure_callees):
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return found[0] if found else None


_STRUCTURE = (func.FuncOp.OPERATION_NAME, func.ReturnOp.OPERATION_NAME, stablehlo.ReturnOp.OPERATION_NAME)


def is_dead(op: ir.Operation, pure=frozenset()) -> bool:
    """No result of `op` is used and erasing it has no effect (see `has_side_effects`)."""
    return not any(True for r in op.results for _ in r.uses) and not has_side_effects(op, pure)


def erase_dead_ops(block: ir.Block, pure=frozenset()) -> int:
    """Erase side-effect-free ops whose results are unused, back to front; returns how many.

    `pure` names callees whose `func.call`s count as side-effect free (see `pure_callees`).
    """
    erased = 0
    for view in reversed(list(block.operations)):
        op = view.operation
        if not is_dead(op, pure):
            continue
        op.erase()
        erased += 1
    return erased
