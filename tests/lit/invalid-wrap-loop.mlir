// RUN: not loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4})' 2>&1 | filecheck %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{steps=0})' 2>&1 | filecheck --check-prefix=STEPS %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{steps=2147483648})' 2>&1 | filecheck --check-prefix=BIG %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{steps=four})' 2>&1 | filecheck --check-prefix=TYPE %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{stepz=4})' 2>&1 | filecheck --check-prefix=NAME %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{steps=4 steps=8})' 2>&1 | filecheck --check-prefix=TWICE %s
// RUN: not loopfuse-opt %s --pass-pipeline='builtin.module(wrap-loop{steps= 4})' 2>&1 | filecheck --check-prefix=SPACE %s
// Every chunk is rejected with an error at @main's location naming the pass and the offending value;
// loopfuse-opt reports each chunk and exits non-zero. Bad options are refused before any parsing,
// with one message naming the pass and the option.
// STEPS: loopfuse-opt: error: pass 'wrap-loop' option 'steps': must be >= 1, got 0
// BIG: loopfuse-opt: error: pass 'wrap-loop' option 'steps': must be <= 2147483647, got 2147483648
// TYPE: loopfuse-opt: error: pass 'wrap-loop' option 'steps': expects int, got 'four'
// NAME: loopfuse-opt: error: pass 'wrap-loop' option 'stepz': no such option (options of wrap-loop: steps, rows)
// TWICE: loopfuse-opt: error: pass 'wrap-loop' option 'steps': given more than once
// SPACE: loopfuse-opt: error: pass 'wrap-loop' option 'steps': no spaces around '=' (write steps=4)

// A state result whose path no argument has cannot be carried around the loop.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: state result 0 (['v']) has no argument of the same path and type to carry it around the loop
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}) -> (tensor<f32> {loopfuse.state = "['v']"}) {
  return %w : tensor<f32>
}

// -----

// A state argument that no result updates.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: state arguments ["['m']"] have no matching result: the loop cannot carry them
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %m: tensor<f32> {loopfuse.state = "['m']"}) -> (tensor<f32> {loopfuse.state = "['w']"}) {
  return %w : tensor<f32>
}

// -----

// The same path but another type (f32 -> bf16) cannot be a loop-carried value.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: state result 0 (['w']) has no argument of the same path and type
func.func @main(%w: tensor<4xf32> {loopfuse.state = "['w']"}) -> (tensor<4xbf16> {loopfuse.state = "['w']"}) {
  %0 = stablehlo.convert %w : (tensor<4xf32>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// Two results tagged with one path.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: state path ['w'] tags more than one result (result 1 again)
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32> {loopfuse.state = "['w']"}) {
  return %w, %w : tensor<f32>, tensor<f32>
}

// -----

// The step index must be tensor<i32> (the counter's type).
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: step index argument 1 must be tensor<i32>, not tensor<i64>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %i: tensor<i64> {loopfuse.step_index}) -> (tensor<f32> {loopfuse.state = "['w']"}) {
  return %w : tensor<f32>
}

// -----

// An aux result that is not a ranked tensor has no history to be stacked into.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: result 1 is !stablehlo.token: wrap-loop keeps histories of ranked tensors only
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %t: !stablehlo.token) -> (tensor<f32> {loopfuse.state = "['w']"}, !stablehlo.token) {
  return %w, %t : tensor<f32>, !stablehlo.token
}

// -----

// A module wrap-loop has run on: it runs once.
// CHECK: invalid-wrap-loop.mlir:[[# @LINE + 1]]:1: error: pass 'wrap-loop{steps=4}' failed: the module already has @loopfuse_step: wrap-loop has run on it (it runs once)
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}) -> (tensor<f32> {loopfuse.state = "['w']"}) {
  %0 = func.call @loopfuse_step(%w) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @loopfuse_step(%w: tensor<f32>) -> tensor<f32> {
  return %w : tensor<f32>
}

// -----

// A state path that is not a string is refused by name, not by a cast's exception.
// CHECK: error: pass 'wrap-loop{steps=4}' failed: attribute loopfuse.state = 3 : i32 must be a string
func.func @main(%w: tensor<f32> {loopfuse.state = 3 : i32}) -> (tensor<f32> {loopfuse.state = 3 : i32}) {
  return %w : tensor<f32>
}
