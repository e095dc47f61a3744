"""drop-unused-outputs: stop computing results nobody asked for.

Rewrites: results of ``@main`` tagged ``loopfuse.unused`` (for example gradients or metrics the
caller did not request) are removed from the signature, then every side-effect-free op whose
values are no longer used is erased (calls too, when the callee is free of effects), so the
work that only fed those results disappears. ``tf.aliasing_output`` indices on arguments are renumbered to the surviving results; an alias
to a removed result becomes ``jax.buffer_donor``.

Why it is safe: the remaining results are computed by the same ops as before; only ops with no
remaining users and no side effects (no custom calls, collectives, I/O, calls to effectful
functions) are erased.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir

from .dead_code import erase_dead_ops, pure_callees
from .functions import arg_attrs, last_op, main_func, result_attrs, set_arg_attrs, set_signature
from .module_pass import ModulePass
from .vocabulary import ALIAS, DONOR, UNUSED


@dataclass(frozen=True)
class DropUnusedOutputs(ModulePass):
    name = "drop-unused-outputs"
    summary = "Remove the results tagged loopfuse.unused and the work that only fed them"

    def apply(self, module_op: ir.Operation) -> None:
        f = main_func(module_op)
        attrs = result_attrs(f)
        keep = [j for j, a in enumerate(attrs) if UNUSED not in a]
        if len(keep) == len(attrs):
            return
        values = list(last_op(f.body.blocks[0]).operands)
        set_signature(f, [values[j] for j in keep], [attrs[j] for j in keep])
        renumber = {old: new for new, old in enumerate(keep)}
        args = arg_attrs(f)
        i32 = ir.IntegerType.get_signless(32)
        for a in args:
            if ALIAS in a:
                old = ir.IntegerAttr(a.pop(ALIAS)).value
                if old in renumber:
                    a[ALIAS] = ir.IntegerAttr.get(i32, renumber[old])
                else:
                    a[DONOR] = ir.BoolAttr.get(True)
        set_arg_attrs(f, args)
        erase_dead_ops(f.body.blocks[0], pure_callees(module_op))
