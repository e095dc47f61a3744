// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers{memory-budget=1.0})' | filecheck --check-prefix=KEEP %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers)' | filecheck --check-prefix=COST %s

// Each case (rolled with force=true) is a traced SGD step of x0 = x * v; x_{l+1} = x_l + act_l(x_l * w_l); loss = sum(x_L)
// over a list of three (or four) layers ['w'][l] (jax's own lowering, cut to @main).
// KEEP-NOT: stablehlo.while

// Without force, a state given leaf by leaf rolls only where stacking its layers' leaves inside the
// call costs less than the activations rolling saves: not in these tiny steps.
// COST: "did not roll ['w'] [0:3]: stacking the layers' leaves inside each call would cost 24 B of temporaries, more than the ~8 B of activations rolling saves; loopfuse.pack(state, layers=True) keeps them stacked between calls"
// COST-NOT: stablehlo.while
// The step is left exactly as traced (the analysis merges alike ops on the way, and puts them back):
// COST: %cst = stablehlo.constant dense<1.000000e+00>
// COST: %cst_0 = stablehlo.constant dense<1.000000e+00>

// (a) Three alike layers: the whole run rolls. The leaves are stacked; the forward loop runs one
// layer's forward ops, carrying x and saving it per layer; the backward loop recomputes the layer's
// forward ops from the saved x, runs its backward ops carrying the cotangent, and applies the SGD
// update there, to the stacked leaves (written one iteration late, in place; the first rows it
// carries are read at an index computed from the forward loop's result, so XLA reads them after that
// loop); the body builds the broadcasts of constants it reads anew (XLA fuses them there); layer 0's
// rows are written in a loop of their own after it (XLA copies a loop's result before a write that
// follows the loop); the new leaves are sliced out after that. The ops outside the run (x * v, the loss, v's update) stay
// as they are.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [0:3]: 3 layers of 12 ops each (4 forward, 8 backward); forward loop carries 1 value(s) of 8 B and saves it per layer; backward loop recomputes 3 forward op(s), carries 1 value(s); 1 stacked leaves updated inside the backward loop"
// CHECK: %[[X0:[0-9]+]] = stablehlo.multiply %arg4, %arg0
// CHECK: %[[STACK:[0-9]+]] = stablehlo.concatenate %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, dim = 0 : (tensor<1x2xf32>, tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<3x2xf32>
// CHECK: %[[FWD:[0-9]+]]:4 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %[[X0]], %{{[a-zA-Z0-9_]+}} = %{{[0-9]+}}, %{{[a-zA-Z0-9_]+}} = %[[STACK]])
// CHECK: } do {
// CHECK: stablehlo.dynamic_slice
// CHECK: stablehlo.tanh
// CHECK-NOT: stablehlo.subtract
// CHECK: stablehlo.dynamic_update_slice
// CHECK: stablehlo.return
// CHECK: stablehlo.reduce(%[[FWD]]#1
// CHECK: %[[X:[0-9]+]] = stablehlo.reshape
// CHECK: %[[NAN:[0-9]+]] = stablehlo.compare NE, %[[X]], %[[X]]
// CHECK: %[[ONE:[0-9]+]] = stablehlo.convert %[[NAN]]
// CHECK: %[[FIRST:[0-9]+]] = stablehlo.add %{{[a-z0-9_]+}}, %[[ONE]]
// CHECK: stablehlo.dynamic_slice %[[FWD]]#3, %[[FIRST]]
// CHECK: %[[BWD:[0-9]+]]:4 = stablehlo.while({{.*}} = %[[FWD]]#3,
// CHECK: } do {
// CHECK: %[[NEXT:[0-9]+]] = stablehlo.dynamic_update_slice
// CHECK: stablehlo.dynamic_slice %[[FWD]]#2
// CHECK: stablehlo.dynamic_slice %[[NEXT]]
// CHECK: stablehlo.tanh
// CHECK: stablehlo.broadcast_in_dim %cst, dims = []
// CHECK: stablehlo.subtract
// CHECK: stablehlo.return
// CHECK: %[[WRITE:[0-9]+]]:3 = stablehlo.while({{.*}} = %[[BWD]]#2, %{{[a-zA-Z0-9_]+}} = %[[BWD]]#3)
// CHECK: } do {
// CHECK: stablehlo.dynamic_update_slice
// CHECK: stablehlo.slice %[[WRITE]]#1 [0:1, 0:2]
// CHECK: stablehlo.slice %[[WRITE]]#1 [1:2, 0:2]
// CHECK: stablehlo.slice %[[WRITE]]#1 [2:3, 0:2]
// CHECK: stablehlo.subtract %arg0
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['v']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 4 : i32}) {
  %0 = stablehlo.multiply %arg4, %arg0 : tensor<2xf32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<2xf32>
  %2 = stablehlo.tanh %1 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %4 = stablehlo.subtract %3, %2 : tensor<2xf32>
  %5 = stablehlo.add %0, %2 : tensor<2xf32>
  %6 = stablehlo.multiply %5, %arg2 : tensor<2xf32>
  %7 = stablehlo.tanh %6 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %8 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %9 = stablehlo.subtract %8, %7 : tensor<2xf32>
  %10 = stablehlo.add %5, %7 : tensor<2xf32>
  %11 = stablehlo.multiply %10, %arg3 : tensor<2xf32>
  %12 = stablehlo.tanh %11 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %13 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %14 = stablehlo.subtract %13, %12 : tensor<2xf32>
  %15 = stablehlo.add %10, %12 : tensor<2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %16 = stablehlo.reduce(%15 init: %cst_2) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %17 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %18 = stablehlo.multiply %17, %14 : tensor<2xf32>
  %19 = stablehlo.multiply %18, %12 : tensor<2xf32>
  %20 = stablehlo.add %18, %19 : tensor<2xf32>
  %21 = stablehlo.multiply %10, %20 : tensor<2xf32>
  %22 = stablehlo.multiply %20, %arg3 : tensor<2xf32>
  %23 = stablehlo.add %17, %22 : tensor<2xf32>
  %24 = stablehlo.multiply %23, %9 : tensor<2xf32>
  %25 = stablehlo.multiply %24, %7 : tensor<2xf32>
  %26 = stablehlo.add %24, %25 : tensor<2xf32>
  %27 = stablehlo.multiply %5, %26 : tensor<2xf32>
  %28 = stablehlo.multiply %26, %arg2 : tensor<2xf32>
  %29 = stablehlo.add %23, %28 : tensor<2xf32>
  %30 = stablehlo.multiply %29, %4 : tensor<2xf32>
  %31 = stablehlo.multiply %30, %2 : tensor<2xf32>
  %32 = stablehlo.add %30, %31 : tensor<2xf32>
  %33 = stablehlo.multiply %0, %32 : tensor<2xf32>
  %34 = stablehlo.multiply %32, %arg1 : tensor<2xf32>
  %35 = stablehlo.add %29, %34 : tensor<2xf32>
  %36 = stablehlo.multiply %arg4, %35 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %37 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %38 = stablehlo.multiply %37, %36 : tensor<2xf32>
  %39 = stablehlo.subtract %arg0, %38 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %40 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.multiply %40, %33 : tensor<2xf32>
  %42 = stablehlo.subtract %arg1, %41 : tensor<2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %43 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %44 = stablehlo.multiply %43, %27 : tensor<2xf32>
  %45 = stablehlo.subtract %arg2, %44 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %46 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %47 = stablehlo.multiply %46, %21 : tensor<2xf32>
  %48 = stablehlo.subtract %arg3, %47 : tensor<2xf32>
  return %39, %42, %45, %48, %16 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (b) Near-isomorphic: layer 1 applies sin where the others apply tanh. No two neighbours are alike,
// so nothing rolls, and the report says why.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "did not roll ['w'] [0:3]: no op is the same at every layer (stablehlo.{{[a-z_]+}} (-:{{[0-9]+}}){{.*}}, and {{[0-9]+}} more)"
// CHECK-NOT: stablehlo.while
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['v']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 4 : i32}) {
  %0 = stablehlo.multiply %arg4, %arg0 : tensor<2xf32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<2xf32>
  %2 = stablehlo.tanh %1 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %4 = stablehlo.subtract %3, %2 : tensor<2xf32>
  %5 = stablehlo.add %0, %2 : tensor<2xf32>
  %6 = stablehlo.multiply %5, %arg2 : tensor<2xf32>
  %7 = stablehlo.sine %6 : tensor<2xf32>
  %8 = stablehlo.cosine %6 : tensor<2xf32>
  %9 = stablehlo.add %5, %7 : tensor<2xf32>
  %10 = stablehlo.multiply %9, %arg3 : tensor<2xf32>
  %11 = stablehlo.tanh %10 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %12 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %13 = stablehlo.subtract %12, %11 : tensor<2xf32>
  %14 = stablehlo.add %9, %11 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %15 = stablehlo.reduce(%14 init: %cst_1) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %16 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %17 = stablehlo.multiply %16, %13 : tensor<2xf32>
  %18 = stablehlo.multiply %17, %11 : tensor<2xf32>
  %19 = stablehlo.add %17, %18 : tensor<2xf32>
  %20 = stablehlo.multiply %9, %19 : tensor<2xf32>
  %21 = stablehlo.multiply %19, %arg3 : tensor<2xf32>
  %22 = stablehlo.add %16, %21 : tensor<2xf32>
  %23 = stablehlo.multiply %22, %8 : tensor<2xf32>
  %24 = stablehlo.multiply %5, %23 : tensor<2xf32>
  %25 = stablehlo.multiply %23, %arg2 : tensor<2xf32>
  %26 = stablehlo.add %22, %25 : tensor<2xf32>
  %27 = stablehlo.multiply %26, %4 : tensor<2xf32>
  %28 = stablehlo.multiply %27, %2 : tensor<2xf32>
  %29 = stablehlo.add %27, %28 : tensor<2xf32>
  %30 = stablehlo.multiply %0, %29 : tensor<2xf32>
  %31 = stablehlo.multiply %29, %arg1 : tensor<2xf32>
  %32 = stablehlo.add %26, %31 : tensor<2xf32>
  %33 = stablehlo.multiply %arg4, %32 : tensor<2xf32>
  %cst_3 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %34 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %35 = stablehlo.multiply %34, %33 : tensor<2xf32>
  %36 = stablehlo.subtract %arg0, %35 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %37 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %38 = stablehlo.multiply %37, %30 : tensor<2xf32>
  %39 = stablehlo.subtract %arg1, %38 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %40 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.multiply %40, %24 : tensor<2xf32>
  %42 = stablehlo.subtract %arg2, %41 : tensor<2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %43 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %44 = stablehlo.multiply %43, %20 : tensor<2xf32>
  %45 = stablehlo.subtract %arg3, %44 : tensor<2xf32>
  return %36, %39, %42, %45, %15 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (c) A partial run: the last of four layers applies sin. Layers 0 .. 2 roll; layer 3 stays as it is,
// after the forward loop (its forward ops) and before the backward loop (its backward ops and update).
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [0:3]: 3 layers of 12 ops each{{.*}}; layer 3 left as it is: its ops differ from the others'"
// CHECK: %[[FWD:[0-9]+]]:4 = stablehlo.while
// CHECK: stablehlo.tanh
// CHECK: %[[PRE:[0-9]+]] = stablehlo.multiply %[[FWD]]#1, %arg4
// CHECK: stablehlo.sine %[[PRE]]
// CHECK: stablehlo.subtract %arg4
// CHECK: stablehlo.while
// CHECK: stablehlo.tanh
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['v']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32> {loopfuse.state = "['w'][3]"}, %arg5: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<2xf32> {loopfuse.result = 4 : i32, loopfuse.state = "['w'][3]"}, tensor<f32> {loopfuse.result = 5 : i32}) {
  %0 = stablehlo.multiply %arg5, %arg0 : tensor<2xf32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<2xf32>
  %2 = stablehlo.tanh %1 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %4 = stablehlo.subtract %3, %2 : tensor<2xf32>
  %5 = stablehlo.add %0, %2 : tensor<2xf32>
  %6 = stablehlo.multiply %5, %arg2 : tensor<2xf32>
  %7 = stablehlo.tanh %6 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %8 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %9 = stablehlo.subtract %8, %7 : tensor<2xf32>
  %10 = stablehlo.add %5, %7 : tensor<2xf32>
  %11 = stablehlo.multiply %10, %arg3 : tensor<2xf32>
  %12 = stablehlo.tanh %11 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %13 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %14 = stablehlo.subtract %13, %12 : tensor<2xf32>
  %15 = stablehlo.add %10, %12 : tensor<2xf32>
  %16 = stablehlo.multiply %15, %arg4 : tensor<2xf32>
  %17 = stablehlo.sine %16 : tensor<2xf32>
  %18 = stablehlo.cosine %16 : tensor<2xf32>
  %19 = stablehlo.add %15, %17 : tensor<2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %20 = stablehlo.reduce(%19 init: %cst_2) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %21 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %22 = stablehlo.multiply %21, %18 : tensor<2xf32>
  %23 = stablehlo.multiply %15, %22 : tensor<2xf32>
  %24 = stablehlo.multiply %22, %arg4 : tensor<2xf32>
  %25 = stablehlo.add %21, %24 : tensor<2xf32>
  %26 = stablehlo.multiply %25, %14 : tensor<2xf32>
  %27 = stablehlo.multiply %26, %12 : tensor<2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2xf32>
  %29 = stablehlo.multiply %10, %28 : tensor<2xf32>
  %30 = stablehlo.multiply %28, %arg3 : tensor<2xf32>
  %31 = stablehlo.add %25, %30 : tensor<2xf32>
  %32 = stablehlo.multiply %31, %9 : tensor<2xf32>
  %33 = stablehlo.multiply %32, %7 : tensor<2xf32>
  %34 = stablehlo.add %32, %33 : tensor<2xf32>
  %35 = stablehlo.multiply %5, %34 : tensor<2xf32>
  %36 = stablehlo.multiply %34, %arg2 : tensor<2xf32>
  %37 = stablehlo.add %31, %36 : tensor<2xf32>
  %38 = stablehlo.multiply %37, %4 : tensor<2xf32>
  %39 = stablehlo.multiply %38, %2 : tensor<2xf32>
  %40 = stablehlo.add %38, %39 : tensor<2xf32>
  %41 = stablehlo.multiply %0, %40 : tensor<2xf32>
  %42 = stablehlo.multiply %40, %arg1 : tensor<2xf32>
  %43 = stablehlo.add %37, %42 : tensor<2xf32>
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
  %52 = stablehlo.multiply %51, %35 : tensor<2xf32>
  %53 = stablehlo.subtract %arg2, %52 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %54 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %55 = stablehlo.multiply %54, %29 : tensor<2xf32>
  %56 = stablehlo.subtract %arg3, %55 : tensor<2xf32>
  %cst_8 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %57 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %58 = stablehlo.multiply %57, %23 : tensor<2xf32>
  %59 = stablehlo.subtract %arg4, %58 : tensor<2xf32>
  return %47, %50, %53, %56, %59, %20 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (d) A leaf every layer reads (x_{l+1} = x_l + tanh(x_l * w_l) * s, s shared): the forward loop reads s
// as it is; its gradient, jax's sum of one value per layer in the backward order, ((g_2 + g_1) + g_0),
// is summed in the backward loop's carry (the first iteration takes g_2 itself, then adds each layer's
// in the same order and operand order), not saved per layer and summed after the loop; s's update
// reads the loop's sum.
// CHECK-LABEL: module
// CHECK-SAME: carries 1 value(s) and sums 1 over the layers (the gradient of a value every layer reads)
// CHECK: %[[BWD:[0-9]+]]:5 = stablehlo.while({{.*}}, %[[SUM:[a-zA-Z0-9_]+]] = %{{[0-9]+}}) : tensor<i32>, tensor<2xf32>, tensor<3x2xf32>, tensor<2xf32>, tensor<2xf32>
// CHECK: } do {
// CHECK: %[[G:[0-9]+]] = stablehlo.multiply %{{[0-9]+}}, %iterArg_9 : tensor<2xf32>
// CHECK: %[[FIRST:[0-9]+]] = stablehlo.compare EQ, %iterArg, %{{[a-z0-9_]+}}
// CHECK: %[[ADDED:[0-9]+]] = stablehlo.add %[[SUM]], %[[G]]
// CHECK: %[[NEXT:[0-9]+]] = stablehlo.select %[[FIRST]], %[[G]], %[[ADDED]]
// CHECK: stablehlo.return {{.*}}, %[[NEXT]] :
// CHECK-NOT: stablehlo.add {{.*}} : tensor<2xf32>
// CHECK: %[[STEP:[0-9]+]] = stablehlo.multiply %{{[0-9]+}}, %[[BWD]]#4
// CHECK: stablehlo.subtract %arg0, %[[STEP]]
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['s']"}, %arg1: tensor<2xf32> {loopfuse.state = "['v']"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg4: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg5: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['s']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['v']"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 4 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 5 : i32}) {
  %0 = stablehlo.multiply %arg5, %arg1 : tensor<2xf32>
  %1 = stablehlo.multiply %0, %arg2 : tensor<2xf32>
  %2 = stablehlo.tanh %1 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %4 = stablehlo.subtract %3, %2 : tensor<2xf32>
  %5 = stablehlo.multiply %2, %arg0 : tensor<2xf32>
  %6 = stablehlo.add %0, %5 : tensor<2xf32>
  %7 = stablehlo.multiply %6, %arg3 : tensor<2xf32>
  %8 = stablehlo.tanh %7 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %9 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
  %11 = stablehlo.multiply %8, %arg0 : tensor<2xf32>
  %12 = stablehlo.add %6, %11 : tensor<2xf32>
  %13 = stablehlo.multiply %12, %arg4 : tensor<2xf32>
  %14 = stablehlo.tanh %13 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %15 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %16 = stablehlo.subtract %15, %14 : tensor<2xf32>
  %17 = stablehlo.multiply %14, %arg0 : tensor<2xf32>
  %18 = stablehlo.add %12, %17 : tensor<2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %19 = stablehlo.reduce(%18 init: %cst_2) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %20 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %21 = stablehlo.multiply %14, %20 : tensor<2xf32>
  %22 = stablehlo.multiply %20, %arg0 : tensor<2xf32>
  %23 = stablehlo.multiply %22, %16 : tensor<2xf32>
  %24 = stablehlo.multiply %23, %14 : tensor<2xf32>
  %25 = stablehlo.add %23, %24 : tensor<2xf32>
  %26 = stablehlo.multiply %12, %25 : tensor<2xf32>
  %27 = stablehlo.multiply %25, %arg4 : tensor<2xf32>
  %28 = stablehlo.add %20, %27 : tensor<2xf32>
  %29 = stablehlo.multiply %8, %28 : tensor<2xf32>
  %30 = stablehlo.add %21, %29 : tensor<2xf32>
  %31 = stablehlo.multiply %28, %arg0 : tensor<2xf32>
  %32 = stablehlo.multiply %31, %10 : tensor<2xf32>
  %33 = stablehlo.multiply %32, %8 : tensor<2xf32>
  %34 = stablehlo.add %32, %33 : tensor<2xf32>
  %35 = stablehlo.multiply %6, %34 : tensor<2xf32>
  %36 = stablehlo.multiply %34, %arg3 : tensor<2xf32>
  %37 = stablehlo.add %28, %36 : tensor<2xf32>
  %38 = stablehlo.multiply %2, %37 : tensor<2xf32>
  %39 = stablehlo.add %30, %38 : tensor<2xf32>
  %40 = stablehlo.multiply %37, %arg0 : tensor<2xf32>
  %41 = stablehlo.multiply %40, %4 : tensor<2xf32>
  %42 = stablehlo.multiply %41, %2 : tensor<2xf32>
  %43 = stablehlo.add %41, %42 : tensor<2xf32>
  %44 = stablehlo.multiply %0, %43 : tensor<2xf32>
  %45 = stablehlo.multiply %43, %arg2 : tensor<2xf32>
  %46 = stablehlo.add %37, %45 : tensor<2xf32>
  %47 = stablehlo.multiply %arg5, %46 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %48 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %49 = stablehlo.multiply %48, %39 : tensor<2xf32>
  %50 = stablehlo.subtract %arg0, %49 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %51 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %52 = stablehlo.multiply %51, %47 : tensor<2xf32>
  %53 = stablehlo.subtract %arg1, %52 : tensor<2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %54 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %55 = stablehlo.multiply %54, %44 : tensor<2xf32>
  %56 = stablehlo.subtract %arg2, %55 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %57 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %58 = stablehlo.multiply %57, %35 : tensor<2xf32>
  %59 = stablehlo.subtract %arg3, %58 : tensor<2xf32>
  %cst_8 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %60 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %61 = stablehlo.multiply %60, %26 : tensor<2xf32>
  %62 = stablehlo.subtract %arg4, %61 : tensor<2xf32>
  return %50, %53, %56, %59, %62, %19 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}

// -----

// (e) A bias every layer adds before its block, layer 0 reading the data (x = x + s; x = x + tanh(x * w_l)):
// layer 0 is left out, layers 1 .. 2 roll. The ops after the loop read the cotangent the backward loop
// carries at layer 2 (s's gradient sums it with layer 0's) besides its final value: the loop keeps
// that one layer's value in a carry of its own (selected at that layer), not a row per layer.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled ['w'] [1:3]: 2 layers
// CHECK: %[[BWD:[0-9]+]]:5 = stablehlo.while({{.*}}, %[[KEPT:[a-zA-Z0-9_]+]] = %{{[0-9]+}}) : tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>
// CHECK: } do {
// CHECK: %[[LAYER:[0-9]+]] = stablehlo.subtract %{{[a-z0-9_]+}}, %iterArg
// CHECK: %[[CT:[0-9]+]] = stablehlo.add %iterArg_9, %{{[0-9]+}} : tensor<2xf32>
// CHECK: %[[HERE:[0-9]+]] = stablehlo.compare EQ, %[[LAYER]], %{{[a-z0-9_]+}}
// CHECK: %[[NEXT:[0-9]+]] = stablehlo.select %[[HERE]], %[[CT]], %[[KEPT]]
// CHECK: stablehlo.return %{{[0-9]+}}, %[[CT]], %{{[0-9]+}}, %{{[0-9]+}}, %[[NEXT]] :
// CHECK-NOT: stablehlo.slice %[[BWD]]#4 [
// CHECK: stablehlo.add %[[BWD]]#4, %[[BWD]]#1 : tensor<2xf32>
func.func public @main(%arg0: tensor<2xf32> {loopfuse.state = "['s']"}, %arg1: tensor<2xf32> {loopfuse.state = "['w'][0]"}, %arg2: tensor<2xf32> {loopfuse.state = "['w'][1]"}, %arg3: tensor<2xf32> {loopfuse.state = "['w'][2]"}, %arg4: tensor<2xf32>) -> (tensor<2xf32> {loopfuse.result = 0 : i32, loopfuse.state = "['s']"}, tensor<2xf32> {loopfuse.result = 1 : i32, loopfuse.state = "['w'][0]"}, tensor<2xf32> {loopfuse.result = 2 : i32, loopfuse.state = "['w'][1]"}, tensor<2xf32> {loopfuse.result = 3 : i32, loopfuse.state = "['w'][2]"}, tensor<f32> {loopfuse.result = 4 : i32}) {
  %0 = stablehlo.add %arg4, %arg0 : tensor<2xf32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<2xf32>
  %2 = stablehlo.tanh %1 : tensor<2xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %4 = stablehlo.subtract %3, %2 : tensor<2xf32>
  %5 = stablehlo.add %0, %2 : tensor<2xf32>
  %6 = stablehlo.add %5, %arg0 : tensor<2xf32>
  %7 = stablehlo.multiply %6, %arg2 : tensor<2xf32>
  %8 = stablehlo.tanh %7 : tensor<2xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %9 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %10 = stablehlo.subtract %9, %8 : tensor<2xf32>
  %11 = stablehlo.add %6, %8 : tensor<2xf32>
  %12 = stablehlo.add %11, %arg0 : tensor<2xf32>
  %13 = stablehlo.multiply %12, %arg3 : tensor<2xf32>
  %14 = stablehlo.tanh %13 : tensor<2xf32>
  %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %15 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %16 = stablehlo.subtract %15, %14 : tensor<2xf32>
  %17 = stablehlo.add %12, %14 : tensor<2xf32>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %18 = stablehlo.reduce(%17 init: %cst_2) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %19 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %20 = stablehlo.multiply %19, %16 : tensor<2xf32>
  %21 = stablehlo.multiply %20, %14 : tensor<2xf32>
  %22 = stablehlo.add %20, %21 : tensor<2xf32>
  %23 = stablehlo.multiply %12, %22 : tensor<2xf32>
  %24 = stablehlo.multiply %22, %arg3 : tensor<2xf32>
  %25 = stablehlo.add %19, %24 : tensor<2xf32>
  %26 = stablehlo.multiply %25, %10 : tensor<2xf32>
  %27 = stablehlo.multiply %26, %8 : tensor<2xf32>
  %28 = stablehlo.add %26, %27 : tensor<2xf32>
  %29 = stablehlo.multiply %6, %28 : tensor<2xf32>
  %30 = stablehlo.multiply %28, %arg2 : tensor<2xf32>
  %31 = stablehlo.add %25, %30 : tensor<2xf32>
  %32 = stablehlo.add %25, %31 : tensor<2xf32>
  %33 = stablehlo.add %32, %31 : tensor<2xf32>
  %34 = stablehlo.multiply %31, %4 : tensor<2xf32>
  %35 = stablehlo.multiply %34, %2 : tensor<2xf32>
  %36 = stablehlo.add %34, %35 : tensor<2xf32>
  %37 = stablehlo.multiply %0, %36 : tensor<2xf32>
  %38 = stablehlo.multiply %36, %arg1 : tensor<2xf32>
  %39 = stablehlo.add %33, %38 : tensor<2xf32>
  %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %40 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %41 = stablehlo.multiply %40, %39 : tensor<2xf32>
  %42 = stablehlo.subtract %arg0, %41 : tensor<2xf32>
  %cst_5 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %43 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %44 = stablehlo.multiply %43, %37 : tensor<2xf32>
  %45 = stablehlo.subtract %arg1, %44 : tensor<2xf32>
  %cst_6 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %46 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %47 = stablehlo.multiply %46, %29 : tensor<2xf32>
  %48 = stablehlo.subtract %arg2, %47 : tensor<2xf32>
  %cst_7 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %49 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %50 = stablehlo.multiply %49, %23 : tensor<2xf32>
  %51 = stablehlo.subtract %arg3, %50 : tensor<2xf32>
  return %42, %45, %48, %51, %18 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<f32>
}
