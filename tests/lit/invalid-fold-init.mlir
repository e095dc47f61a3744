// RUN: not loopfuse-opt %s --split-input-file --fold-init 2>&1 | filecheck %s
// Each chunk is refused with an error at the function it names, saying which roles do not line up.

// CHECK: invalid-fold-init.mlir:[[# @LINE + 5]]:1: error: pass 'fold-init' failed: @loopfuse_init returns (tensor<2xf32>), not @main's state arguments (tensor<4xf32>)
// The init returns other types than @main's state arguments.
func.func @main(%w: tensor<4xf32> {loopfuse.state = "[0]"}, %g: tensor<4xf32>) -> (tensor<4xf32> {loopfuse.state = "[0]"}) {
  return %w : tensor<4xf32>
}
func.func @loopfuse_init(%p: tensor<2xf32>, %g: tensor<4xf32>) -> (tensor<2xf32>) {
  return %p : tensor<2xf32>
}

// -----

// CHECK: invalid-fold-init.mlir:[[# @LINE + 5]]:1: error: pass 'fold-init' failed: @loopfuse_init's last arguments (tensor<4xf32>) are not @main's arguments after the state (tensor<3xf32>)
// The init does not end with @main's batch arguments.
func.func @main(%w: tensor<4xf32> {loopfuse.state = "[0]"}, %g: tensor<3xf32>) -> (tensor<4xf32> {loopfuse.state = "[0]"}) {
  return %w : tensor<4xf32>
}
func.func @loopfuse_init(%p: tensor<4xf32>) -> (tensor<4xf32>) {
  return %p : tensor<4xf32>
}

// -----

// CHECK: invalid-fold-init.mlir:[[# @LINE + 2]]:1: error: pass 'fold-init' failed: @main does not take its state first
// A state argument after a batch argument.
func.func @main(%g: tensor<4xf32>, %w: tensor<4xf32> {loopfuse.state = "[0]"}) -> (tensor<4xf32> {loopfuse.state = "[0]"}) {
  return %w : tensor<4xf32>
}
func.func @loopfuse_init(%p: tensor<4xf32>, %g: tensor<4xf32>) -> (tensor<4xf32>) {
  return %p : tensor<4xf32>
}

// -----

// CHECK: invalid-fold-init.mlir:[[# @LINE + 2]]:1: error: pass 'fold-init' failed: the module has no @loopfuse_init to start from (a pass before fold-init removed it?)
// No init: a pass before fold-init dropped it (the program would otherwise take the state, donated).
func.func @main(%w: tensor<4xf32> {loopfuse.state = "[0]", tf.aliasing_output = 0 : i32}) -> (tensor<4xf32> {loopfuse.state = "[0]"}) {
  return %w : tensor<4xf32>
}

// -----

// CHECK: invalid-fold-init.mlir:[[# @LINE + 2]]:1: error: pass 'fold-init' failed: @main's state holds an effect token: a program with ordered effects cannot start from its init
// An effect token carried as state.
func.func @main(%t: !stablehlo.token {loopfuse.state = "<effect token 0>"}, %w: tensor<4xf32> {loopfuse.state = "[0]"})
    -> (!stablehlo.token {loopfuse.state = "<effect token 0>"}, tensor<4xf32> {loopfuse.state = "[0]"}) {
  return %t, %w : !stablehlo.token, tensor<4xf32>
}
func.func @loopfuse_init(%p: tensor<4xf32>) -> (!stablehlo.token, tensor<4xf32>) {
  %t = stablehlo.create_token : !stablehlo.token
  return %t, %p : !stablehlo.token, tensor<4xf32>
}
