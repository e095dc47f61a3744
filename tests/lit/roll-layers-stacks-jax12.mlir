// RUN: loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// roll-layers-stacks.mlir's two stacks as jax 0.11+ lowers them (tests/py/layered.py's
// two_stacks(3, 2, 2, cross=True), an SGD step, traced with jax 0.12): an encoder's three blocks
// x + tanh(x e_l), then a decoder's three y + sin(y d_l + m v_l), each reading the encoder's output m.
// Seen from the decoder's run, the stacks' backward ops of one kind are chains of six, twice the run's
// length: the encoder's three, then the decoder's (a tanh's derivative times its cotangent, then sin's).
// Such a chain is cut at the window that makes the fewest bytes cross between positions; the chains of
// the decoder's first layer, which computes no input gradient (y is the batch's), are shorter than the
// run and not placed yet then. Counted as outside the run, they made the encoder's window the cheaper:
// the decoder's backward ops were left out and it did not roll. They are now not counted until placed
// (layer_roles._position), and the decoder's window wins.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['dec'] [0:3]: 3 layers of 18 ops each (6 forward, 12 backward); {{.*}} carries 1 value(s) and sums 1 over the layers (the gradient of a value every layer reads); 2 stacked leaves updated inside the backward loop\0Arolled [0]['enc'] [0:3]: 3 layers of 13 ops each (6 forward, 7 backward);
// The encoder's forward loop, from the batch; the decoder's, from the reversed rows:
// CHECK: %[[ENC:[0-9]+]]:4 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %arg9,
// CHECK: %[[DEC:[0-9]+]]:5 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %0,
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
    %4 = stablehlo.add %3, %2 : tensor<2x2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %6 = stablehlo.subtract %5, %2 : tensor<2x2xf32>
    %7 = stablehlo.multiply %4, %6 : tensor<2x2xf32>
    %8 = stablehlo.add %arg9, %2 : tensor<2x2xf32>
    %9 = stablehlo.dot_general %8, %arg7, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %10 = stablehlo.tanh %9 : tensor<2x2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %11 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %12 = stablehlo.add %11, %10 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %14 = stablehlo.subtract %13, %10 : tensor<2x2xf32>
    %15 = stablehlo.multiply %12, %14 : tensor<2x2xf32>
    %16 = stablehlo.add %8, %10 : tensor<2x2xf32>
    %17 = stablehlo.dot_general %16, %arg8, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %18 = stablehlo.tanh %17 : tensor<2x2xf32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %19 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %20 = stablehlo.add %19, %18 : tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %21 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %22 = stablehlo.subtract %21, %18 : tensor<2x2xf32>
    %23 = stablehlo.multiply %20, %22 : tensor<2x2xf32>
    %24 = stablehlo.add %16, %18 : tensor<2x2xf32>
    %25 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %26 = stablehlo.dot_general %24, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %27 = stablehlo.add %25, %26 : tensor<2x2xf32>
    %28 = stablehlo.sine %27 : tensor<2x2xf32>
    %29 = stablehlo.cosine %27 : tensor<2x2xf32>
    %30 = stablehlo.add %0, %28 : tensor<2x2xf32>
    %31 = stablehlo.dot_general %30, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %32 = stablehlo.dot_general %24, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %33 = stablehlo.add %31, %32 : tensor<2x2xf32>
    %34 = stablehlo.sine %33 : tensor<2x2xf32>
    %35 = stablehlo.cosine %33 : tensor<2x2xf32>
    %36 = stablehlo.add %30, %34 : tensor<2x2xf32>
    %37 = stablehlo.dot_general %36, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %38 = stablehlo.dot_general %24, %arg4, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %39 = stablehlo.add %37, %38 : tensor<2x2xf32>
    %40 = stablehlo.sine %39 : tensor<2x2xf32>
    %41 = stablehlo.cosine %39 : tensor<2x2xf32>
    %42 = stablehlo.add %36, %40 : tensor<2x2xf32>
    %43 = stablehlo.multiply %42, %42 : tensor<2x2xf32>
    %cst_5 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %45 = stablehlo.multiply %44, %42 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %46 = stablehlo.reduce(%43 init: %cst_6) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_7 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %47 = stablehlo.divide %46, %cst_7 : tensor<f32>
    %cst_8 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_9 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %48 = stablehlo.divide %cst_8, %cst_9 : tensor<f32>
    %49 = stablehlo.broadcast_in_dim %48, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %50 = stablehlo.multiply %49, %45 : tensor<2x2xf32>
    %51 = stablehlo.multiply %50, %41 : tensor<2x2xf32>
    %52 = stablehlo.dot_general %51, %24, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %53 = stablehlo.transpose %52, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %54 = stablehlo.dot_general %51, %arg4, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %55 = stablehlo.dot_general %51, %36, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %56 = stablehlo.transpose %55, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %57 = stablehlo.dot_general %51, %arg5, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %58 = stablehlo.add %50, %57 : tensor<2x2xf32>
    %59 = stablehlo.multiply %58, %35 : tensor<2x2xf32>
    %60 = stablehlo.dot_general %59, %24, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %61 = stablehlo.transpose %60, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %62 = stablehlo.dot_general %59, %arg2, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %63 = stablehlo.add %54, %62 : tensor<2x2xf32>
    %64 = stablehlo.dot_general %59, %30, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %65 = stablehlo.transpose %64, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %66 = stablehlo.dot_general %59, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %67 = stablehlo.add %58, %66 : tensor<2x2xf32>
    %68 = stablehlo.multiply %67, %29 : tensor<2x2xf32>
    %69 = stablehlo.dot_general %68, %24, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %70 = stablehlo.transpose %69, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %71 = stablehlo.dot_general %68, %arg0, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %72 = stablehlo.add %63, %71 : tensor<2x2xf32>
    %73 = stablehlo.dot_general %68, %0, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %74 = stablehlo.transpose %73, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %75 = stablehlo.multiply %72, %23 : tensor<2x2xf32>
    %76 = stablehlo.dot_general %75, %16, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %77 = stablehlo.transpose %76, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %78 = stablehlo.dot_general %75, %arg8, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %79 = stablehlo.add %72, %78 : tensor<2x2xf32>
    %80 = stablehlo.multiply %79, %15 : tensor<2x2xf32>
    %81 = stablehlo.dot_general %80, %8, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %82 = stablehlo.transpose %81, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %83 = stablehlo.dot_general %80, %arg7, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %84 = stablehlo.add %79, %83 : tensor<2x2xf32>
    %85 = stablehlo.multiply %84, %7 : tensor<2x2xf32>
    %86 = stablehlo.dot_general %85, %arg9, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %87 = stablehlo.transpose %86, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %cst_10 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %88 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %89 = stablehlo.multiply %88, %70 : tensor<2x2xf32>
    %cst_11 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %90 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %91 = stablehlo.multiply %90, %74 : tensor<2x2xf32>
    %cst_12 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %92 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %93 = stablehlo.multiply %92, %61 : tensor<2x2xf32>
    %cst_13 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %94 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %95 = stablehlo.multiply %94, %65 : tensor<2x2xf32>
    %cst_14 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %96 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %97 = stablehlo.multiply %96, %53 : tensor<2x2xf32>
    %cst_15 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %98 = stablehlo.broadcast_in_dim %cst_15, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %99 = stablehlo.multiply %98, %56 : tensor<2x2xf32>
    %cst_16 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %100 = stablehlo.broadcast_in_dim %cst_16, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %101 = stablehlo.multiply %100, %87 : tensor<2x2xf32>
    %cst_17 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %102 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %103 = stablehlo.multiply %102, %82 : tensor<2x2xf32>
    %cst_18 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %104 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %105 = stablehlo.multiply %104, %77 : tensor<2x2xf32>
    %106 = stablehlo.add %arg0, %89 : tensor<2x2xf32>
    %107 = stablehlo.add %arg1, %91 : tensor<2x2xf32>
    %108 = stablehlo.add %arg2, %93 : tensor<2x2xf32>
    %109 = stablehlo.add %arg3, %95 : tensor<2x2xf32>
    %110 = stablehlo.add %arg4, %97 : tensor<2x2xf32>
    %111 = stablehlo.add %arg5, %99 : tensor<2x2xf32>
    %112 = stablehlo.add %arg6, %101 : tensor<2x2xf32>
    %113 = stablehlo.add %arg7, %103 : tensor<2x2xf32>
    %114 = stablehlo.add %arg8, %105 : tensor<2x2xf32>
    return %106, %107, %108, %109, %110, %111, %112, %113, %114, %47 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}
