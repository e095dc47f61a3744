"""The functions of a module and the blocks of their bodies: finding a function (by symbol, the one
a call calls, ``@main``), a block's last op, and a function's argument and result attributes and
signature. Shared by the passes and by loopfuse's tracer and runtime (no rewriting logic here)."""
from collections.abc import Iterator

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from .module_pass import PassError


def module_functions(module_op: ir.Operation) -> Iterator[func.FuncOp]:
    """The `func.func`s of a module, in order."""
    return (op for op in module_op.regions[0].blocks[0].operations if isinstance(op, func.FuncOp))


def find_function(module_op: ir.Operation, name: str) -> func.FuncOp | None:
    """The function `@name` of a module, or None."""
    return next((f for f in module_functions(module_op) if f.sym_name.value == name), None)


def function(module_op: ir.Operation, name: str) -> func.FuncOp:
    """The function `@name` of a module (a PassError when it has none)."""
    f = find_function(module_op, name)
    if f is None:
        raise PassError(module_op, f"module has no func.func @{name}")
    return f


def erase_uncalled(module_op: ir.Operation, names: set[str]) -> None:
    """Erase the private functions named `names` that no call in the module calls any more (after inlining)."""
    called: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        if isinstance(op.opview, func.CallOp):
            called.add(op.opview.callee.value)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    for f in list(module_functions(module_op)):
        if f.sym_name.value in names - called:
            f.operation.erase()


def main_func(module_op: ir.Operation) -> func.FuncOp:
    """The public entry function `@main` of a module."""
    return function(module_op, "main")


def callee(call: func.CallOp) -> func.FuncOp:
    """The function `call` calls, in the module that holds the call."""
    return function(enclosing_module(call.operation), call.callee.value)


def enclosing_module(op: ir.Operation) -> ir.Operation:
    """The ``builtin.module`` that holds `op`."""
    while op.name != "builtin.module":
        parent = op.parent
        if parent is None:
            raise PassError(op, f"{op.name} is not inside a module")
        op = parent
    return op


def last_op(block: ir.Block) -> ir.Operation:
    """The last op of `block` (its terminator: a function body's return)."""
    ops = block.operations
    return ops[len(ops) - 1].operation


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


def set_signature(f: func.FuncOp, results: list[ir.Value], attrs: list[dict]) -> None:
    """Make `f` return `results` with result attributes `attrs`, updating the function type."""
    ret = last_op(f.body.blocks[0])
    with ir.InsertionPoint(ret), ret.location:
        func.ReturnOp(results)
    ret.erase()
    f.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(f.type.inputs), [v.type for v in results]))
    set_result_attrs(f, attrs)


def retype(f: func.FuncOp) -> None:
    """Set `f`'s function type to its entry block's argument types and the types its return returns."""
    entry = f.body.blocks[0]
    f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in entry.arguments], [v.type for v in last_op(entry).operands]))


def make_private(f: func.FuncOp, name: str) -> None:
    """Make `f` the private function `@name`, without argument or result attributes (a callee's)."""
    f.attributes["sym_name"] = ir.StringAttr.get(name)
    f.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for attr in ("arg_attrs", "res_attrs"):
        if attr in f.attributes:
            del f.attributes[attr]


def string_attr(d: dict, name: str) -> str | None:
    """The value of a string attribute in an attr dict, or None; a PassError where it is not a string."""
    a = d.get(name)
    if a is None:
        return None
    try:
        return ir.StringAttr(a).value
    except ValueError:
        raise PassError(None, f"attribute {name} = {a} must be a string") from None
