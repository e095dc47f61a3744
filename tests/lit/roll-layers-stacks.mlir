// RUN: loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// An encoder's three blocks x + tanh(x e_l), the first reading the batch, then a decoder's three
// y + sin(y d_l + m v_l), each reading the encoder's output m as cross-attention does, y from the batch's
// rows reversed; an SGD step (tests/py/layered.py's two_stacks(3, 2, 2, cross=True), jax's own lowering).
// The decoder's run is tried first. Its shift map reaches the encoder along m: the encoder's residual adds,
// tanh and its derivative are chains of three ops, as long as the run, valid roles that read an encoder
// layer's leaf per layer, and m would be their last value at one position, which no decoder op may read.
// Joined to none of the decoder's leaves, they are left out (layer_roles._apart) and the rest validated
// again: m is one value from outside the run, read by every layer, its gradient (jax's sum of every
// layer's term) summed in the decoder's backward loop, which hands it to the encoder's as its cotangent.
// Before, the decoder did not roll.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['dec'] [0:3]: 3 layers of 18 ops each (6 forward, 12 backward); {{.*}} carries 1 value(s) and sums 1 over the layers (the gradient of a value every layer reads); 2 stacked leaves updated inside the backward loop\0Arolled [0]['enc'] [0:3]: 3 layers of 13 ops each (4 forward, 9 backward);
// The encoder's forward loop, from the batch; the decoder's, from the reversed rows, reading m inside:
// CHECK: %[[ENC:[0-9]+]]:4 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %arg9,
// CHECK: %[[DEC:[0-9]+]]:5 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %0,
// CHECK: stablehlo.dot_general %[[ENC]]#1, %{{[0-9]+}}, contracting_dims = [1] x [0]
// The decoder's backward loop sums m's gradient in a carry; the encoder's backward loop starts from it:
// CHECK: %[[DBWD:[0-9]+]]:7 = stablehlo.while(
// CHECK: %{{[0-9]+}}:4 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %[[DBWD]]#6, %{{[a-zA-Z0-9_]+}} = %[[ENC]]#3,
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][0]['v']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][0]['w']"}, %arg2: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][1]['v']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][1]['w']"}, %arg4: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][2]['v']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "[0]['dec'][2]['w']"}, %arg6: tensor<2x2xf32> {loopfuse.state = "[0]['enc'][0]['w']"}, %arg7: tensor<2x2xf32> {loopfuse.state = "[0]['enc'][1]['w']"}, %arg8: tensor<2x2xf32> {loopfuse.state = "[0]['enc'][2]['w']"}, %arg9: tensor<2x2xf32>) -> (tensor<2x2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "[0]['dec'][0]['v']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "[0]['dec'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "[0]['dec'][1]['v']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "[0]['dec'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "[0]['dec'][2]['v']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "[0]['dec'][2]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][6]", loopfuse.result = 6 : i32, loopfuse.state = "[0]['enc'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][7]", loopfuse.result = 7 : i32, loopfuse.state = "[0]['enc'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][8]", loopfuse.result = 8 : i32, loopfuse.state = "[0]['enc'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 9 : i32}) {
    %0 = stablehlo.reverse %arg9, dims = [0] : tensor<2x2xf32>
    %1 = stablehlo.dot_general %arg9, %arg6, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %2 = stablehlo.tanh %1 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %4 = stablehlo.subtract %3, %2 : tensor<2x2xf32>
    %5 = stablehlo.add %arg9, %2 : tensor<2x2xf32>
    %6 = stablehlo.dot_general %5, %arg7, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %7 = stablehlo.tanh %6 : tensor<2x2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %8 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %9 = stablehlo.subtract %8, %7 : tensor<2x2xf32>
    %10 = stablehlo.add %5, %7 : tensor<2x2xf32>
    %11 = stablehlo.dot_general %10, %arg8, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %12 = stablehlo.tanh %11 : tensor<2x2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %14 = stablehlo.subtract %13, %12 : tensor<2x2xf32>
    %15 = stablehlo.add %10, %12 : tensor<2x2xf32>
    %16 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %17 = stablehlo.dot_general %15, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %18 = stablehlo.add %16, %17 : tensor<2x2xf32>
    %19 = stablehlo.sine %18 : tensor<2x2xf32>
    %20 = stablehlo.cosine %18 : tensor<2x2xf32>
    %21 = stablehlo.add %0, %19 : tensor<2x2xf32>
    %22 = stablehlo.dot_general %21, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %23 = stablehlo.dot_general %15, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %24 = stablehlo.add %22, %23 : tensor<2x2xf32>
    %25 = stablehlo.sine %24 : tensor<2x2xf32>
    %26 = stablehlo.cosine %24 : tensor<2x2xf32>
    %27 = stablehlo.add %21, %25 : tensor<2x2xf32>
    %28 = stablehlo.dot_general %27, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %29 = stablehlo.dot_general %15, %arg4, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %30 = stablehlo.add %28, %29 : tensor<2x2xf32>
    %31 = stablehlo.sine %30 : tensor<2x2xf32>
    %32 = stablehlo.cosine %30 : tensor<2x2xf32>
    %33 = stablehlo.add %27, %31 : tensor<2x2xf32>
    %34 = stablehlo.multiply %33, %33 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %35 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %36 = stablehlo.multiply %35, %33 : tensor<2x2xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %37 = stablehlo.reduce(%34 init: %cst_3) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_4 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %38 = stablehlo.divide %37, %cst_4 : tensor<f32>
    %cst_5 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_6 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %39 = stablehlo.divide %cst_5, %cst_6 : tensor<f32>
    %40 = stablehlo.broadcast_in_dim %39, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %41 = stablehlo.multiply %40, %36 : tensor<2x2xf32>
    %42 = stablehlo.multiply %41, %32 : tensor<2x2xf32>
    %43 = stablehlo.dot_general %42, %15, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %44 = stablehlo.transpose %43, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %45 = stablehlo.dot_general %42, %arg4, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %46 = stablehlo.dot_general %42, %27, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %47 = stablehlo.transpose %46, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %48 = stablehlo.dot_general %42, %arg5, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %49 = stablehlo.add %41, %48 : tensor<2x2xf32>
    %50 = stablehlo.multiply %49, %26 : tensor<2x2xf32>
    %51 = stablehlo.dot_general %50, %15, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %52 = stablehlo.transpose %51, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %53 = stablehlo.dot_general %50, %arg2, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %54 = stablehlo.add %45, %53 : tensor<2x2xf32>
    %55 = stablehlo.dot_general %50, %21, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %56 = stablehlo.transpose %55, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %57 = stablehlo.dot_general %50, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %58 = stablehlo.add %49, %57 : tensor<2x2xf32>
    %59 = stablehlo.multiply %58, %20 : tensor<2x2xf32>
    %60 = stablehlo.dot_general %59, %15, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %61 = stablehlo.transpose %60, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %62 = stablehlo.dot_general %59, %arg0, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %63 = stablehlo.add %54, %62 : tensor<2x2xf32>
    %64 = stablehlo.dot_general %59, %0, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %65 = stablehlo.transpose %64, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %66 = stablehlo.multiply %63, %14 : tensor<2x2xf32>
    %67 = stablehlo.multiply %66, %12 : tensor<2x2xf32>
    %68 = stablehlo.add %66, %67 : tensor<2x2xf32>
    %69 = stablehlo.dot_general %68, %10, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %70 = stablehlo.transpose %69, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %71 = stablehlo.dot_general %68, %arg8, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %72 = stablehlo.add %63, %71 : tensor<2x2xf32>
    %73 = stablehlo.multiply %72, %9 : tensor<2x2xf32>
    %74 = stablehlo.multiply %73, %7 : tensor<2x2xf32>
    %75 = stablehlo.add %73, %74 : tensor<2x2xf32>
    %76 = stablehlo.dot_general %75, %5, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %77 = stablehlo.transpose %76, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %78 = stablehlo.dot_general %75, %arg7, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %79 = stablehlo.add %72, %78 : tensor<2x2xf32>
    %80 = stablehlo.multiply %79, %4 : tensor<2x2xf32>
    %81 = stablehlo.multiply %80, %2 : tensor<2x2xf32>
    %82 = stablehlo.add %80, %81 : tensor<2x2xf32>
    %83 = stablehlo.dot_general %82, %arg9, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %84 = stablehlo.transpose %83, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %85 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %86 = stablehlo.multiply %85, %61 : tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %87 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %88 = stablehlo.multiply %87, %65 : tensor<2x2xf32>
    %cst_9 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %89 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %90 = stablehlo.multiply %89, %52 : tensor<2x2xf32>
    %cst_10 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %91 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %92 = stablehlo.multiply %91, %56 : tensor<2x2xf32>
    %cst_11 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %93 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %94 = stablehlo.multiply %93, %44 : tensor<2x2xf32>
    %cst_12 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %95 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %96 = stablehlo.multiply %95, %47 : tensor<2x2xf32>
    %cst_13 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %97 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %98 = stablehlo.multiply %97, %84 : tensor<2x2xf32>
    %cst_14 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %99 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %100 = stablehlo.multiply %99, %77 : tensor<2x2xf32>
    %cst_15 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %101 = stablehlo.broadcast_in_dim %cst_15, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %102 = stablehlo.multiply %101, %70 : tensor<2x2xf32>
    %103 = stablehlo.add %arg0, %86 : tensor<2x2xf32>
    %104 = stablehlo.add %arg1, %88 : tensor<2x2xf32>
    %105 = stablehlo.add %arg2, %90 : tensor<2x2xf32>
    %106 = stablehlo.add %arg3, %92 : tensor<2x2xf32>
    %107 = stablehlo.add %arg4, %94 : tensor<2x2xf32>
    %108 = stablehlo.add %arg5, %96 : tensor<2x2xf32>
    %109 = stablehlo.add %arg6, %98 : tensor<2x2xf32>
    %110 = stablehlo.add %arg7, %100 : tensor<2x2xf32>
    %111 = stablehlo.add %arg8, %102 : tensor<2x2xf32>
    return %103, %104, %105, %106, %107, %108, %109, %110, %111, %38 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}
