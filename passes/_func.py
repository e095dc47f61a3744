"""Small helpers over func.func signatures shared by the passes (no rewriting logic here)."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy, stablehlo

from .module_pass import PassError


def main_func(module_op: ir.Operation) -> func.FuncOp:
    """The public entry function `@main` of a module."""
    for op in module_op.regions[0].blocks[0].operations:
        if isinstance(op, func.FuncOp) and op.sym_name.value == "main":
            return op
    raise PassError(module_op, "module has no func.func @main")


def _dicts(array_attr, n: int) -> list[dict]:
    if array_attr is None:
        return [{} for _ in range(n)]
    # DictAttr iterates by __len__/__getitem__; its stub declares no __iter__
    return [{a.name: a.attr for a in ir.DictAttr(d)} for d in array_attr]  # type: ignore[attr-defined]


def arg_attrs(f: func.FuncOp) -> list[dict]:
    """Per-argument attribute dicts (name -> Attribute)."""
    return _dicts(f.arg_attrs if "arg_attrs" in f.attributes else None, len(f.type.inputs))


def result_attrs(f: func.FuncOp) -> list[dict]:
    """Per-result attribute dicts (name -> Attribute)."""
    return _dicts(f.result_attrs if "res_attrs" in f.attributes else None, len(f.type.results))


def _array(dicts: list[dict]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DictAttr.get(d) for d in dicts])


def set_arg_attrs(f: func.FuncOp, dicts: list[dict]) -> None:
    f.arg_attrs = _array(dicts)


def set_result_attrs(f: func.FuncOp, dicts: list[dict]) -> None:
    f.result_attrs = _array(dicts)


def return_op(f: func.FuncOp) -> ir.Operation:
    ops = f.body.blocks[0].operations
    return ops[len(ops) - 1].operation


def set_signature(f: func.FuncOp, results: list[ir.Value], attrs: list[dict]) -> None:
    """Make `f` return `results` with result attributes `attrs`, updating the function type."""
    ret = return_op(f)
    with ir.InsertionPoint(ret), ret.location:
        func.ReturnOp(results)
    ret.erase()
    f.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(f.type.inputs), [v.type for v in results]))
    set_result_attrs(f, attrs)


def string_attr(d: dict, name: str) -> str | None:
    """The value of a string attribute in an attr dict, or None."""
    a = d.get(name)
    return ir.StringAttr(a).value if a is not None else None


_EFFECTFUL = (
    func.ReturnOp, stablehlo.ReturnOp, stablehlo.CustomCallOp, stablehlo.SendOp, stablehlo.RecvOp,
    stablehlo.OutfeedOp, stablehlo.InfeedOp, stablehlo.AfterAllOp, stablehlo.AllReduceOp,
    stablehlo.AllGatherOp, stablehlo.AllToAllOp, stablehlo.CollectivePermuteOp,
    stablehlo.ReduceScatterOp, stablehlo.RngBitGeneratorOp, sdy.ShardingConstraintOp)
_PURE_DIALECTS = ("stablehlo", "chlo")  # apart from _EFFECTFUL, their ops only compute their results


def has_side_effects(op: ir.Operation, pure_callees=frozenset()) -> bool:
    """Conservative: ops that must survive even when their results are unused."""
    view = op.opview
    if isinstance(view, func.CallOp):
        return view.callee.value not in pure_callees
    return isinstance(view, _EFFECTFUL) or op.name.split(".", 1)[0] not in _PURE_DIALECTS


def pure_callees(module_op: ir.Operation) -> frozenset:
    """Names of private functions whose bodies (regions included) contain no effectful op."""
    pure = set()
    for f in module_op.regions[0].blocks[0].operations:
        if not isinstance(f, func.FuncOp) or f.sym_name.value == "main":
            continue
        effectful = []

        def visit(op):
            if not isinstance(op.opview, (func.FuncOp, func.ReturnOp)) and has_side_effects(op.operation):
                effectful.append(op.name)
                return ir.WalkResult.INTERRUPT
            return ir.WalkResult.ADVANCE

        f.operation.walk(visit)
        if not effectful:
            pure.add(f.sym_name.value)
    return frozenset(pure)


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
