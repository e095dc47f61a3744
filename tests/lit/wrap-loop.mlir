// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4})' | filecheck %s

// (a) One carried state leaf and one scalar aux. The old body becomes the private @loopfuse_step;
// @main is a while loop of 4 iterations carrying (counter, state, batch, history) that calls the
// step, writes the aux into row i of a tensor<4xf32> history and returns the final state.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<f32>, %arg1: tensor<f32>) -> (tensor<f32>, tensor<f32>)
// CHECK: stablehlo.multiply %arg0, %arg1
// CHECK: stablehlo.subtract
// CHECK-LABEL: func.func @main(%arg0: tensor<f32> {loopfuse.state = "['w']"}, %arg1: tensor<f32>) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<4xf32>)
// CHECK-NOT: stablehlo.multiply
// CHECK: %[[ZERO:[a-z0-9_]+]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK: %[[H0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<4xf32>
// CHECK: %[[W:[0-9]+]]:4 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %[[ZERO]], %[[S:[a-zA-Z0-9_]+]] = %arg0, %[[X:[a-zA-Z0-9_]+]] = %arg1, %[[H:[a-zA-Z0-9_]+]] = %[[H0]]) : tensor<i32>, tensor<f32>, tensor<f32>, tensor<4xf32>
// CHECK-NEXT: cond {
// CHECK-NEXT: %[[K:[a-z0-9_]+]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: %[[LT:[0-9]+]] = stablehlo.compare LT, %[[I]], %[[K]] : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: stablehlo.return %[[LT]] : tensor<i1>
// CHECK-NEXT: } do {
// CHECK-NEXT: %[[OUT:[0-9]+]]:2 = func.call @loopfuse_step(%[[S]], %[[X]]) : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
// CHECK-NEXT: %[[ROW:[0-9]+]] = stablehlo.reshape %[[OUT]]#1 : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[NH:[0-9]+]] = stablehlo.dynamic_update_slice %[[H]], %[[ROW]], %[[I]] : (tensor<4xf32>, tensor<1xf32>, tensor<i32>) -> tensor<4xf32>
// CHECK-NEXT: %[[ONE:[a-z0-9_]+]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: %[[NI:[0-9]+]] = stablehlo.add %[[I]], %[[ONE]] : tensor<i32>
// CHECK-NEXT: stablehlo.return %[[NI]], %[[OUT]]#0, %[[X]], %[[NH]] : tensor<i32>, tensor<f32>, tensor<f32>, tensor<4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: return %[[W]]#1, %[[W]]#3 : tensor<f32>, tensor<4xf32>
func.func @main(%w: tensor<f32> {loopfuse.state = "['w']"}, %x: tensor<f32>) -> (tensor<f32> {loopfuse.state = "['w']"}, tensor<f32>) {
  %0 = stablehlo.multiply %w, %x : tensor<f32>
  %1 = stablehlo.subtract %w, %0 : tensor<f32>
  return %1, %0 : tensor<f32>, tensor<f32>
}

// -----

// (b) A loopfuse.step_index argument receives start + i: the loop adds the counter to the carried
// (unchanged) start index right before the call, and passes the start index on unchanged. State
// results may come in any order relative to aux results; an integer aux gets an integer history.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<2xf32>, %arg1: tensor<8x2xf32>, %arg2: tensor<i32>) -> (tensor<i32>, tensor<2xf32>)
// CHECK-LABEL: func.func @main(%arg0: tensor<2xf32> {loopfuse.state = "['w']"}, %arg1: tensor<8x2xf32>, %arg2: tensor<i32> {loopfuse.step_index}) -> (tensor<4xi32>, tensor<2xf32> {loopfuse.state = "['w']"})
// CHECK: %[[H0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<i32>) -> tensor<4xi32>
// CHECK: %[[W:[0-9]+]]:5 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[S:[a-zA-Z0-9_]+]] = %arg0, %[[D:[a-zA-Z0-9_]+]] = %arg1, %[[START:[a-zA-Z0-9_]+]] = %arg2, %[[H:[a-zA-Z0-9_]+]] = %[[H0]])
// CHECK: } do {
// CHECK-NEXT: %[[STEP:[0-9]+]] = stablehlo.add %[[START]], %[[I]] : tensor<i32>
// CHECK-NEXT: %[[OUT:[0-9]+]]:2 = func.call @loopfuse_step(%[[S]], %[[D]], %[[STEP]])
// CHECK-NEXT: %[[ROW:[0-9]+]] = stablehlo.reshape %[[OUT]]#0 : (tensor<i32>) -> tensor<1xi32>
// CHECK-NEXT: %[[NH:[0-9]+]] = stablehlo.dynamic_update_slice %[[H]], %[[ROW]], %[[I]]
// CHECK: stablehlo.return %{{[0-9]+}}, %[[OUT]]#1, %[[D]], %[[START]], %[[NH]] : tensor<i32>, tensor<2xf32>, tensor<8x2xf32>, tensor<i32>, tensor<4xi32>
// CHECK: return %[[W]]#4, %[[W]]#1 : tensor<4xi32>, tensor<2xf32>
func.func @main(%w: tensor<2xf32> {loopfuse.state = "['w']"}, %d: tensor<8x2xf32>, %i: tensor<i32> {loopfuse.step_index})
    -> (tensor<i32>, tensor<2xf32> {loopfuse.state = "['w']"}) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %s = stablehlo.dynamic_slice %d, %i, %c0, sizes = [1, 2] : (tensor<8x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
  %r = stablehlo.reshape %s : (tensor<1x2xf32>) -> tensor<2xf32>
  %1 = stablehlo.subtract %w, %r : tensor<2xf32>
  return %i, %1 : tensor<i32>, tensor<2xf32>
}

// -----

// (c) SPMD: an aux result's sdy.sharding gains an unsharded leading (step) dimension for its
// history, also for a scalar aux ([] -> [{}]); argument and state-result shardings are unchanged.
// CHECK: sdy.mesh @mesh = <["data"=2]>
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<4xf32>, %arg1: tensor<4x3xf32>) -> (tensor<4xf32>, tensor<4x3xf32>, tensor<f32>)
// CHECK-LABEL: func.func @main(
// CHECK-SAME: %arg0: tensor<4xf32> {loopfuse.state = "['w']", sdy.sharding = #sdy.sharding<@mesh, [{}]>}
// CHECK-SAME: %arg1: tensor<4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}
// CHECK-SAME: -> (tensor<4xf32> {loopfuse.state = "['w']", sdy.sharding = #sdy.sharding<@mesh, [{}]>},
// CHECK-SAME: tensor<4x4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"data"}, {}]>},
// CHECK-SAME: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>})
// CHECK: stablehlo.while
// CHECK: return %{{.*}} : tensor<4xf32>, tensor<4x4x3xf32>, tensor<4xf32>
module @sharded {
  sdy.mesh @mesh = <["data"=2]>
  func.func @main(%w: tensor<4xf32> {loopfuse.state = "['w']", sdy.sharding = #sdy.sharding<@mesh, [{}]>},
                  %x: tensor<4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>})
      -> (tensor<4xf32> {loopfuse.state = "['w']", sdy.sharding = #sdy.sharding<@mesh, [{}]>},
          tensor<4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>},
          tensor<f32> {sdy.sharding = #sdy.sharding<@mesh, []>}) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    return %w, %x, %z : tensor<4xf32>, tensor<4x3xf32>, tensor<f32>
  }
}

// -----

// (d) An inline mesh in the sharding attribute: the history's new step axis is still unsharded.
// CHECK-LABEL: func.func @main
// CHECK-SAME: tensor<4x2xf32> {sdy.sharding = #sdy.sharding<mesh<["data"=2]>, [{}, {"data"}]>}
func.func @main(%w: tensor<2xf32> {loopfuse.state = "w"}) -> (tensor<2xf32> {loopfuse.state = "w"}, tensor<2xf32> {sdy.sharding = #sdy.sharding<mesh<["data"=2]>, [{"data"}]>}) {
  return %w, %w : tensor<2xf32>, tensor<2xf32>
}

// -----

// (e) Complex and boolean aux results get histories of their own element type, filled with zeros
// first (a complex zero is built from two real zeros).
// CHECK-LABEL: func.func @main(%arg0: tensor<2xf32> {loopfuse.state = "w"}) -> (tensor<2xf32> {loopfuse.state = "w"}, tensor<4x2xcomplex<f32>>, tensor<4xi1>)
// CHECK-DAG: %[[RE:[a-z0-9_]+]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK-DAG: %[[C0:[0-9]+]] = stablehlo.complex %[[RE]], %[[RE]] : tensor<complex<f32>>
// CHECK-DAG: %[[HC:[0-9]+]] = stablehlo.broadcast_in_dim %[[C0]], dims = [] : (tensor<complex<f32>>) -> tensor<4x2xcomplex<f32>>
// CHECK-DAG: %[[B0:[a-z0-9_]+]] = stablehlo.constant dense<false> : tensor<i1>
// CHECK-DAG: %[[HB:[0-9]+]] = stablehlo.broadcast_in_dim %[[B0]], dims = [] : (tensor<i1>) -> tensor<4xi1>
// CHECK: stablehlo.while({{.*}}, %{{[a-zA-Z0-9_]+}} = %[[HC]], %{{[a-zA-Z0-9_]+}} = %[[HB]])
// CHECK: stablehlo.dynamic_update_slice {{.*}} : (tensor<4x2xcomplex<f32>>, tensor<1x2xcomplex<f32>>, tensor<i32>, tensor<i32>) -> tensor<4x2xcomplex<f32>>
func.func @main(%w: tensor<2xf32> {loopfuse.state = "w"}) -> (tensor<2xf32> {loopfuse.state = "w"}, tensor<2xcomplex<f32>>, tensor<i1>) {
  %c = stablehlo.complex %w, %w : tensor<2xcomplex<f32>>
  %z = stablehlo.constant dense<true> : tensor<i1>
  return %w, %c, %z : tensor<2xf32>, tensor<2xcomplex<f32>>, tensor<i1>
}
