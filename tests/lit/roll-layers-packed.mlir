// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers)' | filecheck %s

// A traced SGD step of loss = sum_l sum(tanh(x * w_l)) over a list of three layers ['w'][l], its state packed
// with the layers stacked (loopfuse.pack(state, layers=True): one buffer holding ['w'][0], ['w'][1], ['w'][2]).
// The layers are no chain (no value passes from one to the next), so nothing rolls, and the report says too
// that each call then takes the stacked buffer apart and builds it again (a copy in temporaries, which the
// state as a pytree does not cost). The step stays as traced.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "did not roll ['w'] [0:3]: no backward op is the same at every layer: nothing is differentiated through the layers\0Athe state holds layers stacked (loopfuse.pack(state, layers=True)) and none rolled: each call takes the stacks apart and builds them again, a copy of each in temporaries; pass the state as a pytree, or packed without layers=True"
// CHECK-NOT: stablehlo.while
// CHECK: stablehlo.concatenate %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, dim = 0

module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2xf32>) -> (tensor<6xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}) {
    %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
    %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
    %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
    %3 = stablehlo.multiply %arg1, %0 : tensor<2xf32>
    %4 = stablehlo.tanh %3 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %6 = stablehlo.subtract %5, %4 : tensor<2xf32>
    %7 = stablehlo.multiply %arg1, %1 : tensor<2xf32>
    %8 = stablehlo.tanh %7 : tensor<2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
    %11 = stablehlo.multiply %arg1, %2 : tensor<2xf32>
    %12 = stablehlo.tanh %11 : tensor<2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %14 = stablehlo.subtract %13, %12 : tensor<2xf32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %16 = stablehlo.multiply %15, %14 : tensor<2xf32>
    %17 = stablehlo.multiply %16, %12 : tensor<2xf32>
    %18 = stablehlo.add %16, %17 : tensor<2xf32>
    %19 = stablehlo.multiply %arg1, %18 : tensor<2xf32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %20 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %21 = stablehlo.multiply %20, %10 : tensor<2xf32>
    %22 = stablehlo.multiply %21, %8 : tensor<2xf32>
    %23 = stablehlo.add %21, %22 : tensor<2xf32>
    %24 = stablehlo.multiply %arg1, %23 : tensor<2xf32>
    %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %25 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %26 = stablehlo.multiply %25, %6 : tensor<2xf32>
    %27 = stablehlo.multiply %26, %4 : tensor<2xf32>
    %28 = stablehlo.add %26, %27 : tensor<2xf32>
    %29 = stablehlo.multiply %arg1, %28 : tensor<2xf32>
    %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %30 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %31 = stablehlo.multiply %30, %29 : tensor<2xf32>
    %32 = stablehlo.subtract %0, %31 : tensor<2xf32>
    %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %33 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %34 = stablehlo.multiply %33, %24 : tensor<2xf32>
    %35 = stablehlo.subtract %1, %34 : tensor<2xf32>
    %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %37 = stablehlo.multiply %36, %19 : tensor<2xf32>
    %38 = stablehlo.subtract %2, %37 : tensor<2xf32>
    %39 = stablehlo.concatenate %32, %35, %38, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
    return %39 : tensor<6xf32>
  }
}

// -----

// The same step, its buffer holding three leaves under other names (['a'], ['b'], ['c']: a pack without
// layers=True): no run of layers, and no word of stacked layers.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "no run of alike layers: no state leaves differ only in one index or key"
// CHECK-NOT: stablehlo.while

module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<6xf32> {loopfuse.packed = ["['a']", "['b']", "['c']"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2xf32>) -> (tensor<6xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}) {
    %0 = stablehlo.slice %arg0 [0:2] : (tensor<6xf32>) -> tensor<2xf32>
    %1 = stablehlo.slice %arg0 [2:4] : (tensor<6xf32>) -> tensor<2xf32>
    %2 = stablehlo.slice %arg0 [4:6] : (tensor<6xf32>) -> tensor<2xf32>
    %3 = stablehlo.multiply %arg1, %0 : tensor<2xf32>
    %4 = stablehlo.tanh %3 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %6 = stablehlo.subtract %5, %4 : tensor<2xf32>
    %7 = stablehlo.multiply %arg1, %1 : tensor<2xf32>
    %8 = stablehlo.tanh %7 : tensor<2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
    %11 = stablehlo.multiply %arg1, %2 : tensor<2xf32>
    %12 = stablehlo.tanh %11 : tensor<2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %14 = stablehlo.subtract %13, %12 : tensor<2xf32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %16 = stablehlo.multiply %15, %14 : tensor<2xf32>
    %17 = stablehlo.multiply %16, %12 : tensor<2xf32>
    %18 = stablehlo.add %16, %17 : tensor<2xf32>
    %19 = stablehlo.multiply %arg1, %18 : tensor<2xf32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %20 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %21 = stablehlo.multiply %20, %10 : tensor<2xf32>
    %22 = stablehlo.multiply %21, %8 : tensor<2xf32>
    %23 = stablehlo.add %21, %22 : tensor<2xf32>
    %24 = stablehlo.multiply %arg1, %23 : tensor<2xf32>
    %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %25 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %26 = stablehlo.multiply %25, %6 : tensor<2xf32>
    %27 = stablehlo.multiply %26, %4 : tensor<2xf32>
    %28 = stablehlo.add %26, %27 : tensor<2xf32>
    %29 = stablehlo.multiply %arg1, %28 : tensor<2xf32>
    %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %30 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %31 = stablehlo.multiply %30, %29 : tensor<2xf32>
    %32 = stablehlo.subtract %0, %31 : tensor<2xf32>
    %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %33 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %34 = stablehlo.multiply %33, %24 : tensor<2xf32>
    %35 = stablehlo.subtract %1, %34 : tensor<2xf32>
    %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %37 = stablehlo.multiply %36, %19 : tensor<2xf32>
    %38 = stablehlo.subtract %2, %37 : tensor<2xf32>
    %39 = stablehlo.concatenate %32, %35, %38, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<6xf32>
    return %39 : tensor<6xf32>
  }
}
