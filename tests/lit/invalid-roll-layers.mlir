// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{memory-budget=1.5})' 2>&1 | filecheck --check-prefix=BUDGET %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{memory-budget=all})' 2>&1 | filecheck --check-prefix=TYPE %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{memory-budget=nan})' 2>&1 | filecheck --check-prefix=NAN %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{min-layers=1})' 2>&1 | filecheck --check-prefix=LAYERS %s
// RUN: loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers)' | filecheck %s
// Bad options are refused before any parsing, with one message naming the pass and the option.
// BUDGET: loopfuse-opt: error: pass 'roll-layers' option 'memory-budget': must be <= 1.0, got 1.5
// TYPE: loopfuse-opt: error: pass 'roll-layers' option 'memory-budget': expects float, got 'all'
// NAN: loopfuse-opt: error: pass 'roll-layers' option 'memory-budget': expects a number, got nan
// LAYERS: loopfuse-opt: error: pass 'roll-layers' option 'min-layers': must be >= 2, got 1

// A step without alike layers is left exactly as it is; the report says why.
// CHECK: module attributes {"loopfuse.report.roll-layers" = "no run of alike layers: no state leaves differ only in one index or key"}
// CHECK-NEXT: func.func @main(%arg0: tensor<2xf32> {loopfuse.state = "['w']"}, %arg1: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.state = "['w']"}) {
// CHECK-NEXT: %0 = stablehlo.multiply %arg0, %arg1 : tensor<2xf32>
// CHECK-NEXT: %1 = stablehlo.multiply %arg0, %arg1 : tensor<2xf32>
// CHECK-NEXT: %2 = stablehlo.add %0, %1 : tensor<2xf32>
// CHECK-NEXT: return %2 : tensor<2xf32>
func.func @main(%w: tensor<2xf32> {loopfuse.state = "['w']"}, %x: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.state = "['w']"}) {
  %0 = stablehlo.multiply %w, %x : tensor<2xf32>
  %1 = stablehlo.multiply %w, %x : tensor<2xf32>
  %2 = stablehlo.add %0, %1 : tensor<2xf32>
  return %2 : tensor<2xf32>
}
