// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// Three blocks x + tanh(rms_norm(x, g_l) w_l), the first reading the batch; an SGD step on the sum of the
// output (jax's own lowering). The gradient of a block's input through its RMS norm reads the input itself, a
// forward carry, and the first block computes none: those chains have no op at layer 0. There they take the
// layer's input the other roles read at layer 0, the batch (layer_roles._carried_in), and their results are
// dropped. All three layers roll; before, layer 0 was left out ("its ops differ from the others'").
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['blocks'] [0:3]: 3 layers of 45 ops each (17 forward, 28 backward);
// CHECK-NOT: left as it is
// The forward loop starts from the batch:
// CHECK: stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %arg6,
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['blocks'][0]['g']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "['blocks'][0]['w']"}, %arg2: tensor<2xf32> {loopfuse.state = "['blocks'][1]['g']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "['blocks'][1]['w']"}, %arg4: tensor<2xf32> {loopfuse.state = "['blocks'][2]['g']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "['blocks'][2]['w']"}, %arg6: tensor<2x2xf32>) -> (tensor<2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "['blocks'][0]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "['blocks'][0]['w']"}, tensor<2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "['blocks'][1]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "['blocks'][1]['w']"}, tensor<2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "['blocks'][2]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 6 : i32}) {
    %0 = stablehlo.multiply %arg6, %arg6 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_0 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %4 = stablehlo.divide %2, %3 : tensor<2x1xf32>
    %cst_1 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %6 = stablehlo.add %4, %5 : tensor<2x1xf32>
    %7 = stablehlo.rsqrt %6 : tensor<2x1xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %9 = stablehlo.multiply %arg6, %8 : tensor<2x2xf32>
    %10 = stablehlo.broadcast_in_dim %arg0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
    %13 = stablehlo.dot_general %12, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %14 = stablehlo.tanh %13 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %16 = stablehlo.subtract %15, %14 : tensor<2x2xf32>
    %17 = stablehlo.add %arg6, %14 : tensor<2x2xf32>
    %18 = stablehlo.multiply %17, %17 : tensor<2x2xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %19 = stablehlo.reduce(%18 init: %cst_3) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_4 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %21 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %22 = stablehlo.divide %20, %21 : tensor<2x1xf32>
    %cst_5 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %23 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %24 = stablehlo.add %22, %23 : tensor<2x1xf32>
    %25 = stablehlo.rsqrt %24 : tensor<2x1xf32>
    %26 = stablehlo.divide %25, %24 : tensor<2x1xf32>
    %cst_6 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %27 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %28 = stablehlo.multiply %27, %26 : tensor<2x1xf32>
    %29 = stablehlo.broadcast_in_dim %25, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %30 = stablehlo.multiply %17, %29 : tensor<2x2xf32>
    %31 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %32 = stablehlo.broadcast_in_dim %31, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %33 = stablehlo.multiply %30, %32 : tensor<2x2xf32>
    %34 = stablehlo.dot_general %33, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %35 = stablehlo.tanh %34 : tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %37 = stablehlo.subtract %36, %35 : tensor<2x2xf32>
    %38 = stablehlo.add %17, %35 : tensor<2x2xf32>
    %39 = stablehlo.multiply %38, %38 : tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %40 = stablehlo.reduce(%39 init: %cst_8) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %41 = stablehlo.broadcast_in_dim %40, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_9 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %42 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %43 = stablehlo.divide %41, %42 : tensor<2x1xf32>
    %cst_10 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %45 = stablehlo.add %43, %44 : tensor<2x1xf32>
    %46 = stablehlo.rsqrt %45 : tensor<2x1xf32>
    %47 = stablehlo.divide %46, %45 : tensor<2x1xf32>
    %cst_11 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %48 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %49 = stablehlo.multiply %48, %47 : tensor<2x1xf32>
    %50 = stablehlo.broadcast_in_dim %46, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %51 = stablehlo.multiply %38, %50 : tensor<2x2xf32>
    %52 = stablehlo.broadcast_in_dim %arg4, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %53 = stablehlo.broadcast_in_dim %52, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %54 = stablehlo.multiply %51, %53 : tensor<2x2xf32>
    %55 = stablehlo.dot_general %54, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %56 = stablehlo.tanh %55 : tensor<2x2xf32>
    %cst_12 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %57 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %58 = stablehlo.subtract %57, %56 : tensor<2x2xf32>
    %59 = stablehlo.add %38, %56 : tensor<2x2xf32>
    %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %60 = stablehlo.reduce(%59 init: %cst_13) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_14 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %61 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %62 = stablehlo.multiply %61, %58 : tensor<2x2xf32>
    %63 = stablehlo.multiply %62, %56 : tensor<2x2xf32>
    %64 = stablehlo.add %62, %63 : tensor<2x2xf32>
    %65 = stablehlo.dot_general %64, %54, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %66 = stablehlo.transpose %65, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %67 = stablehlo.dot_general %64, %arg5, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %68 = stablehlo.multiply %51, %67 : tensor<2x2xf32>
    %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %69 = stablehlo.reduce(%68 init: %cst_15) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %70 = stablehlo.reshape %69 : (tensor<2xf32>) -> tensor<1x2xf32>
    %71 = stablehlo.broadcast_in_dim %52, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %72 = stablehlo.multiply %67, %71 : tensor<2x2xf32>
    %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %73 = stablehlo.reduce(%70 init: %cst_16) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %74 = stablehlo.multiply %38, %72 : tensor<2x2xf32>
    %cst_17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %75 = stablehlo.reduce(%74 init: %cst_17) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %76 = stablehlo.reshape %75 : (tensor<2xf32>) -> tensor<2x1xf32>
    %77 = stablehlo.broadcast_in_dim %46, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %78 = stablehlo.multiply %72, %77 : tensor<2x2xf32>
    %79 = stablehlo.add %61, %78 : tensor<2x2xf32>
    %80 = stablehlo.multiply %76, %49 : tensor<2x1xf32>
    %cst_18 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %81 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %82 = stablehlo.divide %80, %81 : tensor<2x1xf32>
    %cst_19 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %83 = stablehlo.reduce(%82 init: %cst_19) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %84 = stablehlo.broadcast_in_dim %83, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %85 = stablehlo.multiply %38, %84 : tensor<2x2xf32>
    %86 = stablehlo.add %79, %85 : tensor<2x2xf32>
    %87 = stablehlo.multiply %84, %38 : tensor<2x2xf32>
    %88 = stablehlo.add %86, %87 : tensor<2x2xf32>
    %89 = stablehlo.multiply %88, %37 : tensor<2x2xf32>
    %90 = stablehlo.multiply %89, %35 : tensor<2x2xf32>
    %91 = stablehlo.add %89, %90 : tensor<2x2xf32>
    %92 = stablehlo.dot_general %91, %33, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %93 = stablehlo.transpose %92, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %94 = stablehlo.dot_general %91, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %95 = stablehlo.multiply %30, %94 : tensor<2x2xf32>
    %cst_20 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %96 = stablehlo.reduce(%95 init: %cst_20) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %97 = stablehlo.reshape %96 : (tensor<2xf32>) -> tensor<1x2xf32>
    %98 = stablehlo.broadcast_in_dim %31, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %99 = stablehlo.multiply %94, %98 : tensor<2x2xf32>
    %cst_21 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %100 = stablehlo.reduce(%97 init: %cst_21) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %101 = stablehlo.multiply %17, %99 : tensor<2x2xf32>
    %cst_22 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %102 = stablehlo.reduce(%101 init: %cst_22) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %103 = stablehlo.reshape %102 : (tensor<2xf32>) -> tensor<2x1xf32>
    %104 = stablehlo.broadcast_in_dim %25, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %105 = stablehlo.multiply %99, %104 : tensor<2x2xf32>
    %106 = stablehlo.add %88, %105 : tensor<2x2xf32>
    %107 = stablehlo.multiply %103, %28 : tensor<2x1xf32>
    %cst_23 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %108 = stablehlo.broadcast_in_dim %cst_23, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %109 = stablehlo.divide %107, %108 : tensor<2x1xf32>
    %cst_24 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %110 = stablehlo.reduce(%109 init: %cst_24) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %111 = stablehlo.broadcast_in_dim %110, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %112 = stablehlo.multiply %17, %111 : tensor<2x2xf32>
    %113 = stablehlo.add %106, %112 : tensor<2x2xf32>
    %114 = stablehlo.multiply %111, %17 : tensor<2x2xf32>
    %115 = stablehlo.add %113, %114 : tensor<2x2xf32>
    %116 = stablehlo.multiply %115, %16 : tensor<2x2xf32>
    %117 = stablehlo.multiply %116, %14 : tensor<2x2xf32>
    %118 = stablehlo.add %116, %117 : tensor<2x2xf32>
    %119 = stablehlo.dot_general %118, %12, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %120 = stablehlo.transpose %119, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %121 = stablehlo.dot_general %118, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %122 = stablehlo.multiply %9, %121 : tensor<2x2xf32>
    %cst_25 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %123 = stablehlo.reduce(%122 init: %cst_25) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %124 = stablehlo.reshape %123 : (tensor<2xf32>) -> tensor<1x2xf32>
    %cst_26 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %125 = stablehlo.reduce(%124 init: %cst_26) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %cst_27 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %126 = stablehlo.broadcast_in_dim %cst_27, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %127 = stablehlo.multiply %126, %125 : tensor<2xf32>
    %128 = stablehlo.subtract %arg0, %127 : tensor<2xf32>
    %cst_28 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %129 = stablehlo.broadcast_in_dim %cst_28, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %130 = stablehlo.multiply %129, %120 : tensor<2x2xf32>
    %131 = stablehlo.subtract %arg1, %130 : tensor<2x2xf32>
    %cst_29 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %132 = stablehlo.broadcast_in_dim %cst_29, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %133 = stablehlo.multiply %132, %100 : tensor<2xf32>
    %134 = stablehlo.subtract %arg2, %133 : tensor<2xf32>
    %cst_30 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %135 = stablehlo.broadcast_in_dim %cst_30, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %136 = stablehlo.multiply %135, %93 : tensor<2x2xf32>
    %137 = stablehlo.subtract %arg3, %136 : tensor<2x2xf32>
    %cst_31 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %138 = stablehlo.broadcast_in_dim %cst_31, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %139 = stablehlo.multiply %138, %73 : tensor<2xf32>
    %140 = stablehlo.subtract %arg4, %139 : tensor<2xf32>
    %cst_32 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %141 = stablehlo.broadcast_in_dim %cst_32, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %142 = stablehlo.multiply %141, %66 : tensor<2x2xf32>
    %143 = stablehlo.subtract %arg5, %142 : tensor<2x2xf32>
    return %128, %131, %134, %137, %140, %143, %60 : tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}

// -----

// The same blocks, the first one's activation a sin: that block is unlike the others, not only short of an
// input gradient, so it stays out of the run (a role with its like at layer 0 only in the carry it reads does
// not make layer 0 alike); layers 1 and 2 roll.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['blocks'] [1:3]: 2 layers of 45 ops each (17 forward, 28 backward); {{.*}}; layer 0 left as it is: its ops differ from the others'"
// CHECK: stablehlo.while(
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['blocks'][0]['g']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "['blocks'][0]['w']"}, %arg2: tensor<2xf32> {loopfuse.state = "['blocks'][1]['g']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "['blocks'][1]['w']"}, %arg4: tensor<2xf32> {loopfuse.state = "['blocks'][2]['g']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "['blocks'][2]['w']"}, %arg6: tensor<2x2xf32>) -> (tensor<2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "['blocks'][0]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "['blocks'][0]['w']"}, tensor<2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "['blocks'][1]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "['blocks'][1]['w']"}, tensor<2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "['blocks'][2]['g']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 6 : i32}) {
    %0 = stablehlo.multiply %arg6, %arg6 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_0 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %4 = stablehlo.divide %2, %3 : tensor<2x1xf32>
    %cst_1 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %6 = stablehlo.add %4, %5 : tensor<2x1xf32>
    %7 = stablehlo.rsqrt %6 : tensor<2x1xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %9 = stablehlo.multiply %arg6, %8 : tensor<2x2xf32>
    %10 = stablehlo.broadcast_in_dim %arg0, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %12 = stablehlo.multiply %9, %11 : tensor<2x2xf32>
    %13 = stablehlo.dot_general %12, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %14 = stablehlo.sine %13 : tensor<2x2xf32>
    %15 = stablehlo.cosine %13 : tensor<2x2xf32>
    %16 = stablehlo.add %arg6, %14 : tensor<2x2xf32>
    %17 = stablehlo.multiply %16, %16 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.reduce(%17 init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %19 = stablehlo.broadcast_in_dim %18, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_3 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %20 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %21 = stablehlo.divide %19, %20 : tensor<2x1xf32>
    %cst_4 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %22 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %23 = stablehlo.add %21, %22 : tensor<2x1xf32>
    %24 = stablehlo.rsqrt %23 : tensor<2x1xf32>
    %25 = stablehlo.divide %24, %23 : tensor<2x1xf32>
    %cst_5 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %26 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %27 = stablehlo.multiply %26, %25 : tensor<2x1xf32>
    %28 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %29 = stablehlo.multiply %16, %28 : tensor<2x2xf32>
    %30 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %31 = stablehlo.broadcast_in_dim %30, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %32 = stablehlo.multiply %29, %31 : tensor<2x2xf32>
    %33 = stablehlo.dot_general %32, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %34 = stablehlo.tanh %33 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %35 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %36 = stablehlo.subtract %35, %34 : tensor<2x2xf32>
    %37 = stablehlo.add %16, %34 : tensor<2x2xf32>
    %38 = stablehlo.multiply %37, %37 : tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %39 = stablehlo.reduce(%38 init: %cst_7) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %40 = stablehlo.broadcast_in_dim %39, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_8 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %41 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %42 = stablehlo.divide %40, %41 : tensor<2x1xf32>
    %cst_9 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %43 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %44 = stablehlo.add %42, %43 : tensor<2x1xf32>
    %45 = stablehlo.rsqrt %44 : tensor<2x1xf32>
    %46 = stablehlo.divide %45, %44 : tensor<2x1xf32>
    %cst_10 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %47 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %48 = stablehlo.multiply %47, %46 : tensor<2x1xf32>
    %49 = stablehlo.broadcast_in_dim %45, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %50 = stablehlo.multiply %37, %49 : tensor<2x2xf32>
    %51 = stablehlo.broadcast_in_dim %arg4, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %52 = stablehlo.broadcast_in_dim %51, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %53 = stablehlo.multiply %50, %52 : tensor<2x2xf32>
    %54 = stablehlo.dot_general %53, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %55 = stablehlo.tanh %54 : tensor<2x2xf32>
    %cst_11 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %56 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %57 = stablehlo.subtract %56, %55 : tensor<2x2xf32>
    %58 = stablehlo.add %37, %55 : tensor<2x2xf32>
    %cst_12 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %59 = stablehlo.reduce(%58 init: %cst_12) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_13 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %60 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %61 = stablehlo.multiply %60, %57 : tensor<2x2xf32>
    %62 = stablehlo.multiply %61, %55 : tensor<2x2xf32>
    %63 = stablehlo.add %61, %62 : tensor<2x2xf32>
    %64 = stablehlo.dot_general %63, %53, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %65 = stablehlo.transpose %64, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %66 = stablehlo.dot_general %63, %arg5, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %67 = stablehlo.multiply %50, %66 : tensor<2x2xf32>
    %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %68 = stablehlo.reduce(%67 init: %cst_14) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %69 = stablehlo.reshape %68 : (tensor<2xf32>) -> tensor<1x2xf32>
    %70 = stablehlo.broadcast_in_dim %51, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %71 = stablehlo.multiply %66, %70 : tensor<2x2xf32>
    %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %72 = stablehlo.reduce(%69 init: %cst_15) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %73 = stablehlo.multiply %37, %71 : tensor<2x2xf32>
    %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %74 = stablehlo.reduce(%73 init: %cst_16) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %75 = stablehlo.reshape %74 : (tensor<2xf32>) -> tensor<2x1xf32>
    %76 = stablehlo.broadcast_in_dim %45, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %77 = stablehlo.multiply %71, %76 : tensor<2x2xf32>
    %78 = stablehlo.add %60, %77 : tensor<2x2xf32>
    %79 = stablehlo.multiply %75, %48 : tensor<2x1xf32>
    %cst_17 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %80 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %81 = stablehlo.divide %79, %80 : tensor<2x1xf32>
    %cst_18 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %82 = stablehlo.reduce(%81 init: %cst_18) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %83 = stablehlo.broadcast_in_dim %82, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %84 = stablehlo.multiply %37, %83 : tensor<2x2xf32>
    %85 = stablehlo.add %78, %84 : tensor<2x2xf32>
    %86 = stablehlo.multiply %83, %37 : tensor<2x2xf32>
    %87 = stablehlo.add %85, %86 : tensor<2x2xf32>
    %88 = stablehlo.multiply %87, %36 : tensor<2x2xf32>
    %89 = stablehlo.multiply %88, %34 : tensor<2x2xf32>
    %90 = stablehlo.add %88, %89 : tensor<2x2xf32>
    %91 = stablehlo.dot_general %90, %32, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %92 = stablehlo.transpose %91, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %93 = stablehlo.dot_general %90, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %94 = stablehlo.multiply %29, %93 : tensor<2x2xf32>
    %cst_19 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %95 = stablehlo.reduce(%94 init: %cst_19) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %96 = stablehlo.reshape %95 : (tensor<2xf32>) -> tensor<1x2xf32>
    %97 = stablehlo.broadcast_in_dim %30, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %98 = stablehlo.multiply %93, %97 : tensor<2x2xf32>
    %cst_20 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %99 = stablehlo.reduce(%96 init: %cst_20) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %100 = stablehlo.multiply %16, %98 : tensor<2x2xf32>
    %cst_21 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %101 = stablehlo.reduce(%100 init: %cst_21) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %102 = stablehlo.reshape %101 : (tensor<2xf32>) -> tensor<2x1xf32>
    %103 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x2xf32>
    %104 = stablehlo.multiply %98, %103 : tensor<2x2xf32>
    %105 = stablehlo.add %87, %104 : tensor<2x2xf32>
    %106 = stablehlo.multiply %102, %27 : tensor<2x1xf32>
    %cst_22 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %107 = stablehlo.broadcast_in_dim %cst_22, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %108 = stablehlo.divide %106, %107 : tensor<2x1xf32>
    %cst_23 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %109 = stablehlo.reduce(%108 init: %cst_23) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %110 = stablehlo.broadcast_in_dim %109, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
    %111 = stablehlo.multiply %16, %110 : tensor<2x2xf32>
    %112 = stablehlo.add %105, %111 : tensor<2x2xf32>
    %113 = stablehlo.multiply %110, %16 : tensor<2x2xf32>
    %114 = stablehlo.add %112, %113 : tensor<2x2xf32>
    %115 = stablehlo.multiply %114, %15 : tensor<2x2xf32>
    %116 = stablehlo.dot_general %115, %12, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %117 = stablehlo.transpose %116, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %118 = stablehlo.dot_general %115, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %119 = stablehlo.multiply %9, %118 : tensor<2x2xf32>
    %cst_24 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %120 = stablehlo.reduce(%119 init: %cst_24) applies stablehlo.add across dimensions = [0] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    %121 = stablehlo.reshape %120 : (tensor<2xf32>) -> tensor<1x2xf32>
    %cst_25 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %122 = stablehlo.reduce(%121 init: %cst_25) applies stablehlo.add across dimensions = [0] : (tensor<1x2xf32>, tensor<f32>) -> tensor<2xf32>
    %cst_26 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %123 = stablehlo.broadcast_in_dim %cst_26, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %124 = stablehlo.multiply %123, %122 : tensor<2xf32>
    %125 = stablehlo.subtract %arg0, %124 : tensor<2xf32>
    %cst_27 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %126 = stablehlo.broadcast_in_dim %cst_27, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %127 = stablehlo.multiply %126, %117 : tensor<2x2xf32>
    %128 = stablehlo.subtract %arg1, %127 : tensor<2x2xf32>
    %cst_28 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %129 = stablehlo.broadcast_in_dim %cst_28, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %130 = stablehlo.multiply %129, %99 : tensor<2xf32>
    %131 = stablehlo.subtract %arg2, %130 : tensor<2xf32>
    %cst_29 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %132 = stablehlo.broadcast_in_dim %cst_29, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %133 = stablehlo.multiply %132, %92 : tensor<2x2xf32>
    %134 = stablehlo.subtract %arg3, %133 : tensor<2x2xf32>
    %cst_30 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %135 = stablehlo.broadcast_in_dim %cst_30, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %136 = stablehlo.multiply %135, %72 : tensor<2xf32>
    %137 = stablehlo.subtract %arg4, %136 : tensor<2xf32>
    %cst_31 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %138 = stablehlo.broadcast_in_dim %cst_31, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %139 = stablehlo.multiply %138, %65 : tensor<2x2xf32>
    %140 = stablehlo.subtract %arg5, %139 : tensor<2x2xf32>
    return %125, %128, %131, %134, %137, %140, %59 : tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}
