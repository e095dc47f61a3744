// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=5 rows=2})' | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=2 rows=2})' | filecheck --check-prefix=ONE %s

// rows >= steps: one loop, as without the option.
// ONE-LABEL: func.func @main(
// ONE: stablehlo.while
// ONE-NOT: stablehlo.while
// ONE: return

// (a) Blocks of 2 of 5 steps: @main is an outer loop over blocks (counter below 5) that runs an inner
// loop from its counter to min(counter + 2, 5), the inner loop calling the step and writing row
// (step - block start) of a tensor<2xf32> block; the outer loop writes the block into the history
// at the block's start, the history padded to 3 whole blocks (tensor<6xf32>) and cut to 5 rows.
// CHECK-LABEL: func.func @main(%arg0: tensor<f32> {loopfuse.state = "['w']"}, %arg1: tensor<f32>) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<5xf32>)
// CHECK: %[[H0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<6xf32>
// CHECK: %[[W:[0-9]+]]:4 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[S:[a-zA-Z0-9_]+]] = %arg0, %[[X:[a-zA-Z0-9_]+]] = %arg1, %[[H:[a-zA-Z0-9_]+]] = %[[H0]]) : tensor<i32>, tensor<f32>, tensor<f32>, tensor<6xf32>
// CHECK: stablehlo.compare LT, %[[I]], %{{[a-z0-9_]+}}
// CHECK: } do {
// CHECK-NEXT: %[[ROWS:[a-z0-9_]+]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: %[[NEXT:[0-9]+]] = stablehlo.add %[[I]], %[[ROWS]] : tensor<i32>
// CHECK-NEXT: %[[K:[a-z0-9_]+]] = stablehlo.constant dense<5> : tensor<i32>
// CHECK-NEXT: %[[END:[0-9]+]] = stablehlo.minimum %[[NEXT]], %[[K]] : tensor<i32>
// CHECK: %[[B0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<2xf32>
// CHECK-NEXT: %[[IN:[0-9]+]]:6 = stablehlo.while(%[[J:[a-zA-Z0-9_]+]] = %[[I]], %[[FIRST:[a-zA-Z0-9_]+]] = %[[I]], %[[LAST:[a-zA-Z0-9_]+]] = %[[END]], %[[IS:[a-zA-Z0-9_]+]] = %[[S]], %[[IX:[a-zA-Z0-9_]+]] = %[[X]], %[[B:[a-zA-Z0-9_]+]] = %[[B0]]) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<f32>, tensor<f32>, tensor<2xf32>
// CHECK-NEXT: cond {
// CHECK-NEXT: %[[LT:[0-9]+]] = stablehlo.compare LT, %[[J]], %[[LAST]] : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: stablehlo.return %[[LT]] : tensor<i1>
// CHECK-NEXT: } do {
// CHECK-NEXT: %[[ROW:[0-9]+]] = stablehlo.subtract %[[J]], %[[FIRST]] : tensor<i32>
// CHECK-NEXT: %[[OUT:[0-9]+]]:2 = func.call @loopfuse_step(%[[IS]], %[[IX]])
// CHECK-NEXT: %[[R:[0-9]+]] = stablehlo.reshape %[[OUT]]#1 : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[NB:[0-9]+]] = stablehlo.dynamic_update_slice %[[B]], %[[R]], %[[ROW]] : (tensor<2xf32>, tensor<1xf32>, tensor<i32>) -> tensor<2xf32>
// CHECK: stablehlo.return %{{[0-9]+}}, %[[FIRST]], %[[LAST]], %[[OUT]]#0, %[[IX]], %[[NB]] :
// CHECK-NEXT: }
// CHECK-NEXT: %[[NH:[0-9]+]] = stablehlo.dynamic_update_slice %[[H]], %[[IN]]#5, %[[I]] : (tensor<6xf32>, tensor<2xf32>, tensor<i32>) -> tensor<6xf32>
// CHECK-NEXT: stablehlo.return %[[IN]]#0, %[[IN]]#3, %[[IN]]#4, %[[NH]] : tensor<i32>, tensor<f32>, tensor<f32>, tensor<6xf32>
// CHECK-NEXT: }
// CHECK-NEXT: %[[CUT:[0-9]+]] = stablehlo.slice %[[W]]#3 [0:5] : (tensor<6xf32>) -> tensor<5xf32>
// CHECK-NEXT: return %[[W]]#1, %[[CUT]] : tensor<f32>, tensor<5xf32>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %x: tensor<f32>) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32>) {
  %0 = stablehlo.multiply %w, %x : tensor<f32>
  %1 = stablehlo.subtract %w, %0 : tensor<f32>
  return %1, %0 : tensor<f32>, tensor<f32>
}

// -----

// (b) A stopping loop in blocks: both conditions also test the stopped flag (carried last through
// both loops), the block starts as NaN like the history, and @main returns the outer counter (the
// steps run) and the flag.
// CHECK-LABEL: func.func @main(
// CHECK-SAME: -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<5xf32>, tensor<i32> {loopfuse.result = 2 : i32, loopfuse.steps_run}, tensor<i1> {loopfuse.result = 3 : i32, loopfuse.stopped})
// CHECK: %[[W:[0-9]+]]:5 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %{{.*}} = %arg0, %{{.*}} = %arg1, %{{.*}} = %{{[0-9]+}}, %[[F:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}) : tensor<i32>, tensor<f32>, tensor<f32>, tensor<6xf32>, tensor<i1>
// CHECK: stablehlo.not %[[F]]
// CHECK: } do {
// CHECK: %[[NAN:[a-z0-9_]+]] = stablehlo.constant dense<0x7FC00000> : tensor<f32>
// CHECK-NEXT: %[[B0:[0-9]+]] = stablehlo.broadcast_in_dim %[[NAN]], dims = [] : (tensor<f32>) -> tensor<2xf32>
// CHECK-NEXT: %[[IN:[0-9]+]]:7 = stablehlo.while({{.*}}, %{{.*}} = %[[B0]], %[[IF:[a-zA-Z0-9_]+]] = %[[F]]) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<f32>, tensor<f32>, tensor<2xf32>, tensor<i1>
// CHECK: stablehlo.not %[[IF]]
// CHECK: stablehlo.return %[[IN]]#0, %[[IN]]#3, %[[IN]]#4, %{{[0-9]+}}, %[[IN]]#6 :
// CHECK: return %[[W]]#1, %{{[0-9]+}}, %[[W]]#0, %[[W]]#4 :
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %x: tensor<f32>)
    -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32>, tensor<i1> {loopfuse.stop, loopfuse.result = 2 : i32}) {
  %0 = stablehlo.multiply %w, %x : tensor<f32>
  %1 = stablehlo.subtract %w, %0 : tensor<f32>
  %c = stablehlo.constant dense<1.0> : tensor<f32>
  %s = stablehlo.compare LT, %1, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %1, %0, %s : tensor<f32>, tensor<f32>, tensor<i1>
}
