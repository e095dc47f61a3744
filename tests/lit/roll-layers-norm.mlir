// RUN: loopfuse-opt %s --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// Three blocks x + tanh(layer_norm(x, s_l) w_l), the first reading the batch; an SGD step on the squared
// error against a target y, the loss kept (tests/py/layered.py's normed_mlp(3, 3, 2, head=tanh, target=True),
// jax's own lowering). The layer norm's 2 (x - mean) is computed at every layer but the first, which has no
// input gradient, and the loss's 2 (x - y) is the same op: the shift map's chain of them is as long as the
// run, its first op layer 1's. It is placed one position late, with the chains that read it
// (layer_roles._one_late), and all three layers roll; before, nothing rolled ("no backward op is the same at
// every layer").
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['blocks'] [0:3]: 3 layers of 60 ops each (23 forward, 37 backward);
// CHECK: stablehlo.while
// CHECK: stablehlo.while
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3xf32> {loopfuse.state = "[0]['blocks'][0]['s']"}, %arg1: tensor<3x3xf32> {loopfuse.state = "[0]['blocks'][0]['w']"}, %arg2: tensor<3xf32> {loopfuse.state = "[0]['blocks'][1]['s']"}, %arg3: tensor<3x3xf32> {loopfuse.state = "[0]['blocks'][1]['w']"}, %arg4: tensor<3xf32> {loopfuse.state = "[0]['blocks'][2]['s']"}, %arg5: tensor<3x3xf32> {loopfuse.state = "[0]['blocks'][2]['w']"}, %arg6: tensor<2x3xf32>, %arg7: tensor<2x3xf32>) -> (tensor<3xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "[0]['blocks'][0]['s']"}, tensor<3x3xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "[0]['blocks'][0]['w']"}, tensor<3xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "[0]['blocks'][1]['s']"}, tensor<3x3xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "[0]['blocks'][1]['w']"}, tensor<3xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "[0]['blocks'][2]['s']"}, tensor<3x3xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "[0]['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 6 : i32}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reduce(%arg6 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_0 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %3 = stablehlo.divide %1, %2 : tensor<2x1xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %5 = stablehlo.subtract %arg6, %4 : tensor<2x3xf32>
    %6 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %7 = stablehlo.subtract %arg6, %6 : tensor<2x3xf32>
    %8 = stablehlo.multiply %7, %7 : tensor<2x3xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %9 = stablehlo.reduce(%8 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_2 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %11 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %12 = stablehlo.divide %10, %11 : tensor<2x1xf32>
    %cst_3 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %14 = stablehlo.add %12, %13 : tensor<2x1xf32>
    %15 = stablehlo.rsqrt %14 : tensor<2x1xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %17 = stablehlo.multiply %5, %16 : tensor<2x3xf32>
    %18 = stablehlo.broadcast_in_dim %arg0, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
    %19 = stablehlo.broadcast_in_dim %18, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<2x3xf32>
    %20 = stablehlo.multiply %17, %19 : tensor<2x3xf32>
    %21 = stablehlo.dot_general %20, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %22 = stablehlo.tanh %21 : tensor<2x3xf32>
    %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %23 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %24 = stablehlo.subtract %23, %22 : tensor<2x3xf32>
    %25 = stablehlo.add %arg6, %22 : tensor<2x3xf32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %26 = stablehlo.reduce(%25 init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %27 = stablehlo.broadcast_in_dim %26, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_6 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %28 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %29 = stablehlo.divide %27, %28 : tensor<2x1xf32>
    %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %31 = stablehlo.subtract %25, %30 : tensor<2x3xf32>
    %32 = stablehlo.broadcast_in_dim %29, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %33 = stablehlo.subtract %25, %32 : tensor<2x3xf32>
    %34 = stablehlo.multiply %33, %33 : tensor<2x3xf32>
    %cst_7 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %35 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %36 = stablehlo.multiply %35, %33 : tensor<2x3xf32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %37 = stablehlo.reduce(%34 init: %cst_8) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %38 = stablehlo.broadcast_in_dim %37, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_9 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %40 = stablehlo.divide %38, %39 : tensor<2x1xf32>
    %cst_10 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %41 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %42 = stablehlo.add %40, %41 : tensor<2x1xf32>
    %43 = stablehlo.rsqrt %42 : tensor<2x1xf32>
    %44 = stablehlo.divide %43, %42 : tensor<2x1xf32>
    %cst_11 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %45 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %46 = stablehlo.multiply %45, %44 : tensor<2x1xf32>
    %47 = stablehlo.broadcast_in_dim %43, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %48 = stablehlo.multiply %31, %47 : tensor<2x3xf32>
    %49 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
    %50 = stablehlo.broadcast_in_dim %49, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<2x3xf32>
    %51 = stablehlo.multiply %48, %50 : tensor<2x3xf32>
    %52 = stablehlo.dot_general %51, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %53 = stablehlo.tanh %52 : tensor<2x3xf32>
    %cst_12 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %54 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %55 = stablehlo.subtract %54, %53 : tensor<2x3xf32>
    %56 = stablehlo.add %25, %53 : tensor<2x3xf32>
    %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %57 = stablehlo.reduce(%56 init: %cst_13) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %58 = stablehlo.broadcast_in_dim %57, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_14 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %59 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %60 = stablehlo.divide %58, %59 : tensor<2x1xf32>
    %61 = stablehlo.broadcast_in_dim %60, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %62 = stablehlo.subtract %56, %61 : tensor<2x3xf32>
    %63 = stablehlo.broadcast_in_dim %60, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %64 = stablehlo.subtract %56, %63 : tensor<2x3xf32>
    %65 = stablehlo.multiply %64, %64 : tensor<2x3xf32>
    %cst_15 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %66 = stablehlo.broadcast_in_dim %cst_15, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %67 = stablehlo.multiply %66, %64 : tensor<2x3xf32>
    %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %68 = stablehlo.reduce(%65 init: %cst_16) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %69 = stablehlo.broadcast_in_dim %68, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %cst_17 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %70 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %71 = stablehlo.divide %69, %70 : tensor<2x1xf32>
    %cst_18 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %72 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %73 = stablehlo.add %71, %72 : tensor<2x1xf32>
    %74 = stablehlo.rsqrt %73 : tensor<2x1xf32>
    %75 = stablehlo.divide %74, %73 : tensor<2x1xf32>
    %cst_19 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %76 = stablehlo.broadcast_in_dim %cst_19, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %77 = stablehlo.multiply %76, %75 : tensor<2x1xf32>
    %78 = stablehlo.broadcast_in_dim %74, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %79 = stablehlo.multiply %62, %78 : tensor<2x3xf32>
    %80 = stablehlo.broadcast_in_dim %arg4, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
    %81 = stablehlo.broadcast_in_dim %80, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<2x3xf32>
    %82 = stablehlo.multiply %79, %81 : tensor<2x3xf32>
    %83 = stablehlo.dot_general %82, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %84 = stablehlo.tanh %83 : tensor<2x3xf32>
    %cst_20 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %85 = stablehlo.broadcast_in_dim %cst_20, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %86 = stablehlo.subtract %85, %84 : tensor<2x3xf32>
    %87 = stablehlo.add %56, %84 : tensor<2x3xf32>
    %88 = stablehlo.subtract %87, %arg7 : tensor<2x3xf32>
    %89 = stablehlo.multiply %88, %88 : tensor<2x3xf32>
    %cst_21 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %90 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %91 = stablehlo.multiply %90, %88 : tensor<2x3xf32>
    %cst_22 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %92 = stablehlo.reduce(%89 init: %cst_22) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    %cst_23 = stablehlo.constant dense<6.000000e+00> : tensor<f32>
    %93 = stablehlo.divide %92, %cst_23 : tensor<f32>
    %cst_24 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_25 = stablehlo.constant dense<6.000000e+00> : tensor<f32>
    %94 = stablehlo.divide %cst_24, %cst_25 : tensor<f32>
    %95 = stablehlo.broadcast_in_dim %94, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %96 = stablehlo.multiply %95, %91 : tensor<2x3xf32>
    %97 = stablehlo.multiply %96, %86 : tensor<2x3xf32>
    %98 = stablehlo.multiply %97, %84 : tensor<2x3xf32>
    %99 = stablehlo.add %97, %98 : tensor<2x3xf32>
    %100 = stablehlo.dot_general %99, %82, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<3x3xf32>
    %101 = stablehlo.transpose %100, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %102 = stablehlo.dot_general %99, %arg5, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %103 = stablehlo.multiply %79, %102 : tensor<2x3xf32>
    %cst_26 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %104 = stablehlo.reduce(%103 init: %cst_26) applies stablehlo.add across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
    %105 = stablehlo.reshape %104 : (tensor<3xf32>) -> tensor<1x3xf32>
    %106 = stablehlo.broadcast_in_dim %80, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<2x3xf32>
    %107 = stablehlo.multiply %102, %106 : tensor<2x3xf32>
    %cst_27 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %108 = stablehlo.reduce(%105 init: %cst_27) applies stablehlo.add across dimensions = [0] : (tensor<1x3xf32>, tensor<f32>) -> tensor<3xf32>
    %109 = stablehlo.multiply %62, %107 : tensor<2x3xf32>
    %cst_28 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %110 = stablehlo.reduce(%109 init: %cst_28) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %111 = stablehlo.reshape %110 : (tensor<2xf32>) -> tensor<2x1xf32>
    %112 = stablehlo.broadcast_in_dim %74, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %113 = stablehlo.multiply %107, %112 : tensor<2x3xf32>
    %114 = stablehlo.multiply %111, %77 : tensor<2x1xf32>
    %cst_29 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %115 = stablehlo.broadcast_in_dim %cst_29, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %116 = stablehlo.divide %114, %115 : tensor<2x1xf32>
    %cst_30 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %117 = stablehlo.reduce(%116 init: %cst_30) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %118 = stablehlo.broadcast_in_dim %117, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
    %119 = stablehlo.multiply %118, %67 : tensor<2x3xf32>
    %120 = stablehlo.negate %119 : tensor<2x3xf32>
    %cst_31 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %121 = stablehlo.reduce(%120 init: %cst_31) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %122 = stablehlo.reshape %121 : (tensor<2xf32>) -> tensor<2x1xf32>
    %123 = stablehlo.add %96, %119 : tensor<2x3xf32>
    %124 = stablehlo.negate %113 : tensor<2x3xf32>
    %cst_32 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %125 = stablehlo.reduce(%124 init: %cst_32) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %126 = stablehlo.reshape %125 : (tensor<2xf32>) -> tensor<2x1xf32>
    %127 = stablehlo.add %123, %113 : tensor<2x3xf32>
    %128 = stablehlo.add %122, %126 : tensor<2x1xf32>
    %cst_33 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %129 = stablehlo.broadcast_in_dim %cst_33, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %130 = stablehlo.divide %128, %129 : tensor<2x1xf32>
    %cst_34 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %131 = stablehlo.reduce(%130 init: %cst_34) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %132 = stablehlo.broadcast_in_dim %131, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
    %133 = stablehlo.add %127, %132 : tensor<2x3xf32>
    %134 = stablehlo.multiply %133, %55 : tensor<2x3xf32>
    %135 = stablehlo.multiply %134, %53 : tensor<2x3xf32>
    %136 = stablehlo.add %134, %135 : tensor<2x3xf32>
    %137 = stablehlo.dot_general %136, %51, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<3x3xf32>
    %138 = stablehlo.transpose %137, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %139 = stablehlo.dot_general %136, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %140 = stablehlo.multiply %48, %139 : tensor<2x3xf32>
    %cst_35 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %141 = stablehlo.reduce(%140 init: %cst_35) applies stablehlo.add across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
    %142 = stablehlo.reshape %141 : (tensor<3xf32>) -> tensor<1x3xf32>
    %143 = stablehlo.broadcast_in_dim %49, dims = [0, 1] : (tensor<1x3xf32>) -> tensor<2x3xf32>
    %144 = stablehlo.multiply %139, %143 : tensor<2x3xf32>
    %cst_36 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %145 = stablehlo.reduce(%142 init: %cst_36) applies stablehlo.add across dimensions = [0] : (tensor<1x3xf32>, tensor<f32>) -> tensor<3xf32>
    %146 = stablehlo.multiply %31, %144 : tensor<2x3xf32>
    %cst_37 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %147 = stablehlo.reduce(%146 init: %cst_37) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %148 = stablehlo.reshape %147 : (tensor<2xf32>) -> tensor<2x1xf32>
    %149 = stablehlo.broadcast_in_dim %43, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x3xf32>
    %150 = stablehlo.multiply %144, %149 : tensor<2x3xf32>
    %151 = stablehlo.multiply %148, %46 : tensor<2x1xf32>
    %cst_38 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %152 = stablehlo.broadcast_in_dim %cst_38, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %153 = stablehlo.divide %151, %152 : tensor<2x1xf32>
    %cst_39 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %154 = stablehlo.reduce(%153 init: %cst_39) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %155 = stablehlo.broadcast_in_dim %154, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
    %156 = stablehlo.multiply %155, %36 : tensor<2x3xf32>
    %157 = stablehlo.negate %156 : tensor<2x3xf32>
    %cst_40 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %158 = stablehlo.reduce(%157 init: %cst_40) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %159 = stablehlo.reshape %158 : (tensor<2xf32>) -> tensor<2x1xf32>
    %160 = stablehlo.add %133, %156 : tensor<2x3xf32>
    %161 = stablehlo.negate %150 : tensor<2x3xf32>
    %cst_41 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %162 = stablehlo.reduce(%161 init: %cst_41) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %163 = stablehlo.reshape %162 : (tensor<2xf32>) -> tensor<2x1xf32>
    %164 = stablehlo.add %160, %150 : tensor<2x3xf32>
    %165 = stablehlo.add %159, %163 : tensor<2x1xf32>
    %cst_42 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %166 = stablehlo.broadcast_in_dim %cst_42, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
    %167 = stablehlo.divide %165, %166 : tensor<2x1xf32>
    %cst_43 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %168 = stablehlo.reduce(%167 init: %cst_43) applies stablehlo.add across dimensions = [1] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2xf32>
    %169 = stablehlo.broadcast_in_dim %168, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
    %170 = stablehlo.add %164, %169 : tensor<2x3xf32>
    %171 = stablehlo.multiply %170, %24 : tensor<2x3xf32>
    %172 = stablehlo.multiply %171, %22 : tensor<2x3xf32>
    %173 = stablehlo.add %171, %172 : tensor<2x3xf32>
    %174 = stablehlo.dot_general %173, %20, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<3x3xf32>
    %175 = stablehlo.transpose %174, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %176 = stablehlo.dot_general %173, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %177 = stablehlo.multiply %17, %176 : tensor<2x3xf32>
    %cst_44 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %178 = stablehlo.reduce(%177 init: %cst_44) applies stablehlo.add across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
    %179 = stablehlo.reshape %178 : (tensor<3xf32>) -> tensor<1x3xf32>
    %cst_45 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %180 = stablehlo.reduce(%179 init: %cst_45) applies stablehlo.add across dimensions = [0] : (tensor<1x3xf32>, tensor<f32>) -> tensor<3xf32>
    %cst_46 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %181 = stablehlo.broadcast_in_dim %cst_46, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %182 = stablehlo.multiply %181, %180 : tensor<3xf32>
    %cst_47 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %183 = stablehlo.broadcast_in_dim %cst_47, dims = [] : (tensor<f32>) -> tensor<3x3xf32>
    %184 = stablehlo.multiply %183, %175 : tensor<3x3xf32>
    %cst_48 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %185 = stablehlo.broadcast_in_dim %cst_48, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %186 = stablehlo.multiply %185, %145 : tensor<3xf32>
    %cst_49 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %187 = stablehlo.broadcast_in_dim %cst_49, dims = [] : (tensor<f32>) -> tensor<3x3xf32>
    %188 = stablehlo.multiply %187, %138 : tensor<3x3xf32>
    %cst_50 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %189 = stablehlo.broadcast_in_dim %cst_50, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %190 = stablehlo.multiply %189, %108 : tensor<3xf32>
    %cst_51 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %191 = stablehlo.broadcast_in_dim %cst_51, dims = [] : (tensor<f32>) -> tensor<3x3xf32>
    %192 = stablehlo.multiply %191, %101 : tensor<3x3xf32>
    %193 = stablehlo.add %arg0, %182 : tensor<3xf32>
    %194 = stablehlo.add %arg1, %184 : tensor<3x3xf32>
    %195 = stablehlo.add %arg2, %186 : tensor<3xf32>
    %196 = stablehlo.add %arg3, %188 : tensor<3x3xf32>
    %197 = stablehlo.add %arg4, %190 : tensor<3xf32>
    %198 = stablehlo.add %arg5, %192 : tensor<3x3xf32>
    return %193, %194, %195, %196, %197, %198, %93 : tensor<3xf32>, tensor<3x3xf32>, tensor<3xf32>, tensor<3x3xf32>, tensor<3xf32>, tensor<3x3xf32>, tensor<f32>
  }
}

