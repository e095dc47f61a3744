// RUN: loopfuse-opt %s --split-input-file --drop-unused-outputs | filecheck %s

// The gradient output is unused: it leaves the signature, and the cosine that only fed it is
// erased; the alias to result 2 is renumbered to 1.
// CHECK-LABEL: func.func @main
// CHECK-SAME: tf.aliasing_output = 1 : i32
// CHECK-SAME: -> (tensor<f32>, tensor<4xf32> {loopfuse.state = "w"})
// CHECK-NOT: stablehlo.cosine
// CHECK: %[[NEW:.*]] = stablehlo.subtract
// CHECK: return %{{.*}}, %[[NEW]] : tensor<f32>, tensor<4xf32>
func.func @main(%w: tensor<4xf32> {loopfuse.state = "w", tf.aliasing_output = 2 : i32}, %x: tensor<4xf32>)
    -> (tensor<f32>, tensor<4xf32> {loopfuse.unused}, tensor<4xf32> {loopfuse.state = "w"}) {
  %s = stablehlo.sine %w : tensor<4xf32>
  %c = stablehlo.cosine %x : tensor<4xf32>
  %g = stablehlo.multiply %c, %s : tensor<4xf32>
  %new = stablehlo.subtract %w, %s : tensor<4xf32>
  %cst = stablehlo.constant dense<1.0> : tensor<f32>
  return %cst, %g, %new : tensor<f32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Negative: an unused result fed by a custom call keeps the custom call (it may have effects),
// and ops still needed by kept results stay.
// CHECK-LABEL: func.func @main
// CHECK-SAME: -> tensor<4xf32>
// CHECK: stablehlo.sine
// CHECK: stablehlo.custom_call @side_effect
func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32> {loopfuse.unused}) {
  %s = stablehlo.sine %x : tensor<4xf32>
  %e = stablehlo.custom_call @side_effect(%s) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
  return %s, %e : tensor<4xf32>, tensor<4xf32>
}

// -----

// Negative: nothing is tagged unused, nothing changes.
// CHECK-LABEL: func.func @main
// CHECK-SAME: -> (tensor<4xf32>, tensor<4xf32>)
// CHECK: stablehlo.cosine
func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %c = stablehlo.cosine %x : tensor<4xf32>
  return %x, %c : tensor<4xf32>, tensor<4xf32>
}

// -----

// A dead call to an effect-free private function goes; a dead call to one with a custom call
// stays (the callee itself is never erased here).
// CHECK-LABEL: func.func @main
// CHECK-NOT: call @pure
// CHECK: call @effectful
// CHECK: return
func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32> {loopfuse.unused}, tensor<4xf32> {loopfuse.unused}) {
  %p = call @pure(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %e = call @effectful(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %x, %p, %e : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
func.func private @pure(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.sine %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @effectful(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.custom_call @print(%a) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
