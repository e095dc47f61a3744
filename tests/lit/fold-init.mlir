// RUN: loopfuse-opt %s --split-input-file --fold-init | filecheck %s

// The init's arguments (params, then the batch) become @main's: @main calls @loopfuse_init on them (now
// private), passes its results through an optimization barrier (so XLA cannot fold an initial constant into
// the loop), then calls the old @main (now the private @loopfuse_run, its aliases gone) on that state and the
// batch; the result attributes stay on @main.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%arg0: tensor<4xf32>, %arg1: tensor<4xf32>)
// CHECK-SAME: -> (tensor<4xf32> {loopfuse.result = 0 : i32, loopfuse.state = "[0]"}, tensor<4xf32> {loopfuse.result = 1 : i32, loopfuse.state = "[1]"}, tensor<f32> {loopfuse.result = 2 : i32})
// CHECK-NEXT: %[[S:.*]]:2 = call @loopfuse_init(%arg0, %arg1)
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[S]]#0, %[[S]]#1
// CHECK-NEXT: %[[R:.*]]:3 = call @loopfuse_run(%[[B]]#0, %[[B]]#1, %arg1)
// CHECK-NEXT: return %[[R]]#0, %[[R]]#1, %[[R]]#2
// CHECK: func.func private @loopfuse_run(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>)
// CHECK-NOT: tf.aliasing_output
// CHECK: func.func private @loopfuse_init
func.func @main(%w: tensor<4xf32> {loopfuse.state = "[0]", tf.aliasing_output = 0 : i32},
                %m: tensor<4xf32> {loopfuse.state = "[1]", tf.aliasing_output = 1 : i32}, %g: tensor<4xf32>)
    -> (tensor<4xf32> {loopfuse.result = 0 : i32, loopfuse.state = "[0]"},
        tensor<4xf32> {loopfuse.result = 1 : i32, loopfuse.state = "[1]"}, tensor<f32> {loopfuse.result = 2 : i32}) {
  %0 = stablehlo.add %m, %g : tensor<4xf32>
  %1 = stablehlo.subtract %w, %0 : tensor<4xf32>
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  return %1, %0, %cst : tensor<4xf32>, tensor<4xf32>, tensor<f32>
}
func.func @loopfuse_init(%p: tensor<4xf32>, %g: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %z = stablehlo.constant dense<0.0> : tensor<4xf32>
  return %p, %z : tensor<4xf32>, tensor<4xf32>
}

// -----

// A state of no leaves (minimize of params {}: nothing to carry): the init makes nothing, no barrier.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%arg0: tensor<4xf32>) -> (tensor<f32> {loopfuse.result = 0 : i32})
// CHECK-NEXT: call @loopfuse_init(%arg0) : (tensor<4xf32>) -> ()
// CHECK-NEXT: %[[R:.*]] = call @loopfuse_run(%arg0)
// CHECK-NEXT: return %[[R]]
func.func @main(%g: tensor<4xf32>) -> (tensor<f32> {loopfuse.result = 0 : i32}) {
  %0 = stablehlo.slice %g [0:1] : (tensor<4xf32>) -> tensor<1xf32>
  %1 = stablehlo.reshape %0 : (tensor<1xf32>) -> tensor<f32>
  return %1 : tensor<f32>
}
func.func @loopfuse_init(%g: tensor<4xf32>) -> () {
  return
}
