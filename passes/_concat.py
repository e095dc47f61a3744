"""Wide concatenates as trees of narrow ones, as ``jnp.concatenate`` builds them.

XLA compiles a ``stablehlo.concatenate`` of hundreds of operands more slowly than a tree of
concatenates of at most 16 operands each, the shape ``jnp.concatenate`` (and so a hand-written
``ravel_pytree`` program) gives it. Exact: a concatenate of concatenates puts every element where
the wide one puts it.
"""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

FAN_IN = 16  # operands per concatenate: jax.numpy.concatenate's chunk


def concat_tree(values: list[ir.Value], dim: int) -> ir.Value:
    """`values` concatenated along `dim` as a tree: concatenates of `FAN_IN` consecutive values, then
    of those, up to one at the root (the one value itself)."""
    while len(values) > 1:
        values = [chunk[0] if len(chunk := values[i:i + FAN_IN]) == 1 else stablehlo.ConcatenateOp(chunk, dim).result
                  for i in range(0, len(values), FAN_IN)]
    return values[0]


def split_wide_concatenates(block: ir.Block) -> None:
    """Replace each concatenate of more than `FAN_IN` operands in `block` (not in nested regions) by
    its `concat_tree`."""
    for op in [op.operation for op in block.operations]:
        if not isinstance(op.opview, stablehlo.ConcatenateOp) or len(op.operands) <= FAN_IN:
            continue
        with ir.InsertionPoint(op), op.location:
            root = concat_tree(list(op.operands), ir.IntegerAttr(op.attributes["dimension"]).value)
        op.result.replace_all_uses_with(root)
        op.erase()
