"""alias-state: update the optimization state in place.

Rewrites: every argument of ``@main`` tagged ``loopfuse.state = "<leaf path>"`` whose path and
type match a result tagged with the same ``loopfuse.state`` gets ``tf.aliasing_output = <result
index>``; XLA then writes that result into the argument's buffer (params and optimizer state
are updated in place, the step allocates no second copy of the state). A state argument with no
matching result becomes a ``jax.buffer_donor`` so XLA may reuse it for any output.

Why it is safe: aliasing never changes values. XLA's copy insertion adds a copy whenever the
argument is still read after the aliased result is written, and the runtime donates only
arguments the caller handed over (``donate=True``) and never reads them again.
Arguments that already carry an alias or donor attribute, and non-tensor ones (effect tokens),
are left alone.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir

from .functions import arg_attrs, main_func, result_attrs, set_arg_attrs, string_attr
from .module_pass import ModulePass
from .vocabulary import ALIAS, DONOR, STATE


@dataclass(frozen=True)
class AliasState(ModulePass):
    name = "alias-state"
    summary = "Update the state in place: alias each state argument to its result, donate the rest"

    def apply(self, module_op: ir.Operation) -> None:
        f = main_func(module_op)
        args, results = arg_attrs(f), result_attrs(f)
        outputs: dict[str, int] = {}
        for j, attrs in enumerate(results):
            path = string_attr(attrs, STATE)
            if path is not None:
                outputs[path] = j
        taken = {ir.IntegerAttr(a[ALIAS]).value for a in args if ALIAS in a}
        i32 = ir.IntegerType.get_signless(32)
        in_types, out_types = list(f.type.inputs), list(f.type.results)
        for i, attrs in enumerate(args):
            path = string_attr(attrs, STATE)
            if path is None or ALIAS in attrs or DONOR in attrs or not isinstance(in_types[i], ir.RankedTensorType):
                continue  # (an effect token is carried state but has no buffer to reuse)
            out = outputs.get(path)
            if out is not None and out not in taken and in_types[i] == out_types[out]:
                attrs[ALIAS] = ir.IntegerAttr.get(i32, out)
                taken.add(out)
            else:
                attrs[DONOR] = ir.BoolAttr.get(True)
        set_arg_attrs(f, args)
