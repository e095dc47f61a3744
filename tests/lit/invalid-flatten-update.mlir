// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(flatten-update{min-group=1})' 2>&1 | filecheck --check-prefix=MIN %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(flatten-update{min_group=3})' 2>&1 | filecheck --check-prefix=NAME %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(flatten-update)' 2>&1 | filecheck %s
// Options are checked before the input is read; a module without @main is an error at the module.
// MIN: loopfuse-opt: error: pass 'flatten-update' option 'min-group': must be >= 2, got 1
// NAME: loopfuse-opt: error: pass 'flatten-update' option 'min_group': no such option (options of flatten-update: min-group)
// CHECK: invalid-flatten-update.mlir:[[# @LINE + 1]]:1: error: pass 'flatten-update' failed: module has no func.func @main
module @no_main {
  func.func @step(%a: tensor<2xf32>) -> tensor<2xf32> {
    return %a : tensor<2xf32>
  }
}
