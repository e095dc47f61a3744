// RUN: loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// Three blocks x + tanh(x w_l), then an SGD step on the gradient scaled by its global norm, with weight
// decay: new = w - 0.1 g / |g| - 0.01 w (jax's own lowering). The norm needs every layer's gradient, so the
// update runs after the backward loop. Its share that reads no gradient, 0.01 w_l, reads only the layer's
// leaf: it stays where the step computes it, outside the loops (for XLA to fuse into the update), where the
// forward loop saved it per layer before, a stacked copy of the leaves live through both loops.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['blocks'] [0:3]: 3 layers of 14 ops each (4 forward, 10 backward);
// CHECK-SAME: the optimizer update runs after the backward loop
// CHECK: stablehlo.constant dense<0.00999999977>
// CHECK: stablehlo.multiply %{{.*}}, %arg0
// CHECK: stablehlo.multiply %{{.*}}, %arg1
// CHECK: stablehlo.multiply %{{.*}}, %arg2
// The forward loop carries the block's input, its history and the stacked leaves, and saves nothing else:
// CHECK: stablehlo.while({{.*}}) : tensor<i32>, tensor<2x2xf32>, tensor<3x2x2xf32>, tensor<3x2x2xf32>{{$}}
// CHECK: stablehlo.while
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32> {loopfuse.state = "['blocks'][0]['w']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "['blocks'][1]['w']"}, %arg2: tensor<2x2xf32> {loopfuse.state = "['blocks'][2]['w']"}, %arg3: tensor<2x2xf32>) -> (tensor<2x2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 3 : i32}) {
    %0 = stablehlo.dot_general %arg3, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.tanh %0 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2x2xf32>
    %4 = stablehlo.add %arg3, %1 : tensor<2x2xf32>
    %5 = stablehlo.dot_general %4, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %6 = stablehlo.tanh %5 : tensor<2x2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %7 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %8 = stablehlo.subtract %7, %6 : tensor<2x2xf32>
    %9 = stablehlo.add %4, %6 : tensor<2x2xf32>
    %10 = stablehlo.dot_general %9, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %11 = stablehlo.tanh %10 : tensor<2x2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %13 = stablehlo.subtract %12, %11 : tensor<2x2xf32>
    %14 = stablehlo.add %9, %11 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %15 = stablehlo.reduce(%14 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %16 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %17 = stablehlo.multiply %16, %13 : tensor<2x2xf32>
    %18 = stablehlo.multiply %17, %11 : tensor<2x2xf32>
    %19 = stablehlo.add %17, %18 : tensor<2x2xf32>
    %20 = stablehlo.dot_general %19, %9, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %21 = stablehlo.transpose %20, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %22 = stablehlo.dot_general %19, %arg2, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %23 = stablehlo.add %16, %22 : tensor<2x2xf32>
    %24 = stablehlo.multiply %23, %8 : tensor<2x2xf32>
    %25 = stablehlo.multiply %24, %6 : tensor<2x2xf32>
    %26 = stablehlo.add %24, %25 : tensor<2x2xf32>
    %27 = stablehlo.dot_general %26, %4, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %28 = stablehlo.transpose %27, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %29 = stablehlo.dot_general %26, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %30 = stablehlo.add %23, %29 : tensor<2x2xf32>
    %31 = stablehlo.multiply %30, %3 : tensor<2x2xf32>
    %32 = stablehlo.multiply %31, %1 : tensor<2x2xf32>
    %33 = stablehlo.add %31, %32 : tensor<2x2xf32>
    %34 = stablehlo.dot_general %33, %arg3, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %35 = stablehlo.transpose %34, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %36 = stablehlo.multiply %35, %35 : tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %37 = stablehlo.reduce(%36 init: %cst_4) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %38 = stablehlo.add %cst_5, %37 : tensor<f32>
    %39 = stablehlo.multiply %28, %28 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %40 = stablehlo.reduce(%39 init: %cst_6) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %41 = stablehlo.add %38, %40 : tensor<f32>
    %42 = stablehlo.multiply %21, %21 : tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %43 = stablehlo.reduce(%42 init: %cst_7) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %44 = stablehlo.add %41, %43 : tensor<f32>
    %45 = stablehlo.sqrt %44 : tensor<f32>
    %cst_8 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %47 = stablehlo.multiply %46, %35 : tensor<2x2xf32>
    %48 = stablehlo.broadcast_in_dim %45, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %49 = stablehlo.divide %47, %48 : tensor<2x2xf32>
    %50 = stablehlo.subtract %arg0, %49 : tensor<2x2xf32>
    %cst_9 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %51 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %52 = stablehlo.multiply %51, %arg0 : tensor<2x2xf32>
    %53 = stablehlo.subtract %50, %52 : tensor<2x2xf32>
    %cst_10 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %54 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %55 = stablehlo.multiply %54, %28 : tensor<2x2xf32>
    %56 = stablehlo.broadcast_in_dim %45, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %57 = stablehlo.divide %55, %56 : tensor<2x2xf32>
    %58 = stablehlo.subtract %arg1, %57 : tensor<2x2xf32>
    %cst_11 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %59 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %60 = stablehlo.multiply %59, %arg1 : tensor<2x2xf32>
    %61 = stablehlo.subtract %58, %60 : tensor<2x2xf32>
    %cst_12 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %62 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %63 = stablehlo.multiply %62, %21 : tensor<2x2xf32>
    %64 = stablehlo.broadcast_in_dim %45, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %65 = stablehlo.divide %63, %64 : tensor<2x2xf32>
    %66 = stablehlo.subtract %arg2, %65 : tensor<2x2xf32>
    %cst_13 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %67 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %68 = stablehlo.multiply %67, %arg2 : tensor<2x2xf32>
    %69 = stablehlo.subtract %66, %68 : tensor<2x2xf32>
    return %53, %61, %69, %15 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}
