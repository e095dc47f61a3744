"""passes/dataflow.py: the view forgets the values of the ops it erases, so a value built after them
(MLIR reuses their memory, and an `ir.Value` compares by address) is not taken for one of them."""
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from loopfuse.compile.mlir_context import parse_module
from loopfuse.passes.dataflow import Dataflow
from loopfuse.passes.dead_code import pure_callees
from loopfuse.passes.functions import main_func

TWICE = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %x, %x : tensor<4xf32>
  %1 = stablehlo.add %x, %x : tensor<4xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}"""


def _built_before_return(block: ir.Block) -> ir.Value:
    """A new add of the block's argument, built where the erased ones were."""
    with ir.InsertionPoint(list(block.operations)[-1]), ir.Location.unknown():
        return stablehlo.AddOp(block.arguments[0], block.arguments[0]).result


def test_a_value_built_after_a_merge_is_not_the_merged_one():
    module = parse_module(TWICE)
    with module.context:
        block = main_func(module.operation).body.blocks[0]
        g = Dataflow.of(block, pure_callees(module.operation))
        (op, same), = g.merged
        merged = op.results[0]
        assert g.id_of[merged] == same[0]           # read as the first add, until merged
        g.merge()
        assert merged not in g.id_of
        assert g.id_of.get(_built_before_return(block)) is None
        product, = [o for o in block.operations if o.name == "stablehlo.multiply"]
        assert product.operands[0] == product.operands[1] == g.values[same[0]]


def test_a_value_built_after_an_erase_is_not_the_erased_one():
    module = parse_module(TWICE)
    with module.context:
        block = main_func(module.operation).body.blocks[0]
        g = Dataflow.of(block)
        product = g.ops[2]
        product.results[0].replace_all_uses_with(g.values[g.results[0][0]])
        g.erase(product)
        assert g.id_of.get(_built_before_return(block)) is None
        assert g.id_of[block.arguments[0]] == 0 and g.id_of[g.values[g.results[1][0]]] == g.results[1][0]
