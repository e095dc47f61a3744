"""fold-init: start the program from its initial state computed inside it.

Rewrites: a module holding ``@loopfuse_init(x..., batch...) -> state`` (the tracer puts it there, public so
that no pass before this one drops it as unused, for `Step.loop(..., init=...)`) and an ``@main(state...,
batch...)`` whose first arguments are the state's (tensors tagged ``loopfuse.state``). ``@main``'s body
moves to a private ``@loopfuse_run``, its argument attributes dropped (an alias of a state argument to a
result means nothing once the state is made inside); ``@loopfuse_init`` becomes private; ``@main`` becomes
``@loopfuse_run(optimization_barrier(@loopfuse_init(x..., batch...)), batch...)``: it takes the init's
arguments (their attributes kept) and returns what ``@main`` returned (their attributes kept).

Why it is safe: ``@main`` computes what calling the init's program, then the loop's on its result, computes:
the same functions on the same values (XLA inlines the calls). The barrier keeps it so: without it XLA sees
the initial state, and a leaf that the init makes a constant and the loop never changes (a hyperparameter
kept in an optimizer's state) would be folded into the loop's arithmetic (``w / c`` become ``w * (1 / c)``:
other last bits than the loop run on a state passed in). Nothing the caller passes is donated: the new
``@main``'s arguments carry no alias, so the caller's `x` stays valid. Refused (a `PassError`) where the
roles do not line up: no ``@loopfuse_init``, a state argument that is no tensor (an effect token), a step
index or a stopped flag, the init's results not the state arguments' types in order, or the batch arguments
not the init's last ones.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from .functions import (arg_attrs, find_function, main_func, make_private, result_attrs, set_arg_attrs,
                        set_result_attrs)
from .module_pass import ModulePass, PassError
from .vocabulary import INIT, RUN, STATE, STEP_INDEX, STOPPED


@dataclass(frozen=True)
class FoldInit(ModulePass):
    name = "fold-init"
    summary = "Take the init's arguments: compute the initial state inside the program (@loopfuse_init)"
    after_wrap_loop = True

    def apply(self, module_op: ir.Operation) -> None:
        init = find_function(module_op, INIT)
        main = main_func(module_op)
        if init is None:
            raise PassError(main, f"the module has no @{INIT} to start from (a pass before fold-init removed it?)")
        args, in_types = arg_attrs(main), list(main.type.inputs)
        n_state = sum(STATE in a for a in args)
        _check_arguments(main, args, in_types, n_state)
        state_types, batch_types = in_types[:n_state], in_types[n_state:]
        init_in, init_out = list(init.type.inputs), list(init.type.results)
        if init_out != state_types:
            raise PassError(init, f"@{INIT} returns {_types(init_out)}, not @main's state arguments "
                                  f"{_types(state_types)}")
        if len(init_in) < len(batch_types) or init_in[len(init_in) - len(batch_types):] != batch_types:
            raise PassError(init, f"@{INIT}'s last arguments {_types(init_in)} are not @main's "
                                  f"arguments after the state {_types(batch_types)}")
        n_x = len(init_in) - len(batch_types)
        results, x_attrs = result_attrs(main), arg_attrs(init)[:n_x]
        make_private(main, RUN)
        make_private(init, INIT)
        with ir.InsertionPoint(main.operation), main.location:
            new = func.FuncOp("main", (init_in, list(main.type.results)))
        block = new.add_entry_block()
        with ir.InsertionPoint(block), main.location:
            x = list(block.arguments)
            made = func.CallOp(init_out, ir.FlatSymbolRefAttr.get(INIT), x).results
            state = stablehlo.OptimizationBarrierOp(list(made)).results if made else []    # (a state of no leaves)
            out = func.CallOp(list(main.type.results), ir.FlatSymbolRefAttr.get(RUN), [*state, *x[n_x:]]).results
            func.ReturnOp(out)
        set_arg_attrs(new, x_attrs + args[n_state:])
        set_result_attrs(new, results)


def _check_arguments(main: func.FuncOp, args: list[dict], in_types: list, n_state: int) -> None:
    """A PassError unless ``@main`` takes its state tensors (if any) first, then the batch only."""
    if any(STATE in a for a in args[n_state:]):
        raise PassError(main, "@main does not take its state first")
    if not all(isinstance(t, ir.RankedTensorType) for t in in_types[:n_state]):
        raise PassError(main, "@main's state holds an effect token: a program with ordered effects cannot start "
                              "from its init")
    if any(STEP_INDEX in a or STOPPED in a for a in args):
        raise PassError(main, "@main takes a step index or a stopped flag: only a loop on a fixed batch that cannot "
                              "stop early starts from its init")


def _types(types: list) -> str:
    return "(" + ", ".join(map(str, types)) + ")"
