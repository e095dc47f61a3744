// RUN: not loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4})' 2>/dev/null | filecheck %s
// RUN: not loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4})' 2>&1 >/dev/null | filecheck --check-prefix=ERR %s

// (a) A stopping loop: the tensor<i1> result tagged loopfuse.stop gets no history; it is carried
// as the last loop value (false at first), the condition is `i < 4 and not stopped`, the float
// history starts as NaN and the integer one as 0, and @main returns the final counter (the steps
// run) in the stop result's place, tagged loopfuse.steps_run, and right after it the final flag
// (did a step ask to stop), tagged loopfuse.stopped with the next loopfuse.result index.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<f32>, %arg1: tensor<f32>) -> (tensor<f32>, tensor<f32>, tensor<i1>, tensor<2xi32>)
// CHECK-LABEL: func.func @main(%arg0: tensor<f32> {loopfuse.state = "['w']"}, %arg1: tensor<f32>)
// CHECK-SAME: -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<4xf32>, tensor<i32> {loopfuse.result = 2 : i32, loopfuse.steps_run}, tensor<i1> {loopfuse.result = 3 : i32, loopfuse.stopped}, tensor<4x2xi32>)
// CHECK: %[[ZERO:[a-z0-9_]+]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK-NEXT: %[[NAN:[a-z0-9_]+]] = stablehlo.constant dense<0x7FC00000> : tensor<f32>
// CHECK-NEXT: %[[H0:[0-9]+]] = stablehlo.broadcast_in_dim %[[NAN]], dims = [] : (tensor<f32>) -> tensor<4xf32>
// CHECK-NEXT: %[[IZERO:[a-z0-9_]+]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK-NEXT: %[[G0:[0-9]+]] = stablehlo.broadcast_in_dim %[[IZERO]], dims = [] : (tensor<i32>) -> tensor<4x2xi32>
// CHECK-NEXT: %[[NO:[a-z0-9_]+]] = stablehlo.constant dense<false> : tensor<i1>
// CHECK-NEXT: %[[W:[0-9]+]]:6 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %[[ZERO]], %[[S:[a-zA-Z0-9_]+]] = %arg0, %[[X:[a-zA-Z0-9_]+]] = %arg1, %[[H:[a-zA-Z0-9_]+]] = %[[H0]], %[[G:[a-zA-Z0-9_]+]] = %[[G0]], %[[STOPPED:[a-zA-Z0-9_]+]] = %[[NO]]) : tensor<i32>, tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4x2xi32>, tensor<i1>
// CHECK-NEXT: cond {
// CHECK-NEXT: %[[K:[a-z0-9_]+]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: %[[LT:[0-9]+]] = stablehlo.compare LT, %[[I]], %[[K]] : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: %[[GO:[0-9]+]] = stablehlo.not %[[STOPPED]] : tensor<i1>
// CHECK-NEXT: %[[BOTH:[0-9]+]] = stablehlo.and %[[LT]], %[[GO]] : tensor<i1>
// CHECK-NEXT: stablehlo.return %[[BOTH]] : tensor<i1>
// CHECK-NEXT: } do {
// CHECK-NEXT: %[[OUT:[0-9]+]]:4 = func.call @loopfuse_step(%[[S]], %[[X]])
// CHECK: %[[NH:[0-9]+]] = stablehlo.dynamic_update_slice %[[H]], %{{[0-9]+}}, %[[I]] :
// CHECK: %[[NG:[0-9]+]] = stablehlo.dynamic_update_slice %[[G]],
// CHECK: %[[NI:[0-9]+]] = stablehlo.add %[[I]], %{{[a-z0-9_]+}} : tensor<i32>
// CHECK-NEXT: stablehlo.return %[[NI]], %[[OUT]]#0, %[[X]], %[[NH]], %[[NG]], %[[OUT]]#2 : tensor<i32>, tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4x2xi32>, tensor<i1>
// CHECK-NEXT: }
// CHECK-NEXT: return %[[W]]#1, %[[W]]#3, %[[W]]#0, %[[W]]#5, %[[W]]#4 : tensor<f32>, tensor<4xf32>, tensor<i32>, tensor<i1>, tensor<4x2xi32>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %x: tensor<f32>)
    -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32>, tensor<i1> {loopfuse.stop, loopfuse.result = 2 : i32}, tensor<2xi32>) {
  %0 = stablehlo.multiply %w, %x : tensor<f32>
  %1 = stablehlo.subtract %w, %0 : tensor<f32>
  %c = stablehlo.constant dense<1.0> : tensor<f32>
  %s = stablehlo.compare LT, %1, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %i = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  return %1, %0, %s, %i : tensor<f32>, tensor<f32>, tensor<i1>, tensor<2xi32>
}

// -----

// (b) The same step without the loopfuse.stop tag: the i1 result is an ordinary aux with a
// tensor<4xi1> history, the condition is the counter test alone, histories start at zero and
// nothing else is carried: the plain K-step loop.
// CHECK-LABEL: func.func @main(
// CHECK-SAME: -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<4xf32>, tensor<4xi1> {loopfuse.result = 2 : i32}, tensor<4x2xi32>)
// CHECK-NOT: 0x7FC00000
// CHECK: %[[W:[0-9]+]]:6 = stablehlo.while({{.*}}) : tensor<i32>, tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xi1>, tensor<4x2xi32>
// CHECK-NEXT: cond {
// CHECK-NEXT: %[[K:[a-z0-9_]+]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: %[[LT:[0-9]+]] = stablehlo.compare LT, %{{[a-zA-Z0-9_]+}}, %[[K]] : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: stablehlo.return %[[LT]] : tensor<i1>
// CHECK-NEXT: } do {
// CHECK: return %[[W]]#1, %[[W]]#3, %[[W]]#4, %[[W]]#5 : tensor<f32>, tensor<4xf32>, tensor<4xi1>, tensor<4x2xi32>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %x: tensor<f32>)
    -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32>, tensor<i1> {loopfuse.result = 2 : i32}, tensor<2xi32>) {
  %0 = stablehlo.multiply %w, %x : tensor<f32>
  %1 = stablehlo.subtract %w, %0 : tensor<f32>
  %c = stablehlo.constant dense<1.0> : tensor<f32>
  %s = stablehlo.compare LT, %1, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %i = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  return %1, %0, %s, %i : tensor<f32>, tensor<f32>, tensor<i1>, tensor<2xi32>
}

// -----

// (c) Complex and bf16 histories of a stopping loop start as NaN + NaN i and NaN.
// CHECK-LABEL: func.func @main(
// CHECK: %[[NAN:[a-z0-9_]+]] = stablehlo.constant dense<0x7FC00000> : tensor<f32>
// CHECK-NEXT: %[[Z:[0-9]+]] = stablehlo.complex %[[NAN]], %[[NAN]] : tensor<complex<f32>>
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[Z]], dims = [] : (tensor<complex<f32>>) -> tensor<4x3xcomplex<f32>>
// CHECK-NEXT: %[[BNAN:[a-z0-9_]+]] = stablehlo.constant dense<0x7FC0> : tensor<bf16>
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[BNAN]], dims = [] : (tensor<bf16>) -> tensor<4xbf16>
func.func @main(%w: tensor<3xcomplex<f32>> {loopfuse.state = "w"}, %b: tensor<bf16>)
    -> (tensor<3xcomplex<f32>> {loopfuse.state = "w"}, tensor<3xcomplex<f32>>, tensor<bf16>, tensor<i1> {loopfuse.stop}) {
  %f = stablehlo.constant dense<false> : tensor<i1>
  return %w, %w, %b, %f : tensor<3xcomplex<f32>>, tensor<3xcomplex<f32>>, tensor<bf16>, tensor<i1>
}

// -----

// (d) An argument tagged loopfuse.stopped is the carried flag's initial value (in place of the
// false constant): a loop that starts stopped runs no step. The step is called with it (unused).
// CHECK-LABEL: func.func @main(%arg0: tensor<f32> {loopfuse.state = "w"}, %arg1: tensor<i1> {loopfuse.stopped})
// CHECK-NOT: dense<false>
// CHECK: stablehlo.while({{.*}}, %[[STOPPED:[a-zA-Z0-9_]+]] = %arg1) : tensor<i32>, tensor<f32>, tensor<i1>, tensor<4xf32>, tensor<i1>
// CHECK: stablehlo.not %[[STOPPED]] : tensor<i1>
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}, %after: tensor<i1> {loopfuse.stopped})
    -> (tensor<f32> {loopfuse.state = "w"}, tensor<f32>, tensor<i1> {loopfuse.stop}) {
  %c = stablehlo.constant dense<1.0> : tensor<f32>
  %s = stablehlo.compare LT, %w, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %w, %w, %s : tensor<f32>, tensor<f32>, tensor<i1>
}

// -----

// Errors: a stopped argument needs a stop result ...
// ERR: error: pass 'wrap-loop{steps=4}' failed: argument 1 is tagged loopfuse.stopped but no result loopfuse.stop: it starts a stopping loop
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}, %after: tensor<i1> {loopfuse.stopped}) -> (tensor<f32> {loopfuse.state = "w"}) {
  return %w : tensor<f32>
}

// -----

// ... and is a tensor<i1> ...
// ERR: error: pass 'wrap-loop{steps=4}' failed: stopped argument 1 must be tensor<i1>, not tensor<2xi1>
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}, %after: tensor<2xi1> {loopfuse.stopped}) -> (tensor<f32> {loopfuse.state = "w"}, tensor<i1> {loopfuse.stop}) {
  %f = stablehlo.constant dense<false> : tensor<i1>
  return %w, %f : tensor<f32>, tensor<i1>
}

// -----

// ... the stop result must be a tensor<i1> ...
// ERR: error: pass 'wrap-loop{steps=4}' failed: stop result 1 must be tensor<i1>, not tensor<f32>
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}) -> (tensor<f32> {loopfuse.state = "w"}, tensor<f32> {loopfuse.stop}) {
  return %w, %w : tensor<f32>, tensor<f32>
}

// -----

// ... and a scalar one (a per-element flag says nothing about the whole step) ...
// ERR: error: pass 'wrap-loop{steps=4}' failed: stop result 1 must be tensor<i1>, not tensor<2xi1>
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}, %s: tensor<2xi1>) -> (tensor<f32> {loopfuse.state = "w"}, tensor<2xi1> {loopfuse.stop}) {
  return %w, %s : tensor<f32>, tensor<2xi1>
}

// -----

// ... not a state result ...
// ERR: error: pass 'wrap-loop{steps=4}' failed: stop result 0 is also a state result (loopfuse.state); the stop flag is not state
func.func @main(%w: tensor<i1> {loopfuse.state = "w"}) -> (tensor<i1> {loopfuse.state = "w", loopfuse.stop}) {
  return %w : tensor<i1>
}

// -----

// ... and there is one.
// ERR: error: pass 'wrap-loop{steps=4}' failed: results [1, 2] are all tagged loopfuse.stop; a loop has one stop condition
func.func @main(%w: tensor<f32> {loopfuse.state = "w"}, %s: tensor<i1>) -> (tensor<f32> {loopfuse.state = "w"}, tensor<i1> {loopfuse.stop}, tensor<i1> {loopfuse.stop}) {
  return %w, %s, %s : tensor<f32>, tensor<i1>, tensor<i1>
}
