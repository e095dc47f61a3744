// RUN: not loopfuse-opt %s --alias-state 2>&1 | filecheck %s
// An implicit module has no line of its own: an error at it names the input's first line.
// CHECK: invalid-alias-state.mlir:1: error: pass 'alias-state' failed: module has no func.func @main
func.func @step(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
