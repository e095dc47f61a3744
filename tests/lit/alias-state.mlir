// RUN: loopfuse-opt %s --split-input-file --alias-state | filecheck %s

// A state leaf whose updated value is returned under the same path and type is aliased.
// CHECK-LABEL: func.func @main
// CHECK-SAME: %arg0: tensor<4xf32> {loopfuse.state = "['w']", tf.aliasing_output = 1 : i32}
// CHECK-SAME: %arg1: tensor<4xf32> {loopfuse.state = "['m']", tf.aliasing_output = 2 : i32}
// CHECK-SAME: %arg2: tensor<4xf32>)
func.func @main(%w: tensor<4xf32> {loopfuse.state = "['w']"}, %m: tensor<4xf32> {loopfuse.state = "['m']"}, %g: tensor<4xf32>)
    -> (tensor<f32>, tensor<4xf32> {loopfuse.state = "['w']"}, tensor<4xf32> {loopfuse.state = "['m']"}) {
  %0 = stablehlo.add %m, %g : tensor<4xf32>
  %1 = stablehlo.subtract %w, %0 : tensor<4xf32>
  %cst = stablehlo.constant dense<0.0> : tensor<f32>
  return %cst, %1, %0 : tensor<f32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Negative: a type change (f32 -> bf16) cannot reuse the buffer, so the arg only becomes a donor;
// an untagged argument (the batch) is never touched; an existing alias is kept.
// CHECK-LABEL: func.func @main
// CHECK-SAME: %arg0: tensor<4xf32> {jax.buffer_donor = true, loopfuse.state = "['w']"}
// CHECK-SAME: %arg1: tensor<4xf32> {loopfuse.state = "['v']", tf.aliasing_output = 0 : i32}
// CHECK-SAME: %arg2: tensor<4xf32>)
// CHECK-NOT: tf.aliasing_output = 1
func.func @main(%w: tensor<4xf32> {loopfuse.state = "['w']"}, %v: tensor<4xf32> {loopfuse.state = "['v']", tf.aliasing_output = 0 : i32}, %x: tensor<4xf32>)
    -> (tensor<4xf32> {loopfuse.state = "['v']"}, tensor<4xbf16> {loopfuse.state = "['w']"}) {
  %0 = stablehlo.convert %w : (tensor<4xf32>) -> tensor<4xbf16>
  return %x, %0 : tensor<4xf32>, tensor<4xbf16>
}

// -----

// Negative: an effect token is carried state (the same path in and out) but has no buffer: it
// gets neither an alias nor a donor attribute; the tensor state after it is still aliased.
// CHECK-LABEL: func.func @main
// CHECK-SAME: %arg0: !stablehlo.token {loopfuse.state = "<effect token 0>"}
// CHECK-SAME: %arg1: tensor<4xf32> {loopfuse.state = "['w']", tf.aliasing_output = 1 : i32}
func.func @main(%t: !stablehlo.token {loopfuse.state = "<effect token 0>"}, %w: tensor<4xf32> {loopfuse.state = "['w']"})
    -> (!stablehlo.token {loopfuse.state = "<effect token 0>"}, tensor<4xf32> {loopfuse.state = "['w']"}) {
  %0 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%t, %w) {has_side_effect = true} : (!stablehlo.token, tensor<4xf32>) -> !stablehlo.token
  return %0, %w : !stablehlo.token, tensor<4xf32>
}
