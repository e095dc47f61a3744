// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(roll-layers{force=true})' | filecheck %s

// Three blocks x + tanh(x w_l), SGD with momentum at a learning rate per layer, written as optax writes
// layer-wise rates: optax.multi_transform with a label per layer, l0 .. l2. Layer l's momentum is kept
// under ['l<l>'] and again under ['blocks'][<l>], the other layers masked out of that label's state: the
// paths propose the momenta as one family, the label's number said again, which rolls with the parameters;
// the rates differ per layer and are stacked, and both stacks are updated inside the backward loop.
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['blocks'], [1].inner_states['l*'].inner_state[0].trace['blocks'] [0:3]: 3 layers of 16 ops each
// CHECK-SAME: 2 stacked leaves updated inside the backward loop
// CHECK: %[[PARAMS:[0-9]+]] = stablehlo.concatenate %{{.*}}, %{{.*}}, %{{.*}}, dim = 0 : {{.*}} -> tensor<3x2x2xf32>
// CHECK: %[[MOMENTA:[0-9]+]] = stablehlo.concatenate %{{.*}}, %{{.*}}, %{{.*}}, dim = 0 : {{.*}} -> tensor<3x2x2xf32>
// CHECK: stablehlo.concatenate %{{.*}}, %{{.*}}, %{{.*}}, dim = 0 : (tensor<1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<3xf32>
// CHECK: stablehlo.while({{.*}}, %iterArg_{{[0-9]+}} = %[[PARAMS]], %iterArg_{{[0-9]+}} = %[[MOMENTA]]) : tensor<i32>, tensor<2x2xf32>, tensor<3x2x2xf32>, tensor<3x2x2xf32>, tensor<3x2x2xf32>{{$}}
// CHECK: stablehlo.while
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][0]['w']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][1]['w']"}, %arg2: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][2]['w']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l0'].inner_state[0].trace['blocks'][0]['w']"}, %arg4: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l1'].inner_state[0].trace['blocks'][1]['w']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l2'].inner_state[0].trace['blocks'][2]['w']"}, %arg6: tensor<2x2xf32>) -> (tensor<2x2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "[0]['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "[0]['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "[0]['blocks'][2]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "[1].inner_states['l0'].inner_state[0].trace['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "[1].inner_states['l1'].inner_state[0].trace['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "[1].inner_states['l2'].inner_state[0].trace['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 6 : i32}) {
    %0 = stablehlo.dot_general %arg6, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.tanh %0 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2x2xf32>
    %4 = stablehlo.add %arg6, %1 : tensor<2x2xf32>
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
    %34 = stablehlo.dot_general %33, %arg6, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %35 = stablehlo.transpose %34, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %37 = stablehlo.multiply %36, %arg3 : tensor<2x2xf32>
    %38 = stablehlo.add %35, %37 : tensor<2x2xf32>
    %cst_5 = stablehlo.constant dense<-2.500000e-02> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %40 = stablehlo.multiply %39, %38 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %41 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %42 = stablehlo.multiply %41, %arg4 : tensor<2x2xf32>
    %43 = stablehlo.add %28, %42 : tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<-5.000000e-02> : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %45 = stablehlo.multiply %44, %43 : tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %47 = stablehlo.multiply %46, %arg5 : tensor<2x2xf32>
    %48 = stablehlo.add %21, %47 : tensor<2x2xf32>
    %cst_9 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %49 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %50 = stablehlo.multiply %49, %48 : tensor<2x2xf32>
    %51 = stablehlo.add %arg0, %40 : tensor<2x2xf32>
    %52 = stablehlo.add %arg1, %45 : tensor<2x2xf32>
    %53 = stablehlo.add %arg2, %50 : tensor<2x2xf32>
    return %51, %52, %53, %38, %43, %48, %15 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}

// -----

// The same blocks with a label per group of layers, l0 for layers 0 and 1, l1 for layer 2: one rate for the
// group, one broadcast both its layers' updates read. The rates are stacked as scalars and broadcast in the
// backward loop's body, not stacked at the weight's shape (tensor<3x2x2xf32>, a weight's size per layer).
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['blocks'], [1].inner_states['l*'].inner_state[0].trace['blocks'] [0:3]: 3 layers of 15 ops each
// CHECK-SAME: 2 stacked leaves updated inside the backward loop
// CHECK: %[[RATES:[0-9]+]] = stablehlo.concatenate %{{.*}}, %{{.*}}, %{{.*}}, dim = 0 : (tensor<1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<3xf32>
// CHECK-NOT: stablehlo.concatenate
// CHECK: stablehlo.while
// CHECK: stablehlo.while
// CHECK: %[[ROW:.*]] = stablehlo.dynamic_slice %[[RATES]], %{{.*}}, sizes = [1] : (tensor<3xf32>, tensor<i32>) -> tensor<1xf32>
// CHECK: %[[RATE:.*]] = stablehlo.reshape %[[ROW]] : (tensor<1xf32>) -> tensor<f32>
// CHECK: stablehlo.broadcast_in_dim %[[RATE]], dims = [] : (tensor<f32>) -> tensor<2x2xf32>

module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][0]['w']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][1]['w']"}, %arg2: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][2]['w']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l0'].inner_state[0].trace['blocks'][0]['w']"}, %arg4: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l1'].inner_state[0].trace['blocks'][1]['w']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['l2'].inner_state[0].trace['blocks'][2]['w']"}, %arg6: tensor<2x2xf32>) -> (tensor<2x2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "[0]['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "[0]['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "[0]['blocks'][2]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "[1].inner_states['l0'].inner_state[0].trace['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "[1].inner_states['l1'].inner_state[0].trace['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "[1].inner_states['l2'].inner_state[0].trace['blocks'][2]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 6 : i32}) {
    %0 = stablehlo.dot_general %arg6, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.tanh %0 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %3 = stablehlo.subtract %2, %1 : tensor<2x2xf32>
    %4 = stablehlo.add %arg6, %1 : tensor<2x2xf32>
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
    %34 = stablehlo.dot_general %33, %arg6, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %35 = stablehlo.transpose %34, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %37 = stablehlo.multiply %36, %arg3 : tensor<2x2xf32>
    %38 = stablehlo.add %35, %37 : tensor<2x2xf32>
    %cst_5 = stablehlo.constant dense<-2.500000e-02> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %40 = stablehlo.multiply %39, %38 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %41 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %42 = stablehlo.multiply %41, %arg4 : tensor<2x2xf32>
    %43 = stablehlo.add %28, %42 : tensor<2x2xf32>
    %45 = stablehlo.multiply %39, %43 : tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %47 = stablehlo.multiply %46, %arg5 : tensor<2x2xf32>
    %48 = stablehlo.add %21, %47 : tensor<2x2xf32>
    %cst_9 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %49 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %50 = stablehlo.multiply %49, %48 : tensor<2x2xf32>
    %51 = stablehlo.add %arg0, %40 : tensor<2x2xf32>
    %52 = stablehlo.add %arg1, %45 : tensor<2x2xf32>
    %53 = stablehlo.add %arg2, %50 : tensor<2x2xf32>
    return %51, %52, %53, %38, %43, %48, %15 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}

// -----

// Four blocks x + tanh(x w_l), the first frozen: optax.multi_transform with optax.set_to_zero for block 0
// and SGD with momentum for the others (fine-tuning the last layers). The optimizer keeps momenta for
// blocks 1-3 only, a run of its own over those layers; joined with the parameters' run over the same
// layers (`layer_runs.sub_partner`), blocks 1-3 roll with their momenta, updated inside the backward loop,
// and block 0 is left as it is (its parameter's update adds zeros; its backward is dead: it reads the data).
// CHECK-LABEL: module
// CHECK-SAME: "loopfuse.report.roll-layers" = "rolled [0]['blocks'], [1].inner_states['train'].inner_state[0].trace['blocks'] [1:4]: 3 layers of 15 ops each
// CHECK-SAME: 2 stacked leaves updated inside the backward loop; layer 0 left as it is: its ops differ from the others'"
// CHECK: %[[PARAMS:[0-9]+]] = stablehlo.concatenate {{.*}} -> tensor<3x2x2xf32>
// CHECK: %[[MOMENTA:[0-9]+]] = stablehlo.concatenate {{.*}} -> tensor<3x2x2xf32>
// CHECK: stablehlo.while({{.*}}, %iterArg_{{[0-9]+}} = %[[PARAMS]], %iterArg_{{[0-9]+}} = %[[MOMENTA]])
// CHECK: stablehlo.while
module @jit_flat attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][0]['w']"}, %arg1: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][1]['w']"}, %arg2: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][2]['w']"}, %arg3: tensor<2x2xf32> {loopfuse.state = "[0]['blocks'][3]['w']"}, %arg4: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][1]['w']"}, %arg5: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][2]['w']"}, %arg6: tensor<2x2xf32> {loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][3]['w']"}, %arg7: tensor<2x2xf32>) -> (tensor<2x2xf32> {jax.result_info = "result[0][0]", loopfuse.result = 0 : i32, loopfuse.state = "[0]['blocks'][0]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][1]", loopfuse.result = 1 : i32, loopfuse.state = "[0]['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][2]", loopfuse.result = 2 : i32, loopfuse.state = "[0]['blocks'][2]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][3]", loopfuse.result = 3 : i32, loopfuse.state = "[0]['blocks'][3]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][4]", loopfuse.result = 4 : i32, loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][1]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][5]", loopfuse.result = 5 : i32, loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][2]['w']"}, tensor<2x2xf32> {jax.result_info = "result[0][6]", loopfuse.result = 6 : i32, loopfuse.state = "[1].inner_states['train'].inner_state[0].trace['blocks'][3]['w']"}, tensor<f32> {jax.result_info = "result[1][0]", loopfuse.result = 7 : i32}) {
    %0 = stablehlo.dot_general %arg7, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.tanh %0 : tensor<2x2xf32>
    %2 = stablehlo.add %arg7, %1 : tensor<2x2xf32>
    %3 = stablehlo.dot_general %2, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %4 = stablehlo.tanh %3 : tensor<2x2xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %6 = stablehlo.subtract %5, %4 : tensor<2x2xf32>
    %7 = stablehlo.add %2, %4 : tensor<2x2xf32>
    %8 = stablehlo.dot_general %7, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %9 = stablehlo.tanh %8 : tensor<2x2xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %10 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %11 = stablehlo.subtract %10, %9 : tensor<2x2xf32>
    %12 = stablehlo.add %7, %9 : tensor<2x2xf32>
    %13 = stablehlo.dot_general %12, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %14 = stablehlo.tanh %13 : tensor<2x2xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %16 = stablehlo.subtract %15, %14 : tensor<2x2xf32>
    %17 = stablehlo.add %12, %14 : tensor<2x2xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.reduce(%17 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %19 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %20 = stablehlo.multiply %19, %16 : tensor<2x2xf32>
    %21 = stablehlo.multiply %20, %14 : tensor<2x2xf32>
    %22 = stablehlo.add %20, %21 : tensor<2x2xf32>
    %23 = stablehlo.dot_general %22, %12, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %24 = stablehlo.transpose %23, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %25 = stablehlo.dot_general %22, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %26 = stablehlo.add %19, %25 : tensor<2x2xf32>
    %27 = stablehlo.multiply %26, %11 : tensor<2x2xf32>
    %28 = stablehlo.multiply %27, %9 : tensor<2x2xf32>
    %29 = stablehlo.add %27, %28 : tensor<2x2xf32>
    %30 = stablehlo.dot_general %29, %7, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %31 = stablehlo.transpose %30, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %32 = stablehlo.dot_general %29, %arg2, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %33 = stablehlo.add %26, %32 : tensor<2x2xf32>
    %34 = stablehlo.multiply %33, %6 : tensor<2x2xf32>
    %35 = stablehlo.multiply %34, %4 : tensor<2x2xf32>
    %36 = stablehlo.add %34, %35 : tensor<2x2xf32>
    %37 = stablehlo.dot_general %36, %2, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %38 = stablehlo.transpose %37, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %cst_5 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %40 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %41 = stablehlo.multiply %40, %arg4 : tensor<2x2xf32>
    %42 = stablehlo.add %38, %41 : tensor<2x2xf32>
    %cst_6 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %43 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %44 = stablehlo.multiply %43, %arg5 : tensor<2x2xf32>
    %45 = stablehlo.add %31, %44 : tensor<2x2xf32>
    %cst_7 = stablehlo.constant dense<0.899999976> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %47 = stablehlo.multiply %46, %arg6 : tensor<2x2xf32>
    %48 = stablehlo.add %24, %47 : tensor<2x2xf32>
    %cst_8 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %49 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %50 = stablehlo.multiply %49, %42 : tensor<2x2xf32>
    %cst_9 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %51 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %52 = stablehlo.multiply %51, %45 : tensor<2x2xf32>
    %cst_10 = stablehlo.constant dense<-1.000000e-01> : tensor<f32>
    %53 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
    %54 = stablehlo.multiply %53, %48 : tensor<2x2xf32>
    %55 = stablehlo.add %arg0, %39 : tensor<2x2xf32>
    %56 = stablehlo.add %arg1, %50 : tensor<2x2xf32>
    %57 = stablehlo.add %arg2, %52 : tensor<2x2xf32>
    %58 = stablehlo.add %arg3, %54 : tensor<2x2xf32>
    return %55, %56, %57, %58, %42, %45, %48, %18 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
  }
}
