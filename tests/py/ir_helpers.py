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
