// RUN: not loopfuse-opt %s --alias-state 2>&1 | filecheck %s
// A parse error names the file, line and column of the bad token.
// CHECK: opt_errors.mlir:7:24: error: expected ','
func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  // the next line is missing a comma
  %1 = stablehlo.add %0 %a : tensor<2xf32>
  return %1 : tensor<2xf32>
}
