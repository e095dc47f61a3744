// RUN: not loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(micro-batch{slices=3})' 2>&1 | filecheck %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(micro-batch{slices=0})' 2>&1 | filecheck --check-prefix=ZERO %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(micro-batch{slices=two})' 2>&1 | filecheck --check-prefix=TYPE %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(micro-batch{slice=2})' 2>&1 | filecheck --check-prefix=NAME %s
// Bad options are refused before any parsing, with one message naming the pass and the option; a
// batch whose rows do not divide into the slices (on each device) is an error at @main's location
// naming the argument, or the op that reads a Dataset's batch.
// ZERO: loopfuse-opt: error: pass 'micro-batch' option 'slices': must be >= 1, got 0
// TYPE: loopfuse-opt: error: pass 'micro-batch' option 'slices': expects int, got 'two'
// NAME: loopfuse-opt: error: pass 'micro-batch' option 'slice': no such option (options of micro-batch: slices)

// CHECK: invalid-micro-batch.mlir:[[# @LINE + 1]]:1: error: pass 'micro-batch{slices=3}' failed: batch argument 1 (tensor<8x3xf32>) has 8 rows along dim 0, which do not divide into 3 slices
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// 6 rows divide into 3 slices, but not on each of 6 devices (1 row each).
// CHECK: invalid-micro-batch.mlir:[[# @LINE + 1]]:1: error: pass 'micro-batch{slices=3}' failed: batch argument 1 (tensor<6x3xf32>) has 6 rows along dim 0, which do not divide into 3 slices on each of 6 devices
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<6x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<6x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}
sdy.mesh @mesh = <["data"=6]>

// -----

// A Dataset's batch of 8 rows (the dynamic_slice of its array).
// CHECK: invalid-micro-batch.mlir:[[# @LINE + 1]]:1: error: pass 'micro-batch{slices=3}' failed: the batch read by stablehlo.dynamic_slice (data.py:4) (tensor<8x3xf32>) has 8 rows along dim 0, which do not divide into 3 slices
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %data: tensor<32x3xf32>, %step: tensor<i32> {loopfuse.step_index}) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %x = stablehlo.dynamic_slice %data, %step, %c0, sizes = [8, 3] : (tensor<32x3xf32>, tensor<i32>, tensor<i32>) -> tensor<8x3xf32> loc("data.py":4:1)
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// A batch of a dynamic number of rows: micro-batch cuts static shapes only.
// CHECK: invalid-micro-batch.mlir:[[# @LINE + 1]]:1: error: pass 'micro-batch{slices=3}' failed: tensor<?x3xf32> has a dynamic size along the batch axis: micro-batch cuts static shapes only
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<?x3xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<?x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}
