"""Where a module has control flow of its own: an analysis (it reads the module, never rewrites it).

`own_control_flow` lists every ``stablehlo.while``, ``stablehlo.case`` and ``stablehlo.if`` in
any function of a module, except the loop that wrap-loop builds (the ``stablehlo.while`` at the top
of ``@main`` whose body calls the step, ``@loopfuse_step``). The runtime uses it to decide where
XLA's region-analysis copy insertion may be turned on: that option is exact on straight-line steps
and on wrap-loop's loop around them, but it changed the results of programs with loops and
conditionals of their own (diffrax's ODE solves: a save loop nested in the step loop), so such a
program is compiled without it. So is a program that updates a tensor in place (`own_in_place_updates`:
a dynamic_update_slice or a scatter of its own), whose loop it changed too.

Why (XLA:CPU, read from its HLO): with region analysis, the copy of a value that a while loop only
reads becomes an ordering constraint ("overwrite it after the loop"). A small loop is then outlined
into an ``xla_cpu_small_call`` call and the constraint is dropped, so the overwrite can run first and
the loop reads the new value. That needs a loop of the program's own, nested in another loop or
reading a donated buffer (tests/py/corpus.py, ``region_analysis_triggers``). Conditionals never
triggered it; they are gated too, to be safe.

The runtime asks the traced module (the options are decided before the passes run, to look the
program up in the compile cache), so a pass that adds loops of the module's own says so
(`ModulePass.adds_control_flow`: roll-layers, whose loops read the donated stacked leaves); the
others add none besides wrap-loop's loop (with ``rows``, a loop over blocks of steps around a loop
over a block's steps).

Examples:
    >>> from loopfuse.compile.mlir_context import parse_module
    >>> m = parse_module('''
    ... func.func @main(%x: tensor<f32>) -> tensor<f32> {
    ...   %0 = stablehlo.while(%a = %x) : tensor<f32>
    ...     cond { %c = stablehlo.compare LT, %a, %a : (tensor<f32>, tensor<f32>) -> tensor<i1>
    ...            stablehlo.return %c : tensor<i1> }
    ...     do { stablehlo.return %a : tensor<f32> }
    ...   return %0 : tensor<f32>
    ... }''')
    >>> [op.name for op in own_control_flow(m.operation)]
    ['stablehlo.while']
"""
from collections.abc import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from .vocabulary import BODY

CONTROL_FLOW = ("stablehlo.while", "stablehlo.case", "stablehlo.if")


def own_control_flow(module_op: ir.Operation) -> list[ir.Operation]:
    """Every while/case/if op of the module (in walk order) but wrap-loop's own loop."""
    return _ops(module_op, lambda op: op.name in CONTROL_FLOW and not is_wrap_loop(op))


IN_PLACE = ("stablehlo.dynamic_update_slice", "stablehlo.scatter")


def own_in_place_updates(module_op: ir.Operation) -> list[ir.Operation]:
    """Every dynamic_update_slice and scatter of the module (in walk order) but those inside wrap-loop's loop
    (its histories' writes). Region analysis changed a straight-line step's loop with one: an in-place update
    of a value the step also reduces, two steps of it 1 ulp off both K jitted steps and jax.jit's scan with
    jaxlib 0.10 (tests/py/corpus.py, ``in_place_update``)."""
    return _ops(module_op, lambda op: op.name in IN_PLACE and not _in_wrap_loop(op))


def _ops(module_op: ir.Operation, wanted: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    """The ops of the module that are `wanted`, in walk order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if wanted(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    return found


def _in_wrap_loop(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if is_wrap_loop(parent):
            return True
        parent = parent.parent
    return False


def is_wrap_loop(op: ir.Operation) -> bool:
    """Whether `op` is the while that wrap-loop puts in @main: its body calls @loopfuse_step."""
    parent = op.parent.opview if op.parent is not None else None
    if op.name != "stablehlo.while" or not isinstance(parent, func.FuncOp) or parent.sym_name.value != "main":
        return False
    return any(isinstance(o, func.CallOp) and o.callee.value == BODY for o in op.regions[1].blocks[0].operations)


def describe(op: ir.Operation) -> str:
    """``stablehlo.while at <location>`` for messages."""
    return f"{op.name} at {op.location}"
