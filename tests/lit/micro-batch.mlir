// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(micro-batch{slices=4})' | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(micro-batch)' | filecheck --check-prefix=ONE %s

// With slices=1 (the default) the step is left as it is.
// ONE: "loopfuse.report.micro-batch" = "slices=1: the step is left as it is"
// ONE-NOT: stablehlo.while

// (a) A least-squares SGD step on 8 examples, in 4 slices of 2: the loop slices each batch argument
// (rows 2i, 2i + 1), runs the forward and backward ops on the slice (the broadcast of the mean's
// 2/8 built at the slice's size), and adds up the two partial sums in slice order (the loss's sum
// of squares, the weight's gradient); the loss's 1/8 and the update run once after the loop.
// CHECK-LABEL: module attributes
// CHECK-SAME: "loopfuse.report.micro-batch" = "micro-batched into 4 slices: the batch (argument 1 tensor<8x3xf32> along dim 0, argument 2 tensor<8xf32> along dim 0) cut into 4\0Aran 6 ops once per slice: 2 stablehlo.dot_general, 2 stablehlo.multiply, 1 stablehlo.reduce, 1 stablehlo.subtract\0A  from {{.*}}model.py:3, model.py:4, model.py:6\0Aaccumulated 2 partial sums over the slices, in slice order:\0A  stablehlo.reduce (model.py:4) -> tensor<f32>\0A  stablehlo.dot_general (model.py:6) -> tensor<3xf32>\0Aran 3 ops after the loop, on the sums"
// CHECK: %[[LOSS0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}} -> tensor<f32>
// CHECK: %[[GRAD0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}} -> tensor<3xf32>
// CHECK: %[[LOOP:[0-9]+]]:3 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[LOSS:[a-zA-Z0-9_]+]] = %[[LOSS0]], %[[GRAD:[a-zA-Z0-9_]+]] = %[[GRAD0]]) : tensor<i32>, tensor<f32>, tensor<3xf32> attributes {loopfuse.micro_batch = 4 : i32}
// CHECK: } do {
// CHECK: %[[AT:[0-9]+]] = stablehlo.multiply %[[I]], %{{.*}} : tensor<i32>
// CHECK: %[[X:[0-9]+]] = stablehlo.dynamic_slice %arg1, %[[AT]], %{{.*}}, sizes = [2, 3] : (tensor<8x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
// CHECK: stablehlo.dot_general %[[X]], %arg0, {{.*}} -> tensor<2xf32>
// CHECK: stablehlo.dynamic_slice %arg2, %{{.*}}, sizes = [2] : (tensor<8xf32>, tensor<i32>) -> tensor<2xf32>
// CHECK: %[[SUM:[0-9]+]] = stablehlo.reduce({{.*}}) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
// CHECK: stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<2xf32>
// CHECK: %[[G:[0-9]+]] = stablehlo.dot_general %{{.*}}, %[[X]], contracting_dims = [0] x [0] : (tensor<2xf32>, tensor<2x3xf32>) -> tensor<3xf32>
// CHECK: %[[NEXTLOSS:[0-9]+]] = stablehlo.add %[[LOSS]], %[[SUM]] : tensor<f32>
// CHECK: %[[NEXTGRAD:[0-9]+]] = stablehlo.add %[[GRAD]], %[[G]] : tensor<3xf32>
// CHECK: stablehlo.return %{{[0-9]+}}, %[[NEXTLOSS]], %[[NEXTGRAD]]
// CHECK: stablehlo.divide %[[LOOP]]#1, %{{.*}} : tensor<f32>
// CHECK: stablehlo.multiply %{{.*}}, %[[LOOP]]#2 : tensor<3xf32>
// CHECK-NOT: tensor<8xf32>
// CHECK: return
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>, %y: tensor<8xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}, tensor<f32>) {
  %p = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3xf32>) -> tensor<8xf32> loc("model.py":3:4)
  %e = stablehlo.subtract %p, %y : tensor<8xf32>
  %sq = stablehlo.multiply %e, %e : tensor<8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32> loc("model.py":4:4)
  %n = stablehlo.constant dense<8.0> : tensor<f32>
  %loss = stablehlo.divide %s, %n : tensor<f32>
  %c = stablehlo.constant dense<0.25> : tensor<f32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %ge = stablehlo.multiply %cb, %e : tensor<8xf32>
  %g = stablehlo.dot_general %ge, %x, contracting_dims = [0] x [0] : (tensor<8xf32>, tensor<8x3xf32>) -> tensor<3xf32> loc("model.py":6:4)
  %lr = stablehlo.constant dense<0.1> : tensor<3xf32>
  %u = stablehlo.multiply %lr, %g : tensor<3xf32>
  %w2 = stablehlo.subtract %w, %u : tensor<3xf32>
  return %w2, %loss : tensor<3xf32>, tensor<f32>
}

// -----

// (b) The batch sharded over 2 devices: each slice is 2 rows of each device's 4 ([8, 3] viewed as
// [2 devices, 4 slices... ] = [2, 4, 1, 3], slice i = [:, i]). A max over the batch axis combines the
// slices by maximum from its own initial value (-inf); the per-example predictions the step returns
// are written back slice by slice.
// CHECK-LABEL: module attributes
// CHECK-SAME: "micro-batched into 4 slices, each spread over 2 devices: the batch (argument 1 tensor<8x3xf32> along dim 0) cut into 4
// CHECK-SAME: stablehlo.reduce (model.py:13) -> tensor<f32> (combined by stablehlo.maximum)
// CHECK-SAME: wrote back per slice the per-example results 2"
// CHECK: %[[NINF:.*]] = stablehlo.constant dense<0xFF800000> : tensor<f32>
// CHECK: %[[TOP0:[0-9]+]] = stablehlo.broadcast_in_dim %[[NINF]], dims = [] : (tensor<f32>) -> tensor<f32>
// CHECK: %[[ROWS0:[0-9]+]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK: stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[TOP:[a-zA-Z0-9_]+]] = %[[TOP0]], %{{[a-zA-Z0-9_]+}} = %{{[0-9]+}}, %[[ROWS:[a-zA-Z0-9_]+]] = %[[ROWS0]])
// CHECK: } do {
// CHECK: %[[VIEW:[0-9]+]] = stablehlo.reshape %arg1 : (tensor<8x3xf32>) -> tensor<2x4x1x3xf32>
// CHECK: %[[PART:[0-9]+]] = stablehlo.dynamic_slice %[[VIEW]], %{{.*}}, %[[I]], %{{.*}}, %{{.*}}, sizes = [2, 1, 1, 3]
// CHECK: %[[X:[0-9]+]] = stablehlo.reshape %[[PART]] : (tensor<2x1x1x3xf32>) -> tensor<2x3xf32>
// CHECK: %[[P:[0-9]+]] = stablehlo.dot_general %[[X]], %arg0
// CHECK: %[[M:[0-9]+]] = stablehlo.reduce(%[[P]] init: %[[NINF]]) applies stablehlo.maximum
// CHECK: stablehlo.maximum %[[TOP]], %[[M]] : tensor<f32>
// CHECK: %[[OUT:[0-9]+]] = stablehlo.reshape %[[ROWS]] : (tensor<8xf32>) -> tensor<2x4x1xf32>
// CHECK: %[[ROW:[0-9]+]] = stablehlo.reshape %[[P]] : (tensor<2xf32>) -> tensor<2x1x1xf32>
// CHECK: stablehlo.dynamic_update_slice %[[OUT]], %[[ROW]], %{{.*}}, %[[I]], %{{.*}}
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) -> (tensor<3xf32> {loopfuse.state = "['w']"}, tensor<f32>, tensor<8xf32>) {
  %p = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3xf32>) -> tensor<8xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %top = stablehlo.reduce(%p init: %ninf) applies stablehlo.maximum across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32> loc("model.py":13:1)
  %g = stablehlo.dot_general %p, %x, contracting_dims = [0] x [0] : (tensor<8xf32>, tensor<8x3xf32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2, %top, %p : tensor<3xf32>, tensor<f32>, tensor<8xf32>
}
sdy.mesh @mesh = <["data"=2]>

// -----

// (c) A Dataset's batch (a step index argument): the batch is the dynamic_slice of the dataset's
// rows, made once before the loop and sliced inside it; a call that reads the batch is inlined (and
// its callee, called no more, erased), its constant built at the slice's size.
// CHECK-LABEL: module attributes
// CHECK-SAME: the batch (stablehlo.dynamic_slice (model.py:22) tensor<8x3xf32> along dim 0) cut into 4
// CHECK-NOT: func.func private @relu
// CHECK: %[[B:[0-9]+]] = stablehlo.dynamic_slice %arg1, %{{.*}}, %{{.*}}, sizes = [8, 3] : (tensor<32x3xf32>, tensor<i32>, tensor<i32>) -> tensor<8x3xf32>
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: %[[X:[0-9]+]] = stablehlo.dynamic_slice %[[B]], %{{.*}}, %{{.*}}, sizes = [2, 3]
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<2x3xf32>
// CHECK: stablehlo.maximum %[[X]], %[[ZERO]] : tensor<2x3xf32>
func.func private @relu(%a: tensor<8x3xf32>) -> tensor<8x3xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<8x3xf32>
  %r = stablehlo.maximum %a, %zero : tensor<8x3xf32>
  return %r : tensor<8x3xf32>
}
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %data: tensor<32x3xf32>, %step: tensor<i32> {loopfuse.step_index}) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %c8 = stablehlo.constant dense<8> : tensor<i32>
  %start = stablehlo.multiply %step, %c8 : tensor<i32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %x = stablehlo.dynamic_slice %data, %start, %c0, sizes = [8, 3] : (tensor<32x3xf32>, tensor<i32>, tensor<i32>) -> tensor<8x3xf32> loc("model.py":22:2)
  %r = func.call @relu(%x) : (tensor<8x3xf32>) -> tensor<8x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%r init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// (d) Batch norm: the batch mean (a sum over the batch) is subtracted from each example, so the step
// does not decompose over its examples; it is left exactly as it was, the report naming the op that
// mixes them and its line (an op of a callee, located by name as jax locates them, by its call's line).
// CHECK-LABEL: module attributes
// CHECK-SAME: "loopfuse.report.micro-batch" = "did not micro-batch: stablehlo.subtract (bn.py:11) reads a per-example value and a sum over the batch (from stablehlo.reduce (bn.py:10)): the step does not decompose over its examples"
// CHECK-NOT: stablehlo.while
// CHECK: func.func private @center
// CHECK: call @center
func.func private @center(%x: tensor<8x3xf32>, %mean: tensor<3xf32>) -> tensor<8x3xf32> {
  %mb = stablehlo.broadcast_in_dim %mean, dims = [1] : (tensor<3xf32>) -> tensor<8x3xf32>
  %c = stablehlo.subtract %x, %mb : tensor<8x3xf32> loc("sub")
  return %c : tensor<8x3xf32>
}
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32> loc("bn.py":10:3)
  %n = stablehlo.constant dense<8.0> : tensor<3xf32>
  %mean = stablehlo.divide %s, %n : tensor<3xf32>
  %c = func.call @center(%x, %mean) : (tensor<8x3xf32>, tensor<3xf32>) -> tensor<8x3xf32> loc("bn.py":11:3)
  %g = stablehlo.reduce(%c init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// (e) A sort along the batch axis (a median over examples) mixes examples.
// CHECK: "did not micro-batch: stablehlo.sort (median.py:7) sorts along the batch axis (dim 0)"
// CHECK-NOT: stablehlo.while
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %sorted = "stablehlo.sort"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %lt = stablehlo.compare LT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
  }) {dimension = 0 : i64, is_stable = true} : (tensor<8x3xf32>) -> tensor<8x3xf32> loc("median.py":7:5)
  %top = stablehlo.slice %sorted [4:5, 0:3] : (tensor<8x3xf32>) -> tensor<1x3xf32>
  %t = stablehlo.reshape %top : (tensor<1x3xf32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %t : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// (f) A custom call on per-example values: micro-batch cannot tell what it does with the batch axis.
// CHECK: "did not micro-batch: stablehlo.custom_call (kernel.py:2) may have effects (a custom call, a collective) and reads a per-example value: micro-batch does not run it once per slice"
// CHECK-NOT: stablehlo.while
func.func @main(%w: tensor<3xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>) -> (tensor<3xf32> {loopfuse.state = "['w']"}) {
  %r = stablehlo.custom_call @my_kernel(%x) : (tensor<8x3xf32>) -> tensor<8x3xf32> loc("kernel.py":2:1)
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %g = stablehlo.reduce(%r init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
  %w2 = stablehlo.subtract %w, %g : tensor<3xf32>
  return %w2 : tensor<3xf32>
}

// -----

// (g) A reshape that merges the batch axis into an outer dim ([3, 8] -> [24], the batch second)
// would interleave the examples with that dim's rows.
// CHECK: "did not micro-batch: stablehlo.reshape (model.py:31) reshapes [3, 8] to [24], merging the batch axis (dim 1) into an outer dim"
func.func @main(%w: tensor<24xf32> {loopfuse.state = "['w']"}, %x: tensor<8x3xf32>) -> (tensor<24xf32> {loopfuse.state = "['w']"}) {
  %t = stablehlo.transpose %x, dims = [1, 0] : (tensor<8x3xf32>) -> tensor<3x8xf32>
  %f = stablehlo.reshape %t : (tensor<3x8xf32>) -> tensor<24xf32> loc("model.py":31:1)
  %w2 = stablehlo.subtract %w, %f : tensor<24xf32>
  return %w2 : tensor<24xf32>
}

// -----

// (h) A weight the step reads twice, z = tanh(x w) w: jax sums its gradient's two terms, each a
// product contracting the batch, transposed. The transposes and their add run in the loop, on each
// slice's terms, and the loop accumulates their sum: one accumulator for the weight, not one per term
// (the same sums, each slice's terms added first).
// CHECK: module attributes
// CHECK-SAME: accumulated 2 partial sums over the slices, in slice order:\0A  stablehlo.reduce
// CHECK-SAME: stablehlo.add ({{.*}}) -> tensor<3x3xf32>
// CHECK: stablehlo.while({{.*}}) : tensor<i32>, tensor<f32>, tensor<3x3xf32> attributes {loopfuse.micro_batch = 4 : i32}
// CHECK: } do {
// CHECK: %[[T1:[0-9]+]] = stablehlo.transpose
// CHECK: %[[T2:[0-9]+]] = stablehlo.transpose
// CHECK: %[[G:[0-9]+]] = stablehlo.add %[[T1]], %[[T2]] : tensor<3x3xf32>
// CHECK: stablehlo.add %{{[a-zA-Z0-9_]+}}, %[[G]] : tensor<3x3xf32>
// CHECK: stablehlo.return
// CHECK: }
// CHECK-NOT: stablehlo.transpose
// CHECK: stablehlo.multiply %{{[0-9]+}}, %{{[0-9]+}}#2 : tensor<3x3xf32>
func.func public @main(%arg0: tensor<3x3xf32> {loopfuse.state = ""}, %arg1: tensor<8x3xf32>) -> (tensor<3x3xf32> {loopfuse.result = 0 : i32, loopfuse.state = ""}, tensor<f32> {loopfuse.result = 1 : i32}) {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x3xf32>, tensor<3x3xf32>) -> tensor<8x3xf32>
  %1 = stablehlo.tanh %0 : tensor<8x3xf32>
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x3xf32>
  %3 = stablehlo.subtract %2, %1 : tensor<8x3xf32>
  %4 = stablehlo.dot_general %1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x3xf32>, tensor<3x3xf32>) -> tensor<8x3xf32>
  %5 = stablehlo.multiply %4, %4 : tensor<8x3xf32>
  %cst_0 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
  %6 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<8x3xf32>
  %7 = stablehlo.multiply %6, %4 : tensor<8x3xf32>
  %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %8 = stablehlo.reduce(%5 init: %cst_1) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x3xf32>, tensor<f32>) -> tensor<f32>
  %cst_2 = stablehlo.constant dense<2.400000e+01> : tensor<f32>
  %9 = stablehlo.divide %8, %cst_2 : tensor<f32>
  %cst_3 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %cst_4 = stablehlo.constant dense<2.400000e+01> : tensor<f32>
  %10 = stablehlo.divide %cst_3, %cst_4 : tensor<f32>
  %11 = stablehlo.broadcast_in_dim %10, dims = [] : (tensor<f32>) -> tensor<8x3xf32>
  %12 = stablehlo.multiply %11, %7 : tensor<8x3xf32>
  %13 = stablehlo.dot_general %12, %1, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x3xf32>, tensor<8x3xf32>) -> tensor<3x3xf32>
  %14 = stablehlo.transpose %13, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %15 = stablehlo.dot_general %12, %arg0, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x3xf32>, tensor<3x3xf32>) -> tensor<8x3xf32>
  %16 = stablehlo.multiply %15, %3 : tensor<8x3xf32>
  %17 = stablehlo.multiply %16, %1 : tensor<8x3xf32>
  %18 = stablehlo.add %16, %17 : tensor<8x3xf32>
  %19 = stablehlo.dot_general %18, %arg1, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x3xf32>, tensor<8x3xf32>) -> tensor<3x3xf32>
  %20 = stablehlo.transpose %19, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %21 = stablehlo.add %14, %20 : tensor<3x3xf32>
  %cst_5 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
  %22 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<3x3xf32>
  %23 = stablehlo.multiply %22, %21 : tensor<3x3xf32>
  %24 = stablehlo.subtract %arg0, %23 : tensor<3x3xf32>
  return %24, %9 : tensor<3x3xf32>, tensor<f32>
}
