// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(micro-batch{slices=2},roll-layers{force=true})' | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(micro-batch{slices=2},roll-layers{force=true})' | not grep loopfuse.sunk

// Each case is a traced SGD step of x0 = x * v; x_{l+1} = x_l + f_l(tanh(x_l * sigmoid(g_l))); loss = sum(x_L)
// over three layers ['g'][l] (jax's own lowering, cut to @main), cut into two micro-batches, then rolled.
// micro-batch computes each layer's sigmoid(g_l) once, before its loop (it does not read the batch), so
// inside the loop's body no layer's op reads its leaf; roll-layers sinks those ops into the body first.

// (a) f_l = identity at every layer: the sunk sigmoids roll with their layers. Inside the micro-batch
// loop, the rolled loops compute sigmoid from each layer's row of the stacked leaves. The constants
// sink with them (the layers' copies of 1.0 are one value in the body): the leaves are the one stack.
// What sank but rolled with no layer (v's broadcast) goes back before the loop, as micro-batch had it.
// The slices' sums of the layers' gradients, three carries of the micro-batch loop, are one stacked carry
// (zeros at first) that the backward loop starts from, adding each layer's gradient to its row in place:
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['g'] [0:3]: 3 layers of 17 ops each (10 forward, 7 backward)
// CHECK-SAME: adds 1 per layer to the slices' sums, in place in stacks the micro-batch loop carries
// CHECK: stablehlo.concatenate {{.*}} -> tensor<3x2xf32>
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[ZEROS:[0-9]+]] = stablehlo.broadcast_in_dim %{{[a-z0-9_]+}}, dims = [] : (tensor<f32>) -> tensor<3x2xf32>
// CHECK: %[[V:[0-9]+]] = stablehlo.broadcast_in_dim %arg3, dims = [1]
// CHECK: stablehlo.while({{.*}}, %[[SUMS:iterArg_[0-9]+]] = %[[ZEROS]]) : tensor<i32>, tensor<f32>, tensor<2xf32>, tensor<3x2xf32> attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: } do {
// CHECK-NOT: %arg3
// CHECK: stablehlo.broadcast_in_dim %[[V]], dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
// CHECK-NOT: stablehlo.negate %{{[a-z0-9_]+}} : tensor<2xf32>
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: %[[ROW:[0-9]+]] = stablehlo.dynamic_slice
// CHECK: %[[G:[0-9]+]] = stablehlo.reshape %[[ROW]] : (tensor<1x2xf32>) -> tensor<2xf32>
// CHECK: stablehlo.negate %[[G]] : tensor<2xf32>
// CHECK: stablehlo.exponential
// CHECK: stablehlo.divide
// CHECK: stablehlo.tanh
// CHECK: %[[BWD:[0-9]+]]:3 = stablehlo.while({{.*}}, %[[ROWS:iterArg_[0-9]+]] = %[[SUMS]])
// CHECK: } do {
// CHECK: %[[GRAD:[0-9]+]] = stablehlo.reduce
// CHECK: %[[OLD:[0-9]+]] = stablehlo.dynamic_slice %[[ROWS]], %[[LAYER:[0-9]+]],
// CHECK: %[[SUM:[0-9]+]] = stablehlo.reshape %[[OLD]]
// CHECK: %[[NEW:[0-9]+]] = stablehlo.add %[[SUM]], %[[GRAD]] : tensor<2xf32>
// CHECK: %[[ROW:[0-9]+]] = stablehlo.reshape %[[NEW]]
// CHECK: stablehlo.dynamic_update_slice %[[ROWS]], %[[ROW]], %[[LAYER]],
// CHECK: stablehlo.return %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %[[BWD]]#2 : tensor<i32>, tensor<f32>, tensor<2xf32>, tensor<3x2xf32>
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['g'][0]"}, %arg1: tensor<2xf32> {loopfuse.state = "['g'][1]"}, %arg2: tensor<2xf32> {loopfuse.state = "['g'][2]"}, %arg3: tensor<2xf32> {loopfuse.state = "['v']"}, %arg4: tensor<4x2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['g'][0]"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['g'][1]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['g'][2]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['v']"}, tensor<f32> {loopfuse.result = 4 : i32}) {
  %0 = stablehlo.broadcast_in_dim %arg3, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %2 = stablehlo.multiply %arg4, %1 : tensor<4x2xf32>
  %3 = stablehlo.negate %arg0 : tensor<2xf32>
  %4 = stablehlo.exponential %3 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %6 = stablehlo.add %5, %4 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %8 = stablehlo.divide %7, %6 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %9 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
  %11 = stablehlo.multiply %8, %10 : tensor<2xf32>
  %12 = stablehlo.broadcast_in_dim %8, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %13 = stablehlo.broadcast_in_dim %12, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %14 = stablehlo.multiply %2, %13 : tensor<4x2xf32>
  %15 = stablehlo.tanh %14 : tensor<4x2xf32>
  %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %16 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %17 = stablehlo.subtract %16, %15 : tensor<4x2xf32>
  %18 = stablehlo.add %2, %15 : tensor<4x2xf32>
  %19 = stablehlo.negate %arg1 : tensor<2xf32>
  %20 = stablehlo.exponential %19 : tensor<2xf32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %22 = stablehlo.add %21, %20 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %23 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %24 = stablehlo.divide %23, %22 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %26 = stablehlo.subtract %25, %24 : tensor<2xf32>
  %27 = stablehlo.multiply %24, %26 : tensor<2xf32>
  %28 = stablehlo.broadcast_in_dim %24, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %30 = stablehlo.multiply %18, %29 : tensor<4x2xf32>
  %31 = stablehlo.tanh %30 : tensor<4x2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %32 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %33 = stablehlo.subtract %32, %31 : tensor<4x2xf32>
  %34 = stablehlo.add %18, %31 : tensor<4x2xf32>
  %35 = stablehlo.negate %arg2 : tensor<2xf32>
  %36 = stablehlo.exponential %35 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %37 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %38 = stablehlo.add %37, %36 : tensor<2xf32>
  %cst_8 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %39 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %40 = stablehlo.divide %39, %38 : tensor<2xf32>
  %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %41 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %42 = stablehlo.subtract %41, %40 : tensor<2xf32>
  %43 = stablehlo.multiply %40, %42 : tensor<2xf32>
  %44 = stablehlo.broadcast_in_dim %40, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %45 = stablehlo.broadcast_in_dim %44, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %46 = stablehlo.multiply %34, %45 : tensor<4x2xf32>
  %47 = stablehlo.tanh %46 : tensor<4x2xf32>
  %cst_10 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %48 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %49 = stablehlo.subtract %48, %47 : tensor<4x2xf32>
  %50 = stablehlo.add %34, %47 : tensor<4x2xf32>
  %cst_11 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %51 = stablehlo.reduce(%50 init: %cst_11) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_12 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %52 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %53 = stablehlo.multiply %52, %49 : tensor<4x2xf32>
  %54 = stablehlo.multiply %53, %47 : tensor<4x2xf32>
  %55 = stablehlo.add %53, %54 : tensor<4x2xf32>
  %56 = stablehlo.multiply %34, %55 : tensor<4x2xf32>
  %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %57 = stablehlo.reduce(%56 init: %cst_13) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %58 = stablehlo.reshape %57 : (tensor<2xf32>) -> tensor<1x2xf32>
  %59 = stablehlo.broadcast_in_dim %44, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %60 = stablehlo.multiply %55, %59 : tensor<4x2xf32>
  %61 = stablehlo.add %52, %60 : tensor<4x2xf32>
  %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %62 = stablehlo.reduce(%58 init: %cst_14) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %63 = stablehlo.multiply %62, %43 : tensor<2xf32>
  %64 = stablehlo.multiply %61, %33 : tensor<4x2xf32>
  %65 = stablehlo.multiply %64, %31 : tensor<4x2xf32>
  %66 = stablehlo.add %64, %65 : tensor<4x2xf32>
  %67 = stablehlo.multiply %18, %66 : tensor<4x2xf32>
  %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %68 = stablehlo.reduce(%67 init: %cst_15) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %69 = stablehlo.reshape %68 : (tensor<2xf32>) -> tensor<1x2xf32>
  %70 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %71 = stablehlo.multiply %66, %70 : tensor<4x2xf32>
  %72 = stablehlo.add %61, %71 : tensor<4x2xf32>
  %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %73 = stablehlo.reduce(%69 init: %cst_16) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %74 = stablehlo.multiply %73, %27 : tensor<2xf32>
  %75 = stablehlo.multiply %72, %17 : tensor<4x2xf32>
  %76 = stablehlo.multiply %75, %15 : tensor<4x2xf32>
  %77 = stablehlo.add %75, %76 : tensor<4x2xf32>
  %78 = stablehlo.multiply %2, %77 : tensor<4x2xf32>
  %cst_17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %79 = stablehlo.reduce(%78 init: %cst_17) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %80 = stablehlo.reshape %79 : (tensor<2xf32>) -> tensor<1x2xf32>
  %81 = stablehlo.broadcast_in_dim %12, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %82 = stablehlo.multiply %77, %81 : tensor<4x2xf32>
  %83 = stablehlo.add %72, %82 : tensor<4x2xf32>
  %cst_18 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %84 = stablehlo.reduce(%80 init: %cst_18) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %85 = stablehlo.multiply %84, %11 : tensor<2xf32>
  %86 = stablehlo.multiply %arg4, %83 : tensor<4x2xf32>
  %cst_19 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %87 = stablehlo.reduce(%86 init: %cst_19) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %88 = stablehlo.reshape %87 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_20 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %89 = stablehlo.reduce(%88 init: %cst_20) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %cst_21 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %90 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %91 = stablehlo.multiply %90, %85 : tensor<2xf32>
  %92 = stablehlo.subtract %arg0, %91 : tensor<2xf32>
  %cst_22 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %93 = stablehlo.broadcast_in_dim %cst_22, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %94 = stablehlo.multiply %93, %74 : tensor<2xf32>
  %95 = stablehlo.subtract %arg1, %94 : tensor<2xf32>
  %cst_23 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %96 = stablehlo.broadcast_in_dim %cst_23, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %97 = stablehlo.multiply %96, %63 : tensor<2xf32>
  %98 = stablehlo.subtract %arg2, %97 : tensor<2xf32>
  %cst_24 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %99 = stablehlo.broadcast_in_dim %cst_24, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %100 = stablehlo.multiply %99, %89 : tensor<2xf32>
  %101 = stablehlo.subtract %arg3, %100 : tensor<2xf32>
  return %92, %95, %98, %101, %51 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (b) f_1 = cos, the others identity: layer 1's ops differ, nothing rolls, and the body is put back as
// micro-batch left it, reading the sigmoids computed before the loop.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "did not roll ['g'] [0:3]
// CHECK: stablehlo.negate %arg0 : tensor<2xf32>
// CHECK: stablehlo.negate %arg1 : tensor<2xf32>
// CHECK: stablehlo.negate %arg2 : tensor<2xf32>
// CHECK: stablehlo.while{{.*}}attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: } do {
// CHECK-NOT: stablehlo.negate %{{[a-z0-9_]+}} : tensor<2xf32>
// CHECK: stablehlo.return %{{.*}} : tensor<i32>, tensor<f32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['g'][0]"}, %arg1: tensor<2xf32> {loopfuse.state = "['g'][1]"}, %arg2: tensor<2xf32> {loopfuse.state = "['g'][2]"}, %arg3: tensor<2xf32> {loopfuse.state = "['v']"}, %arg4: tensor<4x2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['g'][0]"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['g'][1]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['g'][2]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['v']"}, tensor<f32> {loopfuse.result = 4 : i32}) {
  %0 = stablehlo.broadcast_in_dim %arg3, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %2 = stablehlo.multiply %arg4, %1 : tensor<4x2xf32>
  %3 = stablehlo.negate %arg0 : tensor<2xf32>
  %4 = stablehlo.exponential %3 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %6 = stablehlo.add %5, %4 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %8 = stablehlo.divide %7, %6 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %9 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
  %11 = stablehlo.multiply %8, %10 : tensor<2xf32>
  %12 = stablehlo.broadcast_in_dim %8, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %13 = stablehlo.broadcast_in_dim %12, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %14 = stablehlo.multiply %2, %13 : tensor<4x2xf32>
  %15 = stablehlo.tanh %14 : tensor<4x2xf32>
  %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %16 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %17 = stablehlo.subtract %16, %15 : tensor<4x2xf32>
  %18 = stablehlo.add %2, %15 : tensor<4x2xf32>
  %19 = stablehlo.negate %arg1 : tensor<2xf32>
  %20 = stablehlo.exponential %19 : tensor<2xf32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %22 = stablehlo.add %21, %20 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %23 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %24 = stablehlo.divide %23, %22 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %26 = stablehlo.subtract %25, %24 : tensor<2xf32>
  %27 = stablehlo.multiply %24, %26 : tensor<2xf32>
  %28 = stablehlo.broadcast_in_dim %24, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %30 = stablehlo.multiply %18, %29 : tensor<4x2xf32>
  %31 = stablehlo.tanh %30 : tensor<4x2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %32 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %33 = stablehlo.subtract %32, %31 : tensor<4x2xf32>
  %34 = stablehlo.cosine %31 : tensor<4x2xf32>
  %35 = stablehlo.sine %31 : tensor<4x2xf32>
  %36 = stablehlo.add %18, %34 : tensor<4x2xf32>
  %37 = stablehlo.negate %arg2 : tensor<2xf32>
  %38 = stablehlo.exponential %37 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %39 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %40 = stablehlo.add %39, %38 : tensor<2xf32>
  %cst_8 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %41 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %42 = stablehlo.divide %41, %40 : tensor<2xf32>
  %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %43 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %44 = stablehlo.subtract %43, %42 : tensor<2xf32>
  %45 = stablehlo.multiply %42, %44 : tensor<2xf32>
  %46 = stablehlo.broadcast_in_dim %42, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %48 = stablehlo.multiply %36, %47 : tensor<4x2xf32>
  %49 = stablehlo.tanh %48 : tensor<4x2xf32>
  %cst_10 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %50 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %51 = stablehlo.subtract %50, %49 : tensor<4x2xf32>
  %52 = stablehlo.add %36, %49 : tensor<4x2xf32>
  %cst_11 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %53 = stablehlo.reduce(%52 init: %cst_11) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_12 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %54 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<4x2xf32>
  %55 = stablehlo.multiply %54, %51 : tensor<4x2xf32>
  %56 = stablehlo.multiply %55, %49 : tensor<4x2xf32>
  %57 = stablehlo.add %55, %56 : tensor<4x2xf32>
  %58 = stablehlo.multiply %36, %57 : tensor<4x2xf32>
  %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %59 = stablehlo.reduce(%58 init: %cst_13) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %60 = stablehlo.reshape %59 : (tensor<2xf32>) -> tensor<1x2xf32>
  %61 = stablehlo.broadcast_in_dim %46, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %62 = stablehlo.multiply %57, %61 : tensor<4x2xf32>
  %63 = stablehlo.add %54, %62 : tensor<4x2xf32>
  %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %64 = stablehlo.reduce(%60 init: %cst_14) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %65 = stablehlo.multiply %64, %45 : tensor<2xf32>
  %66 = stablehlo.negate %63 : tensor<4x2xf32>
  %67 = stablehlo.multiply %66, %35 : tensor<4x2xf32>
  %68 = stablehlo.multiply %67, %33 : tensor<4x2xf32>
  %69 = stablehlo.multiply %68, %31 : tensor<4x2xf32>
  %70 = stablehlo.add %68, %69 : tensor<4x2xf32>
  %71 = stablehlo.multiply %18, %70 : tensor<4x2xf32>
  %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %72 = stablehlo.reduce(%71 init: %cst_15) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %73 = stablehlo.reshape %72 : (tensor<2xf32>) -> tensor<1x2xf32>
  %74 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %75 = stablehlo.multiply %70, %74 : tensor<4x2xf32>
  %76 = stablehlo.add %63, %75 : tensor<4x2xf32>
  %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %77 = stablehlo.reduce(%73 init: %cst_16) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %78 = stablehlo.multiply %77, %27 : tensor<2xf32>
  %79 = stablehlo.multiply %76, %17 : tensor<4x2xf32>
  %80 = stablehlo.multiply %79, %15 : tensor<4x2xf32>
  %81 = stablehlo.add %79, %80 : tensor<4x2xf32>
  %82 = stablehlo.multiply %2, %81 : tensor<4x2xf32>
  %cst_17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %83 = stablehlo.reduce(%82 init: %cst_17) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %84 = stablehlo.reshape %83 : (tensor<2xf32>) -> tensor<1x2xf32>
  %85 = stablehlo.broadcast_in_dim %12, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<4x2xf32>
  %86 = stablehlo.multiply %81, %85 : tensor<4x2xf32>
  %87 = stablehlo.add %76, %86 : tensor<4x2xf32>
  %cst_18 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %88 = stablehlo.reduce(%84 init: %cst_18) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %89 = stablehlo.multiply %88, %11 : tensor<2xf32>
  %90 = stablehlo.multiply %arg4, %87 : tensor<4x2xf32>
  %cst_19 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %91 = stablehlo.reduce(%90 init: %cst_19) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %92 = stablehlo.reshape %91 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_20 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %93 = stablehlo.reduce(%92 init: %cst_20) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %cst_21 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %94 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %95 = stablehlo.multiply %94, %89 : tensor<2xf32>
  %96 = stablehlo.subtract %arg0, %95 : tensor<2xf32>
  %cst_22 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %97 = stablehlo.broadcast_in_dim %cst_22, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %98 = stablehlo.multiply %97, %78 : tensor<2xf32>
  %99 = stablehlo.subtract %arg1, %98 : tensor<2xf32>
  %cst_23 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %100 = stablehlo.broadcast_in_dim %cst_23, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %101 = stablehlo.multiply %100, %65 : tensor<2xf32>
  %102 = stablehlo.subtract %arg2, %101 : tensor<2xf32>
  %cst_24 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %103 = stablehlo.broadcast_in_dim %cst_24, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %104 = stablehlo.multiply %103, %93 : tensor<2xf32>
  %105 = stablehlo.subtract %arg3, %104 : tensor<2xf32>
  return %96, %99, %102, %105, %53 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (c) The same chain x_{l+1} = x_l + tanh(x_l * w_l) over three layers, the state packed with its layers
// stacked (`loopfuse.pack(state, layers=True)`: one buffer of three rows). After the micro-batch loop the
// update (w_l - 0.1 * g_l) runs once, at every layer alike: unrolled, it restacks the buffer with a
// concatenate, which XLA:CPU compiles to a copy of the donated buffer. It rolls into one loop over the
// rows (an update run) that writes each layer's new row in place, the row read at the next iteration,
// layer 0's in a loop of its own after it; the gradients are read as rows of the stacked sums:
// CHECK-LABEL: module
// CHECK-SAME: rolled the update of ['w'] [0:3]: 3 layers of 5 ops each, one loop writing the rows of 1 stacked leaf in place"
// CHECK: %[[MB:[0-9]+]]:3 = stablehlo.while{{.*}}attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: %[[BUF:[0-9]+]] = stablehlo.reshape %arg0 : (tensor<6xf32>) -> tensor<3x2xf32>
// CHECK: stablehlo.compare NE, %[[MB]]#1, %[[MB]]#1
// CHECK: %[[UPD:[0-9]+]]:3 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-zA-Z0-9_]+}}, %[[ROWS:iterArg_[0-9]+]] = %[[BUF]], %{{[a-zA-Z0-9_]+}} = %{{[0-9]+}})
// CHECK: } do {
// CHECK: %[[LAYER:[0-9]+]] = stablehlo.subtract %{{[a-zA-Z0-9_]+}}, %iterArg
// CHECK: %[[NEW:[0-9]+]] = stablehlo.dynamic_update_slice %[[ROWS]], %{{[0-9]+}}, %{{[0-9]+}}, %{{[a-zA-Z0-9_]+}}
// CHECK: stablehlo.dynamic_slice %[[MB]]#2, %[[LAYER]],
// CHECK: stablehlo.multiply
// CHECK: stablehlo.dynamic_slice %[[NEW]], %[[LAYER]],
// CHECK: %[[ROW:[0-9]+]] = stablehlo.subtract
// CHECK: stablehlo.return %{{[0-9]+}}, %[[NEW]], %[[ROW]] : tensor<i32>, tensor<3x2xf32>, tensor<2xf32>
// CHECK: stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-zA-Z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %[[UPD]]#1, %{{[a-zA-Z0-9_]+}} = %[[UPD]]#2)
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[OUT:[0-9]+]] = stablehlo.reshape %{{[0-9]+}}#1 : (tensor<3x2xf32>) -> tensor<6xf32>
// CHECK: return %[[OUT]], %[[MB]]#1
func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2x2xf32>) -> (tensor<6xf32> {loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}, tensor<f32> {loopfuse.result = 1 : i32}) {
  %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
  %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
  %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
  %3 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %5 = stablehlo.multiply %arg1, %4 : tensor<2x2xf32>
  %6 = stablehlo.tanh %5 : tensor<2x2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %8 = stablehlo.subtract %7, %6 : tensor<2x2xf32>
  %9 = stablehlo.add %arg1, %6 : tensor<2x2xf32>
  %10 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
  %13 = stablehlo.tanh %12 : tensor<2x2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %14 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %15 = stablehlo.subtract %14, %13 : tensor<2x2xf32>
  %16 = stablehlo.add %9, %13 : tensor<2x2xf32>
  %17 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %19 = stablehlo.multiply %16, %18 : tensor<2x2xf32>
  %20 = stablehlo.tanh %19 : tensor<2x2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %22 = stablehlo.subtract %21, %20 : tensor<2x2xf32>
  %23 = stablehlo.add %16, %20 : tensor<2x2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %24 = stablehlo.reduce(%23 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %26 = stablehlo.multiply %25, %22 : tensor<2x2xf32>
  %27 = stablehlo.multiply %26, %20 : tensor<2x2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2x2xf32>
  %29 = stablehlo.multiply %16, %28 : tensor<2x2xf32>
  %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %30 = stablehlo.reduce(%29 init: %cst_4) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %31 = stablehlo.reshape %30 : (tensor<2xf32>) -> tensor<1x2xf32>
  %32 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %33 = stablehlo.multiply %28, %32 : tensor<2x2xf32>
  %34 = stablehlo.add %25, %33 : tensor<2x2xf32>
  %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %35 = stablehlo.reduce(%31 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %36 = stablehlo.multiply %34, %15 : tensor<2x2xf32>
  %37 = stablehlo.multiply %36, %13 : tensor<2x2xf32>
  %38 = stablehlo.add %36, %37 : tensor<2x2xf32>
  %39 = stablehlo.multiply %9, %38 : tensor<2x2xf32>
  %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %40 = stablehlo.reduce(%39 init: %cst_6) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.reshape %40 : (tensor<2xf32>) -> tensor<1x2xf32>
  %42 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %43 = stablehlo.multiply %38, %42 : tensor<2x2xf32>
  %44 = stablehlo.add %34, %43 : tensor<2x2xf32>
  %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %45 = stablehlo.reduce(%41 init: %cst_7) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %46 = stablehlo.multiply %44, %8 : tensor<2x2xf32>
  %47 = stablehlo.multiply %46, %6 : tensor<2x2xf32>
  %48 = stablehlo.add %46, %47 : tensor<2x2xf32>
  %49 = stablehlo.multiply %arg1, %48 : tensor<2x2xf32>
  %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %50 = stablehlo.reduce(%49 init: %cst_8) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %51 = stablehlo.reshape %50 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_9 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %52 = stablehlo.reduce(%51 init: %cst_9) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %cst_10 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %53 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %54 = stablehlo.multiply %53, %52 : tensor<2xf32>
  %55 = stablehlo.subtract %0, %54 : tensor<2xf32>
  %cst_11 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %56 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %57 = stablehlo.multiply %56, %45 : tensor<2xf32>
  %58 = stablehlo.subtract %1, %57 : tensor<2xf32>
  %cst_12 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %59 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %60 = stablehlo.multiply %59, %35 : tensor<2xf32>
  %61 = stablehlo.subtract %2, %60 : tensor<2xf32>
  %62 = stablehlo.concatenate %55, %58, %61, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
  return %62, %24 : tensor<6xf32>, tensor<f32>
}

// -----

// (d) As (c), with layer 0's learning rate 0.2 and the others' 0.1, each a constant of the leaf's shape
// (CSE leaves layers 1 and 2 one constant), so the update run is layers 1-2 and layer 0 is left as it is.
// The buffer's row of layer 0 is read into a buffer of its own in a loop before anything else, its update
// computed from it, and its new row written over the update loop's result in another loop, after it: no
// concatenate rebuilds the buffer.
// CHECK-LABEL: module
// CHECK-SAME: rolled the update of ['w'] [1:3]: 2 layers of 5 ops each, one loop writing the rows of 1 stacked leaf in place; layer 0 left as it is: its ops differ from the others'"
// CHECK: %[[READ:[0-9]+]]:3 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-zA-Z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %arg0,
// CHECK: stablehlo.dynamic_slice %iterArg_{{[0-9]+}}, %c{{[_0-9]*}}, sizes = [2] : (tensor<6xf32>, tensor<i32>) -> tensor<2xf32>
// CHECK: %[[MB:[0-9]+]]:3 = stablehlo.while{{.*}}attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: stablehlo.subtract %[[READ]]#2, %{{[0-9]+}} : tensor<2xf32>
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: stablehlo.dynamic_update_slice
// CHECK: stablehlo.dynamic_slice %[[MB]]#2
// CHECK: stablehlo.subtract
// CHECK-NOT: stablehlo.concatenate
// CHECK: stablehlo.dynamic_update_slice %iterArg_{{[0-9]+}}, %iterArg_{{[0-9]+}}, %c{{[_0-9]*}} : (tensor<6xf32>, tensor<2xf32>, tensor<i32>) -> tensor<6xf32>
// CHECK: return
func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2x2xf32>) -> (tensor<6xf32> {loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}, tensor<f32> {loopfuse.result = 1 : i32}) {
  %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
  %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
  %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
  %3 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %5 = stablehlo.multiply %arg1, %4 : tensor<2x2xf32>
  %6 = stablehlo.tanh %5 : tensor<2x2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %8 = stablehlo.subtract %7, %6 : tensor<2x2xf32>
  %9 = stablehlo.add %arg1, %6 : tensor<2x2xf32>
  %10 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
  %13 = stablehlo.tanh %12 : tensor<2x2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %14 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %15 = stablehlo.subtract %14, %13 : tensor<2x2xf32>
  %16 = stablehlo.add %9, %13 : tensor<2x2xf32>
  %17 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %19 = stablehlo.multiply %16, %18 : tensor<2x2xf32>
  %20 = stablehlo.tanh %19 : tensor<2x2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %22 = stablehlo.subtract %21, %20 : tensor<2x2xf32>
  %23 = stablehlo.add %16, %20 : tensor<2x2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %24 = stablehlo.reduce(%23 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %26 = stablehlo.multiply %25, %22 : tensor<2x2xf32>
  %27 = stablehlo.multiply %26, %20 : tensor<2x2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2x2xf32>
  %29 = stablehlo.multiply %16, %28 : tensor<2x2xf32>
  %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %30 = stablehlo.reduce(%29 init: %cst_4) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %31 = stablehlo.reshape %30 : (tensor<2xf32>) -> tensor<1x2xf32>
  %32 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %33 = stablehlo.multiply %28, %32 : tensor<2x2xf32>
  %34 = stablehlo.add %25, %33 : tensor<2x2xf32>
  %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %35 = stablehlo.reduce(%31 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %36 = stablehlo.multiply %34, %15 : tensor<2x2xf32>
  %37 = stablehlo.multiply %36, %13 : tensor<2x2xf32>
  %38 = stablehlo.add %36, %37 : tensor<2x2xf32>
  %39 = stablehlo.multiply %9, %38 : tensor<2x2xf32>
  %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %40 = stablehlo.reduce(%39 init: %cst_6) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.reshape %40 : (tensor<2xf32>) -> tensor<1x2xf32>
  %42 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %43 = stablehlo.multiply %38, %42 : tensor<2x2xf32>
  %44 = stablehlo.add %34, %43 : tensor<2x2xf32>
  %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %45 = stablehlo.reduce(%41 init: %cst_7) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %46 = stablehlo.multiply %44, %8 : tensor<2x2xf32>
  %47 = stablehlo.multiply %46, %6 : tensor<2x2xf32>
  %48 = stablehlo.add %46, %47 : tensor<2x2xf32>
  %49 = stablehlo.multiply %arg1, %48 : tensor<2x2xf32>
  %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %50 = stablehlo.reduce(%49 init: %cst_8) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %51 = stablehlo.reshape %50 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_9 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %52 = stablehlo.reduce(%51 init: %cst_9) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %53 = stablehlo.constant dense<2.000000e-01> : tensor<2xf32>
  %54 = stablehlo.multiply %53, %52 : tensor<2xf32>
  %55 = stablehlo.subtract %0, %54 : tensor<2xf32>
  %56 = stablehlo.constant dense<1.000000e-01> : tensor<2xf32>
  %57 = stablehlo.multiply %56, %45 : tensor<2xf32>
  %58 = stablehlo.subtract %1, %57 : tensor<2xf32>
  %59 = stablehlo.constant dense<1.000000e-01> : tensor<2xf32>
  %60 = stablehlo.multiply %59, %35 : tensor<2xf32>
  %61 = stablehlo.subtract %2, %60 : tensor<2xf32>
  %62 = stablehlo.concatenate %55, %58, %61, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
  return %62, %24 : tensor<6xf32>, tensor<f32>
}

// -----

// (e) As (d), with the rates broadcasts of 0.2, 0.1 and 0.3 and layer 0's multiply's operands swapped:
// the run [1:3]'s rates are read through a value carried between layers, which an update run does not
// hold, and the whole run would stack its gradients and read a left-out row for what it saves (a tie:
// 24 B each way), so the update is left as micro-batch made it.
// CHECK-LABEL: module
// CHECK-SAME: did not roll the update of ['w'] [0:3]: stacking the values that differ by layer inside each call would cost 24 B of temporaries, more than the ~24 B of copies rolling saves
// CHECK: stablehlo.while{{.*}}attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: stablehlo.concatenate {{.*}} -> tensor<6xf32>
func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2x2xf32>) -> (tensor<6xf32> {loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}, tensor<f32> {loopfuse.result = 1 : i32}) {
  %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
  %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
  %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
  %3 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %5 = stablehlo.multiply %arg1, %4 : tensor<2x2xf32>
  %6 = stablehlo.tanh %5 : tensor<2x2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %8 = stablehlo.subtract %7, %6 : tensor<2x2xf32>
  %9 = stablehlo.add %arg1, %6 : tensor<2x2xf32>
  %10 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
  %13 = stablehlo.tanh %12 : tensor<2x2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %14 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %15 = stablehlo.subtract %14, %13 : tensor<2x2xf32>
  %16 = stablehlo.add %9, %13 : tensor<2x2xf32>
  %17 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %19 = stablehlo.multiply %16, %18 : tensor<2x2xf32>
  %20 = stablehlo.tanh %19 : tensor<2x2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %22 = stablehlo.subtract %21, %20 : tensor<2x2xf32>
  %23 = stablehlo.add %16, %20 : tensor<2x2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %24 = stablehlo.reduce(%23 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %26 = stablehlo.multiply %25, %22 : tensor<2x2xf32>
  %27 = stablehlo.multiply %26, %20 : tensor<2x2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2x2xf32>
  %29 = stablehlo.multiply %16, %28 : tensor<2x2xf32>
  %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %30 = stablehlo.reduce(%29 init: %cst_4) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %31 = stablehlo.reshape %30 : (tensor<2xf32>) -> tensor<1x2xf32>
  %32 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %33 = stablehlo.multiply %28, %32 : tensor<2x2xf32>
  %34 = stablehlo.add %25, %33 : tensor<2x2xf32>
  %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %35 = stablehlo.reduce(%31 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %36 = stablehlo.multiply %34, %15 : tensor<2x2xf32>
  %37 = stablehlo.multiply %36, %13 : tensor<2x2xf32>
  %38 = stablehlo.add %36, %37 : tensor<2x2xf32>
  %39 = stablehlo.multiply %9, %38 : tensor<2x2xf32>
  %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %40 = stablehlo.reduce(%39 init: %cst_6) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.reshape %40 : (tensor<2xf32>) -> tensor<1x2xf32>
  %42 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %43 = stablehlo.multiply %38, %42 : tensor<2x2xf32>
  %44 = stablehlo.add %34, %43 : tensor<2x2xf32>
  %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %45 = stablehlo.reduce(%41 init: %cst_7) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %46 = stablehlo.multiply %44, %8 : tensor<2x2xf32>
  %47 = stablehlo.multiply %46, %6 : tensor<2x2xf32>
  %48 = stablehlo.add %46, %47 : tensor<2x2xf32>
  %49 = stablehlo.multiply %arg1, %48 : tensor<2x2xf32>
  %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %50 = stablehlo.reduce(%49 init: %cst_8) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %51 = stablehlo.reshape %50 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_9 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %52 = stablehlo.reduce(%51 init: %cst_9) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %cst_10 = stablehlo.constant dense<2.000000e-01> : tensor<f32>
  %53 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %54 = stablehlo.multiply %52, %53 : tensor<2xf32>
  %55 = stablehlo.subtract %0, %54 : tensor<2xf32>
  %cst_11 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %56 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %57 = stablehlo.multiply %56, %45 : tensor<2xf32>
  %58 = stablehlo.subtract %1, %57 : tensor<2xf32>
  %cst_12 = stablehlo.constant dense<3.000000e-01> : tensor<f32>
  %59 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %60 = stablehlo.multiply %59, %35 : tensor<2xf32>
  %61 = stablehlo.subtract %2, %60 : tensor<2xf32>
  %62 = stablehlo.concatenate %55, %58, %61, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
  return %62, %24 : tensor<6xf32>, tensor<f32>
}

// -----

// (f) As (d) with its rates broadcasts of 0.2 and 0.1 (CSE leaves layers 1 and 2 one broadcast of 0.1), as
// (d) was traced: each layer's rate is a broadcast of a scalar, so the update run is all three layers, the
// scalars stacked and broadcast in the update loop (stacked as broadcasts, the rates cost as much as what
// the run saves: then it was layers 0-1, layer 2 left as it is).
// CHECK-LABEL: module
// CHECK-SAME: rolled the update of ['w'] [0:3]: 3 layers of 5 ops each, one loop writing the rows of 1 stacked leaf in place"
// CHECK: stablehlo.while{{.*}}attributes {loopfuse.micro_batch = 2 : i32}
// CHECK: %[[RATES:[0-9]+]] = stablehlo.concatenate %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, dim = 0 : (tensor<1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<3xf32>
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: %[[ROW:[0-9]+]] = stablehlo.dynamic_slice %[[RATES]], %{{[0-9]+}}, sizes = [1]
// CHECK-NEXT: %[[RATE:[0-9]+]] = stablehlo.reshape %[[ROW]] : (tensor<1xf32>) -> tensor<f32>
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[RATE]], dims = [] : (tensor<f32>) -> tensor<2xf32>
func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2x2xf32>) -> (tensor<6xf32> {loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}, tensor<f32> {loopfuse.result = 1 : i32}) {
  %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
  %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
  %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
  %3 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %5 = stablehlo.multiply %arg1, %4 : tensor<2x2xf32>
  %6 = stablehlo.tanh %5 : tensor<2x2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %8 = stablehlo.subtract %7, %6 : tensor<2x2xf32>
  %9 = stablehlo.add %arg1, %6 : tensor<2x2xf32>
  %10 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
  %13 = stablehlo.tanh %12 : tensor<2x2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %14 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %15 = stablehlo.subtract %14, %13 : tensor<2x2xf32>
  %16 = stablehlo.add %9, %13 : tensor<2x2xf32>
  %17 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
  %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %19 = stablehlo.multiply %16, %18 : tensor<2x2xf32>
  %20 = stablehlo.tanh %19 : tensor<2x2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %22 = stablehlo.subtract %21, %20 : tensor<2x2xf32>
  %23 = stablehlo.add %16, %20 : tensor<2x2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %24 = stablehlo.reduce(%23 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %25 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %26 = stablehlo.multiply %25, %22 : tensor<2x2xf32>
  %27 = stablehlo.multiply %26, %20 : tensor<2x2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2x2xf32>
  %29 = stablehlo.multiply %16, %28 : tensor<2x2xf32>
  %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %30 = stablehlo.reduce(%29 init: %cst_4) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %31 = stablehlo.reshape %30 : (tensor<2xf32>) -> tensor<1x2xf32>
  %32 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %33 = stablehlo.multiply %28, %32 : tensor<2x2xf32>
  %34 = stablehlo.add %25, %33 : tensor<2x2xf32>
  %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %35 = stablehlo.reduce(%31 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %36 = stablehlo.multiply %34, %15 : tensor<2x2xf32>
  %37 = stablehlo.multiply %36, %13 : tensor<2x2xf32>
  %38 = stablehlo.add %36, %37 : tensor<2x2xf32>
  %39 = stablehlo.multiply %9, %38 : tensor<2x2xf32>
  %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %40 = stablehlo.reduce(%39 init: %cst_6) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.reshape %40 : (tensor<2xf32>) -> tensor<1x2xf32>
  %42 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %43 = stablehlo.multiply %38, %42 : tensor<2x2xf32>
  %44 = stablehlo.add %34, %43 : tensor<2x2xf32>
  %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %45 = stablehlo.reduce(%41 init: %cst_7) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %46 = stablehlo.multiply %44, %8 : tensor<2x2xf32>
  %47 = stablehlo.multiply %46, %6 : tensor<2x2xf32>
  %48 = stablehlo.add %46, %47 : tensor<2x2xf32>
  %49 = stablehlo.multiply %arg1, %48 : tensor<2x2xf32>
  %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %50 = stablehlo.reduce(%49 init: %cst_8) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
  %51 = stablehlo.reshape %50 : (tensor<2xf32>) -> tensor<1x2xf32>
  %cst_9 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %52 = stablehlo.reduce(%51 init: %cst_9) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
  %cst_10 = stablehlo.constant dense<2.000000e-01> : tensor<f32>
  %53 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %54 = stablehlo.multiply %53, %52 : tensor<2xf32>
  %55 = stablehlo.subtract %0, %54 : tensor<2xf32>
  %cst_11 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %56 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %57 = stablehlo.multiply %56, %45 : tensor<2xf32>
  %58 = stablehlo.subtract %1, %57 : tensor<2xf32>
  %cst_12 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %59 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %60 = stablehlo.multiply %59, %35 : tensor<2xf32>
  %61 = stablehlo.subtract %2, %60 : tensor<2xf32>
  %62 = stablehlo.concatenate %55, %58, %61, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
  return %62, %24 : tensor<6xf32>, tensor<f32>
}
