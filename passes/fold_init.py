"""start the program from its initial state computed inside it.

Rewrites: a module holding a private ``@loopfuse_init(x..., batch...) -> state`` (the tracer puts it there
for `Step.loop(..., init=...)`) and an ``@main(state..., batch...)`` whose first arguments are the state's
(tagged ``loopfuse.state``). ``@main``'s body moves to a private ``@loopfuse_run``, its argument attributes
dropped (an alias of a state argument to a result means nothing once the state is made inside); ``@main``
becomes ``@loopfuse_run(@loopfuse_init(x..., batch...), batch...)``: it takes the init's arguments (their
attributes kept) and returns what ``@main`` returned (their attributes kept). A module without
``@loopfuse_init`` is left as it is.

Why it is safe: ``@main`` computes exactly what calling the init program, then the loop on its result,
computes: the same functions on the same values (XLA inlines the calls). Nothing the caller passes is
donated: the new ``@main``'s arguments carry no alias, so the caller's `x` stays valid. Refused (a
`PassError`) where the roles do not line up: the init's results not the state arguments' types in order, the
batch arguments not the init's last ones, or an argument of ``@main`` that is neither (an effect token, a
step index, a stopped flag).
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from .functions import arg_attrs, main_func, module_functions, result_attrs, set_arg_attrs, set_result_attrs
from .module_pass import ModulePass, PassError
from .vocabulary import INIT, RUN, STATE


@dataclass(frozen=True)
class FoldInit(ModulePass):
    name = "fold-init"
    summary = "Take the init's arguments: compute the initial state inside the program (@loopfuse_init)"
    after_wrap_loop = True

    def apply(self, module_op: ir.Operation) -> None:
        init = next((f for f in module_functions(module_op) if f.sym_name.value == INIT), None)
        if init is None:
            return
        main = main_func(module_op)
        args, in_types = arg_attrs(main), list(main.type.inputs)
        n_state = sum(STATE in a for a in args)
        if n_state == 0 or any(STATE in a for a in args[n_state:]):
            raise PassError(main, "@main takes no state, or not first")
        state_types, batch_types = in_types[:n_state], in_types[n_state:]
        init_in, init_out = list(init.type.inputs), list(init.type.results)
        if init_out != state_types:
            raise PassError(init, f"@{INIT} returns {_types(init_out)}, not @main's state arguments "
                                  f"{_types(state_types)}")
        if len(init_in) < len(batch_types) or init_in[len(init_in) - len(batch_types):] != batch_types:
            raise PassError(init, f"@{INIT}'s last arguments {_types(init_in)} are not @main's "
                                  f"arguments after the state {_types(batch_types)}")
        results = result_attrs(main)
        _move_body(main)
        n_x = len(init_in) - len(batch_types)
        with ir.InsertionPoint(main.operation), main.location:
            new = func.FuncOp("main", (init_in, list(main.type.results)))
        block = new.add_entry_block()
        with ir.InsertionPoint(block), main.location:
            x = list(block.arguments)
            state = func.CallOp(init_out, ir.FlatSymbolRefAttr.get(INIT), x).results
            out = func.CallOp(list(main.type.results), ir.FlatSymbolRefAttr.get(RUN), [*state, *x[n_x:]]).results
            func.ReturnOp(out)
        set_arg_attrs(new, arg_attrs(init)[:n_x] + args[n_state:])
        set_result_attrs(new, results)


def _move_body(main: func.FuncOp) -> None:
    """Make ``@main`` the private ``@loopfuse_run``, without argument or result attributes."""
    main.attributes["sym_name"] = ir.StringAttr.get(RUN)
    main.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for name in ("arg_attrs", "res_attrs"):
        if name in main.attributes:
            del main.attributes[name]


def _types(types: list) -> str:
    return "(" + ", ".join(map(str, types)) + ")"
