"""IR helpers shared by the pass tests: the StableHLO reference interpreter and op counts."""
from collections import Counter

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects.stablehlo import eval_module


def interpret(module: ir.Module, args: list) -> list[np.ndarray]:
    """Run `@main` of `module` on numpy `args` with the StableHLO reference interpreter."""
    with module.context:
        return [np.array(r) for r in eval_module(module, [ir.DenseElementsAttr.get(np.asarray(a)) for a in args])]


def op_counts(module: ir.Module) -> Counter:
    """How many ops of each name the module holds (nested regions included)."""
    counts = Counter()

    def visit(op):
        counts[op.name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


def concatenates(module: ir.Module) -> tuple[int, int]:
    """(how many concatenate trees the module holds: concatenates whose result no concatenate reads,
    the most operands of one concatenate)."""
    concats = []

    def visit(op):
        if op.name == "stablehlo.concatenate":
            concats.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    roots = [c for c in concats if all(u.owner.name != "stablehlo.concatenate" for u in c.result.uses)]
    return len(roots), max((len(c.operands) for c in concats), default=0)
