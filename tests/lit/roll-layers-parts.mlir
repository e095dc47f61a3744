// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// Runs that roll around what differs between layers (roll-layers.mlir has the loops' structure). Each
// case is a traced SGD step over a list of layers ['w'][l] (jax's own lowering of @main and its functions).

// (a) A per-layer constant and a first layer that reads the data: x_{l+1} = x_l + tanh(x_l * w_l) / (l + 1)
// with x_0 the batch. The constants 1, 1/2, 1/3 differ between layers and nothing else does: each layer's
// is a broadcast of a scalar, so the scalars are stacked before the loops, and both loops read the layer's
// row and broadcast it (a stack of the broadcasts would hold the activation's size per layer). Layer 0's input has no
// gradient, so jax computes no input gradient there: the backward loop computes it at every layer
// (`x_l`'s cotangent, the carry's add), and at layer 0 it leaves the loop unread.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [0:3]: 3 layers of 14 ops each (5 forward, 9 backward)
// CHECK: %[[ONE_C:[a-z_0-9]+]] = stablehlo.constant dense<1.000000e+00> : tensor<f32>
// CHECK: %[[HALF_C:[a-z_0-9]+]] = stablehlo.constant dense<5.000000e-01> : tensor<f32>
// CHECK-NEXT: %[[THIRD_C:[a-z_0-9]+]] = stablehlo.constant dense<0.333333343> : tensor<f32>
// CHECK: %[[R0:[0-9]+]] = stablehlo.reshape %[[ONE_C]] : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[R1:[0-9]+]] = stablehlo.reshape %[[HALF_C]] : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[R2:[0-9]+]] = stablehlo.reshape %[[THIRD_C]] : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[SCALES:[0-9]+]] = stablehlo.concatenate %[[R0]], %[[R1]], %[[R2]], dim = 0 : (tensor<1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<3xf32>
// CHECK: stablehlo.while(%{{.*}}, %{{[a-zA-Z0-9_]+}} = %arg3,
// CHECK: } do {
// CHECK: %[[ROW:[0-9]+]] = stablehlo.dynamic_slice %[[SCALES]], %iterArg, sizes = [1]
// CHECK-NEXT: %[[SCALE:[0-9]+]] = stablehlo.reshape %[[ROW]] : (tensor<1xf32>) -> tensor<f32>
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[SCALE]], dims = [] : (tensor<f32>) -> tensor<2xf32>
// CHECK: stablehlo.return
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: %[[LAYER:[0-9]+]] = stablehlo.subtract %{{.*}}, %iterArg : tensor<i32>
// CHECK: stablehlo.dynamic_slice %[[SCALES]], %[[LAYER]], sizes = [1]
// CHECK: %[[DX:[0-9]+]] = stablehlo.add %iterArg_{{[0-9]+}}, %{{[0-9]+}} : tensor<2xf32>
// CHECK: stablehlo.return %{{[0-9]+}}, %[[DX]],
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg3: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 3 : i32}) {
    %0 = stablehlo.multiply %arg3, %arg0 : tensor<2xf32>
    %1 = stablehlo.tanh %0 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %5 = stablehlo.multiply %1, %4 : tensor<2xf32>
    %6 = stablehlo.add %arg3, %5 : tensor<2xf32>
    %7 = stablehlo.multiply %6, %arg1 : tensor<2xf32>
    %8 = stablehlo.tanh %7 : tensor<2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
    %cst_2 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %11 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %12 = stablehlo.multiply %8, %11 : tensor<2xf32>
    %13 = stablehlo.add %6, %12 : tensor<2xf32>
    %14 = stablehlo.multiply %13, %arg2 : tensor<2xf32>
    %15 = stablehlo.tanh %14 : tensor<2xf32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %16 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %17 = stablehlo.subtract %16, %15 : tensor<2xf32>
    %cst_4 = stablehlo.constant dense<0.333333343> : tensor<f32>
    %18 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %19 = stablehlo.multiply %15, %18 : tensor<2xf32>
    %20 = stablehlo.add %13, %19 : tensor<2xf32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %21 = stablehlo.reduce(%20 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    %cst_6 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %22 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %cst_7 = stablehlo.constant dense<0.333333343> : tensor<f32>
    %23 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %24 = stablehlo.multiply %22, %23 : tensor<2xf32>
    %25 = stablehlo.multiply %24, %17 : tensor<2xf32>
    %26 = stablehlo.multiply %25, %15 : tensor<2xf32>
    %27 = stablehlo.add %25, %26 : tensor<2xf32>
    %28 = stablehlo.multiply %13, %27 : tensor<2xf32>
    %29 = stablehlo.multiply %27, %arg2 : tensor<2xf32>
    %30 = stablehlo.add %22, %29 : tensor<2xf32>
    %cst_8 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %31 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %32 = stablehlo.multiply %30, %31 : tensor<2xf32>
    %33 = stablehlo.multiply %32, %10 : tensor<2xf32>
    %34 = stablehlo.multiply %33, %8 : tensor<2xf32>
    %35 = stablehlo.add %33, %34 : tensor<2xf32>
    %36 = stablehlo.multiply %6, %35 : tensor<2xf32>
    %37 = stablehlo.multiply %35, %arg1 : tensor<2xf32>
    %38 = stablehlo.add %30, %37 : tensor<2xf32>
    %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %40 = stablehlo.multiply %38, %39 : tensor<2xf32>
    %41 = stablehlo.multiply %40, %3 : tensor<2xf32>
    %42 = stablehlo.multiply %41, %1 : tensor<2xf32>
    %43 = stablehlo.add %41, %42 : tensor<2xf32>
    %44 = stablehlo.multiply %arg3, %43 : tensor<2xf32>
    %cst_10 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %45 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %46 = stablehlo.multiply %45, %44 : tensor<2xf32>
    %47 = stablehlo.subtract %arg0, %46 : tensor<2xf32>
    %cst_11 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %48 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %49 = stablehlo.multiply %48, %36 : tensor<2xf32>
    %50 = stablehlo.subtract %arg1, %49 : tensor<2xf32>
    %cst_12 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %51 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %52 = stablehlo.multiply %51, %28 : tensor<2xf32>
    %53 = stablehlo.subtract %arg2, %52 : tensor<2xf32>
    return %47, %50, %53, %21 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
  }
}

// -----

// (b) An unlike first layer: layer 0 applies sin, layers 1 .. 3 tanh. The whole run's analysis points
// at layer 0 (the operands that fit no class do at it); layers 1 .. 3 roll and layer 0 stays as it is.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [1:4]: 3 layers of 12 ops each (4 forward, 8 backward){{.*}}; layer 0 left as it is: its ops differ from the others'"
// CHECK: stablehlo.sine
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: stablehlo.tanh
// CHECK-NOT: stablehlo.sine
// CHECK: stablehlo.return
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['v']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32> {loopfuse.state = "['w'][3]"}, %arg5: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<2xf32> {loopfuse.result = 4 : i32, loopfuse.state = "['w'][3]"}, tensor<f32> {loopfuse.result = 5 : i32}) {
    %0 = stablehlo.multiply %arg5, %arg0 : tensor<2xf32>
    %1 = stablehlo.multiply %0, %arg1 : tensor<2xf32>
    %2 = stablehlo.sine %1 : tensor<2xf32>
    %3 = stablehlo.cosine %1 : tensor<2xf32>
    %4 = stablehlo.add %0, %2 : tensor<2xf32>
    %5 = stablehlo.multiply %4, %arg2 : tensor<2xf32>
    %6 = stablehlo.tanh %5 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %8 = stablehlo.subtract %7, %6 : tensor<2xf32>
    %9 = stablehlo.add %4, %6 : tensor<2xf32>
    %10 = stablehlo.multiply %9, %arg3 : tensor<2xf32>
    %11 = stablehlo.tanh %10 : tensor<2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %13 = stablehlo.subtract %12, %11 : tensor<2xf32>
    %14 = stablehlo.add %9, %11 : tensor<2xf32>
    %15 = stablehlo.multiply %14, %arg4 : tensor<2xf32>
    %16 = stablehlo.tanh %15 : tensor<2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %17 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %18 = stablehlo.subtract %17, %16 : tensor<2xf32>
    %19 = stablehlo.add %14, %16 : tensor<2xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %20 = stablehlo.reduce(%19 init: %cst_2) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %21 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %22 = stablehlo.multiply %21, %18 : tensor<2xf32>
    %23 = stablehlo.multiply %22, %16 : tensor<2xf32>
    %24 = stablehlo.add %22, %23 : tensor<2xf32>
    %25 = stablehlo.multiply %14, %24 : tensor<2xf32>
    %26 = stablehlo.multiply %24, %arg4 : tensor<2xf32>
    %27 = stablehlo.add %21, %26 : tensor<2xf32>
    %28 = stablehlo.multiply %27, %13 : tensor<2xf32>
    %29 = stablehlo.multiply %28, %11 : tensor<2xf32>
    %30 = stablehlo.add %28, %29 : tensor<2xf32>
    %31 = stablehlo.multiply %9, %30 : tensor<2xf32>
    %32 = stablehlo.multiply %30, %arg3 : tensor<2xf32>
    %33 = stablehlo.add %27, %32 : tensor<2xf32>
    %34 = stablehlo.multiply %33, %8 : tensor<2xf32>
    %35 = stablehlo.multiply %34, %6 : tensor<2xf32>
    %36 = stablehlo.add %34, %35 : tensor<2xf32>
    %37 = stablehlo.multiply %4, %36 : tensor<2xf32>
    %38 = stablehlo.multiply %36, %arg2 : tensor<2xf32>
    %39 = stablehlo.add %33, %38 : tensor<2xf32>
    %40 = stablehlo.multiply %39, %3 : tensor<2xf32>
    %41 = stablehlo.multiply %0, %40 : tensor<2xf32>
    %42 = stablehlo.multiply %40, %arg1 : tensor<2xf32>
    %43 = stablehlo.add %39, %42 : tensor<2xf32>
    %44 = stablehlo.multiply %arg5, %43 : tensor<2xf32>
    %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %45 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %46 = stablehlo.multiply %45, %44 : tensor<2xf32>
    %47 = stablehlo.subtract %arg0, %46 : tensor<2xf32>
    %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %48 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %49 = stablehlo.multiply %48, %41 : tensor<2xf32>
    %50 = stablehlo.subtract %arg1, %49 : tensor<2xf32>
    %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %51 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %52 = stablehlo.multiply %51, %37 : tensor<2xf32>
    %53 = stablehlo.subtract %arg2, %52 : tensor<2xf32>
    %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %54 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %55 = stablehlo.multiply %54, %31 : tensor<2xf32>
    %56 = stablehlo.subtract %arg3, %55 : tensor<2xf32>
    %cst_8 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %57 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %58 = stablehlo.multiply %57, %25 : tensor<2xf32>
    %59 = stablehlo.subtract %arg4, %58 : tensor<2xf32>
    return %47, %50, %53, %56, %59, %20 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
  }
}

// -----

// (c) A fori_loop in every layer: jax traces each layer's loop body to a function of its own name
// (@closed_call, @closed_call_0, ... for the forward loops, three more for their transposes); an op
// names a call by its callee's body, so the layers' loops are alike and roll: the forward loop and
// the backward loop's recomputation call layer 0's forward function, the backward loop one transpose.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [0:3]: 3 layers of 6 ops each (2 forward, 4 backward)
// CHECK: stablehlo.while
// CHECK: func.call @closed_call(
// CHECK: stablehlo.while
// CHECK: func.call @closed_call(
// CHECK: func.call @closed_call_{{[0-9]}}(
// CHECK-NOT: func.call @closed_call
// CHECK: func.func private @closed_call(
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['v']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 4 : i32}) {
    %0 = stablehlo.multiply %arg4, %arg0 : tensor<2xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %4:6 = stablehlo.while(%iterArg = %arg1, %iterArg_22 = %c, %iterArg_23 = %0, %iterArg_24 = %1, %iterArg_25 = %2, %iterArg_26 = %3) : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    cond {
      %c_27 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_22, %c_27, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %40:4 = func.call @closed_call(%iterArg, %iterArg_23) : (tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)
      %41 = func.call @dynamic_update_index_in_dim(%iterArg_24, %40#1, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %42 = func.call @dynamic_update_index_in_dim(%iterArg_25, %40#2, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %43 = func.call @dynamic_update_index_in_dim(%iterArg_26, %40#3, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %c_27 = stablehlo.constant dense<1> : tensor<i32>
      %44 = stablehlo.add %iterArg_22, %c_27 : tensor<i32>
      stablehlo.return %iterArg, %44, %40#0, %41, %42, %43 : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    }
    %5 = stablehlo.add %0, %4#2 : tensor<2xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %6 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %7 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %8 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %9:6 = stablehlo.while(%iterArg = %arg2, %iterArg_22 = %c_5, %iterArg_23 = %5, %iterArg_24 = %6, %iterArg_25 = %7, %iterArg_26 = %8) : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    cond {
      %c_27 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_22, %c_27, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %40:4 = func.call @closed_call_0(%iterArg, %iterArg_23) : (tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)
      %41 = func.call @dynamic_update_index_in_dim(%iterArg_24, %40#1, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %42 = func.call @dynamic_update_index_in_dim(%iterArg_25, %40#2, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %43 = func.call @dynamic_update_index_in_dim(%iterArg_26, %40#3, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %c_27 = stablehlo.constant dense<1> : tensor<i32>
      %44 = stablehlo.add %iterArg_22, %c_27 : tensor<i32>
      stablehlo.return %iterArg, %44, %40#0, %41, %42, %43 : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    }
    %10 = stablehlo.add %5, %9#2 : tensor<2xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %11 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %c_9 = stablehlo.constant dense<0> : tensor<i32>
    %14:6 = stablehlo.while(%iterArg = %arg3, %iterArg_22 = %c_9, %iterArg_23 = %10, %iterArg_24 = %11, %iterArg_25 = %12, %iterArg_26 = %13) : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    cond {
      %c_27 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_22, %c_27, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %40:4 = func.call @closed_call_1(%iterArg, %iterArg_23) : (tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)
      %41 = func.call @dynamic_update_index_in_dim(%iterArg_24, %40#1, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %42 = func.call @dynamic_update_index_in_dim(%iterArg_25, %40#2, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %43 = func.call @dynamic_update_index_in_dim(%iterArg_26, %40#3, %iterArg_22) : (tensor<2x2xf32>, tensor<2xf32>, tensor<i32>) -> tensor<2x2xf32>
      %c_27 = stablehlo.constant dense<1> : tensor<i32>
      %44 = stablehlo.add %iterArg_22, %c_27 : tensor<i32>
      stablehlo.return %iterArg, %44, %40#0, %41, %42, %43 : tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
    }
    %15 = stablehlo.add %10, %14#2 : tensor<2xf32>
    %cst_10 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %16 = stablehlo.reduce(%15 init: %cst_10) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    %cst_11 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %17 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %cst_12 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %19:7 = stablehlo.while(%iterArg = %14#3, %iterArg_22 = %14#4, %iterArg_23 = %14#5, %iterArg_24 = %arg3, %iterArg_25 = %c_13, %iterArg_26 = %18, %iterArg_27 = %17) : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    cond {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_25, %c_28, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.subtract %c_28, %iterArg_25 : tensor<i32>
      %c_29 = stablehlo.constant dense<1> : tensor<i32>
      %41 = stablehlo.subtract %40, %c_29 : tensor<i32>
      %42 = func.call @dynamic_index_in_dim(%iterArg, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %43 = func.call @dynamic_index_in_dim(%iterArg_22, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %44 = func.call @dynamic_index_in_dim(%iterArg_23, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %45:2 = func.call @closed_call_2(%iterArg_24, %iterArg_26, %iterArg_27, %42, %43, %44) : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
      %c_30 = stablehlo.constant dense<1> : tensor<i32>
      %46 = stablehlo.add %iterArg_25, %c_30 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_22, %iterArg_23, %iterArg_24, %46, %45#0, %45#1 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    }
    %20 = stablehlo.add %17, %19#6 : tensor<2xf32>
    %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %21 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %22:7 = stablehlo.while(%iterArg = %9#3, %iterArg_22 = %9#4, %iterArg_23 = %9#5, %iterArg_24 = %arg2, %iterArg_25 = %c_15, %iterArg_26 = %21, %iterArg_27 = %20) : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    cond {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_25, %c_28, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.subtract %c_28, %iterArg_25 : tensor<i32>
      %c_29 = stablehlo.constant dense<1> : tensor<i32>
      %41 = stablehlo.subtract %40, %c_29 : tensor<i32>
      %42 = func.call @dynamic_index_in_dim(%iterArg, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %43 = func.call @dynamic_index_in_dim(%iterArg_22, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %44 = func.call @dynamic_index_in_dim(%iterArg_23, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %45:2 = func.call @closed_call_3(%iterArg_24, %iterArg_26, %iterArg_27, %42, %43, %44) : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
      %c_30 = stablehlo.constant dense<1> : tensor<i32>
      %46 = stablehlo.add %iterArg_25, %c_30 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_22, %iterArg_23, %iterArg_24, %46, %45#0, %45#1 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    }
    %23 = stablehlo.add %20, %22#6 : tensor<2xf32>
    %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %24 = stablehlo.broadcast_in_dim %cst_16, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %25:7 = stablehlo.while(%iterArg = %4#3, %iterArg_22 = %4#4, %iterArg_23 = %4#5, %iterArg_24 = %arg1, %iterArg_25 = %c_17, %iterArg_26 = %24, %iterArg_27 = %23) : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    cond {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.compare LT, %iterArg_25, %c_28, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %40 : tensor<i1>
    } do {
      %c_28 = stablehlo.constant dense<2> : tensor<i32>
      %40 = stablehlo.subtract %c_28, %iterArg_25 : tensor<i32>
      %c_29 = stablehlo.constant dense<1> : tensor<i32>
      %41 = stablehlo.subtract %40, %c_29 : tensor<i32>
      %42 = func.call @dynamic_index_in_dim(%iterArg, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %43 = func.call @dynamic_index_in_dim(%iterArg_22, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %44 = func.call @dynamic_index_in_dim(%iterArg_23, %41) : (tensor<2x2xf32>, tensor<i32>) -> tensor<2xf32>
      %45:2 = func.call @closed_call_4(%iterArg_24, %iterArg_26, %iterArg_27, %42, %43, %44) : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
      %c_30 = stablehlo.constant dense<1> : tensor<i32>
      %46 = stablehlo.add %iterArg_25, %c_30 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_22, %iterArg_23, %iterArg_24, %46, %45#0, %45#1 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<i32>, tensor<2xf32>, tensor<2xf32>
    }
    %26 = stablehlo.add %23, %25#6 : tensor<2xf32>
    %27 = stablehlo.multiply %arg4, %26 : tensor<2xf32>
    %cst_18 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %28 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %29 = stablehlo.multiply %28, %27 : tensor<2xf32>
    %30 = stablehlo.subtract %arg0, %29 : tensor<2xf32>
    %cst_19 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %31 = stablehlo.broadcast_in_dim %cst_19, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %32 = stablehlo.multiply %31, %25#5 : tensor<2xf32>
    %33 = stablehlo.subtract %arg1, %32 : tensor<2xf32>
    %cst_20 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %34 = stablehlo.broadcast_in_dim %cst_20, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %35 = stablehlo.multiply %34, %22#5 : tensor<2xf32>
    %36 = stablehlo.subtract %arg2, %35 : tensor<2xf32>
    %cst_21 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %37 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %38 = stablehlo.multiply %37, %19#5 : tensor<2xf32>
    %39 = stablehlo.subtract %arg3, %38 : tensor<2xf32>
    return %30, %33, %36, %39, %16 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
  }
  func.func private @closed_call(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg1, %arg0 : tensor<2xf32>
    %1 = stablehlo.tanh %0 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2xf32>
    return %1, %arg1, %1, %3 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  }
  func.func private @dynamic_update_index_in_dim(%arg0: tensor<2x2xf32>, %arg1: tensor<2xf32>, %arg2: tensor<i32>) -> tensor<2x2xf32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.dynamic_update_slice %arg0, %0, %arg2, %c : (tensor<2x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
    return %1 : tensor<2x2xf32>
  }
  func.func private @closed_call_0(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg1, %arg0 : tensor<2xf32>
    %1 = stablehlo.tanh %0 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2xf32>
    return %1, %arg1, %1, %3 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  }
  func.func private @closed_call_1(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg1, %arg0 : tensor<2xf32>
    %1 = stablehlo.tanh %0 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2xf32>
    return %1, %arg1, %1, %3 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<2x2xf32>, %arg1: tensor<i32>) -> tensor<2xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, sizes = [1, 2] : (tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x2xf32>) -> tensor<2xf32>
    return %1 : tensor<2xf32>
  }
  func.func private @closed_call_2(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>, %arg2: tensor<2xf32>, %arg3: tensor<2xf32>, %arg4: tensor<2xf32>, %arg5: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg2, %arg5 : tensor<2xf32>
    %1 = stablehlo.multiply %0, %arg4 : tensor<2xf32>
    %2 = stablehlo.add %0, %1 : tensor<2xf32>
    %3 = stablehlo.multiply %arg3, %2 : tensor<2xf32>
    %4 = stablehlo.add %arg1, %3 : tensor<2xf32>
    %5 = stablehlo.multiply %2, %arg0 : tensor<2xf32>
    return %4, %5 : tensor<2xf32>, tensor<2xf32>
  }
  func.func private @closed_call_3(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>, %arg2: tensor<2xf32>, %arg3: tensor<2xf32>, %arg4: tensor<2xf32>, %arg5: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg2, %arg5 : tensor<2xf32>
    %1 = stablehlo.multiply %0, %arg4 : tensor<2xf32>
    %2 = stablehlo.add %0, %1 : tensor<2xf32>
    %3 = stablehlo.multiply %arg3, %2 : tensor<2xf32>
    %4 = stablehlo.add %arg1, %3 : tensor<2xf32>
    %5 = stablehlo.multiply %2, %arg0 : tensor<2xf32>
    return %4, %5 : tensor<2xf32>, tensor<2xf32>
  }
  func.func private @closed_call_4(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>, %arg2: tensor<2xf32>, %arg3: tensor<2xf32>, %arg4: tensor<2xf32>, %arg5: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
    %0 = stablehlo.multiply %arg2, %arg5 : tensor<2xf32>
    %1 = stablehlo.multiply %0, %arg4 : tensor<2xf32>
    %2 = stablehlo.add %0, %1 : tensor<2xf32>
    %3 = stablehlo.multiply %arg3, %2 : tensor<2xf32>
    %4 = stablehlo.add %arg1, %3 : tensor<2xf32>
    %5 = stablehlo.multiply %2, %arg0 : tensor<2xf32>
    return %4, %5 : tensor<2xf32>, tensor<2xf32>
  }
}

// -----

// (d) A packed buffer whose first and last layers differ (a stem, a last block): x_{l+1} = x_l +
// act_l(x_l * w_l) with sin, tanh, tanh, cos, the four w_l packed into one buffer
// (loopfuse.pack(layers=True)). Layers 1 .. 2 roll over the whole buffer viewed as rows, from row 1;
// the rows of layers 0 and 3 are read into buffers of their own inside a loop before anything else
// (no slice of the buffer is left for XLA to read after the loops write it in place), and their new
// rows are written over the loops' result inside a loop after them, in place, not concatenated.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [1:3]: 2 layers of 12 ops each (4 forward, 8 backward){{.*}}; layers 0 and 3 left as they are: their ops differ from the others'"
// CHECK-NOT: stablehlo.slice %arg0 [{{[0-9]}}:{{[2-8]}}]
// CHECK: %[[READ:[0-9]+]]:4 = stablehlo.while(%iterArg = %{{[a-z_0-9]+}}, %iterArg_{{[0-9]+}} = %arg0,
// CHECK: } do {
// CHECK: stablehlo.dynamic_slice %iterArg_{{[0-9]+}}, %{{[a-z_0-9]+}}, sizes = [2] : (tensor<8xf32>, tensor<i32>) -> tensor<2xf32>
// CHECK: stablehlo.dynamic_slice %iterArg_{{[0-9]+}}, %{{[a-z_0-9]+}}, sizes = [2] : (tensor<8xf32>, tensor<i32>) -> tensor<2xf32>
// CHECK: stablehlo.multiply %arg1, %[[READ]]#3 : tensor<2xf32>
// CHECK: %[[ROWS:[0-9]+]] = stablehlo.reshape %arg0 : (tensor<8xf32>) -> tensor<4x2xf32>
// CHECK: %[[FORWARD:[0-9]+]]:4 = stablehlo.while({{.*}}, %iterArg_{{[0-9]+}} = %[[ROWS]])
// CHECK: stablehlo.multiply %[[FORWARD]]#1, %[[READ]]#2 : tensor<2xf32>
// CHECK: %[[BACKWARD:[0-9]+]]:4 = stablehlo.while({{.*}}, %iterArg_{{[0-9]+}} = %[[FORWARD]]#3,
// CHECK: %[[FIRST:[0-9]+]]:3 = stablehlo.while(%iterArg = %{{[a-z_0-9]+}}, %iterArg_{{[0-9]+}} = %[[BACKWARD]]#2,
// CHECK: %[[FLAT:[0-9]+]] = stablehlo.reshape %[[FIRST]]#1 : (tensor<4x2xf32>) -> tensor<8xf32>
// CHECK: %[[WRITE:[0-9]+]]:4 = stablehlo.while(%iterArg = %{{[a-z_0-9]+}}, %iterArg_{{[0-9]+}} = %[[FLAT]],
// CHECK: } do {
// CHECK: stablehlo.dynamic_update_slice %iterArg_{{[0-9]+}}, %iterArg_{{[0-9]+}}, %{{[a-z_0-9]+}} : (tensor<8xf32>, tensor<2xf32>, tensor<i32>) -> tensor<8xf32>
// CHECK: stablehlo.dynamic_update_slice %{{[0-9]+}}, %iterArg_{{[0-9]+}}, %{{[a-z_0-9]+}} : (tensor<8xf32>, tensor<2xf32>, tensor<i32>) -> tensor<8xf32>
// CHECK-NOT: stablehlo.concatenate
// CHECK: return %[[WRITE]]#1, %{{[0-9]+}} : tensor<8xf32>, tensor<f32>
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xf32> {loopfuse.packed = ["['w'][0]", "['w'][1]", "['w'][2]", "['w'][3]"], loopfuse.state = ".buffers[0]"}, %arg1: tensor<2xf32>) -> (tensor<8xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = ".buffers[0]"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 1 : i32}) {
    %0 = stablehlo.slice %arg0 [0:2] : (tensor<8xf32>) -> tensor<2xf32>
    %1 = stablehlo.slice %arg0 [2:4] : (tensor<8xf32>) -> tensor<2xf32>
    %2 = stablehlo.slice %arg0 [4:6] : (tensor<8xf32>) -> tensor<2xf32>
    %3 = stablehlo.slice %arg0 [6:8] : (tensor<8xf32>) -> tensor<2xf32>
    %4 = stablehlo.multiply %arg1, %0 : tensor<2xf32>
    %5 = stablehlo.sine %4 : tensor<2xf32>
    %6 = stablehlo.cosine %4 : tensor<2xf32>
    %7 = stablehlo.add %arg1, %5 : tensor<2xf32>
    %8 = stablehlo.multiply %7, %1 : tensor<2xf32>
    %9 = stablehlo.tanh %8 : tensor<2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %10 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %11 = stablehlo.subtract %10, %9 : tensor<2xf32>
    %12 = stablehlo.add %7, %9 : tensor<2xf32>
    %13 = stablehlo.multiply %12, %2 : tensor<2xf32>
    %14 = stablehlo.tanh %13 : tensor<2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %16 = stablehlo.subtract %15, %14 : tensor<2xf32>
    %17 = stablehlo.add %12, %14 : tensor<2xf32>
    %18 = stablehlo.multiply %17, %3 : tensor<2xf32>
    %19 = stablehlo.cosine %18 : tensor<2xf32>
    %20 = stablehlo.sine %18 : tensor<2xf32>
    %21 = stablehlo.add %17, %19 : tensor<2xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %22 = stablehlo.reduce(%21 init: %cst_1) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %23 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %24 = stablehlo.negate %23 : tensor<2xf32>
    %25 = stablehlo.multiply %24, %20 : tensor<2xf32>
    %26 = stablehlo.multiply %17, %25 : tensor<2xf32>
    %27 = stablehlo.multiply %25, %3 : tensor<2xf32>
    %28 = stablehlo.add %23, %27 : tensor<2xf32>
    %29 = stablehlo.multiply %28, %16 : tensor<2xf32>
    %30 = stablehlo.multiply %29, %14 : tensor<2xf32>
    %31 = stablehlo.add %29, %30 : tensor<2xf32>
    %32 = stablehlo.multiply %12, %31 : tensor<2xf32>
    %33 = stablehlo.multiply %31, %2 : tensor<2xf32>
    %34 = stablehlo.add %28, %33 : tensor<2xf32>
    %35 = stablehlo.multiply %34, %11 : tensor<2xf32>
    %36 = stablehlo.multiply %35, %9 : tensor<2xf32>
    %37 = stablehlo.add %35, %36 : tensor<2xf32>
    %38 = stablehlo.multiply %7, %37 : tensor<2xf32>
    %39 = stablehlo.multiply %37, %1 : tensor<2xf32>
    %40 = stablehlo.add %34, %39 : tensor<2xf32>
    %41 = stablehlo.multiply %40, %6 : tensor<2xf32>
    %42 = stablehlo.multiply %arg1, %41 : tensor<2xf32>
    %cst_3 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %43 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %44 = stablehlo.multiply %43, %42 : tensor<2xf32>
    %45 = stablehlo.subtract %0, %44 : tensor<2xf32>
    %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %47 = stablehlo.multiply %46, %38 : tensor<2xf32>
    %48 = stablehlo.subtract %1, %47 : tensor<2xf32>
    %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %49 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %50 = stablehlo.multiply %49, %32 : tensor<2xf32>
    %51 = stablehlo.subtract %2, %50 : tensor<2xf32>
    %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %52 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %53 = stablehlo.multiply %52, %26 : tensor<2xf32>
    %54 = stablehlo.subtract %3, %53 : tensor<2xf32>
    %55 = stablehlo.concatenate %45, %48, %51, %54, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<8xf32>
    return %55, %22 : tensor<8xf32>, tensor<f32>
  }
}
