// RUN: not loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4})' 2>&1 | filecheck %s
// Every chunk is rejected with an error naming the pass and the offending value; loopfuse-opt
// reports each chunk and exits non-zero.

// A state result whose path no argument has cannot be carried around the loop.
// CHECK: error: pass 'wrap-loop{steps=4}' failed: state result 0 (['v']) has no argument of the same path and type to carry it around the loop
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}) -> (tensor<f32> {loopfuse.state = "['v']"}) {
  return %w : tensor<f32>
}

// -----

// A state argument that no result updates.
// CHECK: error: pass 'wrap-loop{steps=4}' failed: state arguments ["['m']"] have no matching result: the loop cannot carry them
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %m: tensor<f32> {loopfuse.state = "['m']"}) -> (tensor<f32> {loopfuse.state = "['w']"}) {
  return %w : tensor<f32>
}

// -----

// The same path but another type (f32 -> bf16) cannot be a loop-carried value.
// CHECK: error: pass 'wrap-loop{steps=4}' failed: state result 0 (['w']) has no argument of the same path and type
func.func @main(%w: tensor<4xf32> {loopfuse.state = "['w']"}) -> (tensor<4xbf16> {loopfuse.state = "['w']"}) {
  %0 = stablehlo.convert %w : (tensor<4xf32>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// Two results tagged with one path.
// CHECK: error: pass 'wrap-loop{steps=4}' failed: state path ['w'] tags more than one result (result 1 again)
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32> {loopfuse.state = "['w']"}) {
  return %w, %w : tensor<f32>, tensor<f32>
}

// -----

// The step index must be tensor<i32> (the counter's type).
// CHECK: error: pass 'wrap-loop{steps=4}' failed: step index argument 1 must be tensor<i32>, not tensor<i64>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %i: tensor<i64> {loopfuse.step_index}) -> (tensor<f32> {loopfuse.state = "['w']"}) {
  return %w : tensor<f32>
}
