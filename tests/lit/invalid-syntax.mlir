// RUN: not loopfuse-opt %s --alias-state 2>&1 | filecheck %s
// RUN: not loopfuse-opt %s --split-input-file --alias-state 2>&1 | filecheck --check-prefix=SPLIT %s
// A parse error names the file, line and column of the bad token, counted in the whole file also
// when chunks are split at '// -----' lines followed by blank lines.
// CHECK: invalid-syntax.mlir:[[# @LINE + 4]]:24: error: expected ','
func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  // the next line is missing a comma
  %1 = stablehlo.add %0 %a : tensor<2xf32>
  return %1 : tensor<2xf32>
}
// SPLIT: invalid-syntax.mlir:[[# @LINE - 3]]:24: error: expected ','

// -----


// SPLIT: invalid-syntax.mlir:[[# @LINE + 3]]:24: error: expected ','
func.func @other(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  %1 = stablehlo.add %0 %a : tensor<2xf32>
  return %1 : tensor<2xf32>
}
