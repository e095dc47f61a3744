// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4},pack-state{max-leaf-elements=16})' | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(wrap-loop{steps=4},pack-state{flatten=true})' | filecheck %s --check-prefix=FLAT
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(pack-state)' | filecheck %s --check-prefix=NOLOOP

// (a) The f32 state leaves of at most 16 elements (w: 2x3, b: 3) are carried as one tensor<9xf32>,
// after the other loop values: packed once before the loop, passed to the step, which slices (and
// reshapes) them out and returns the concatenation of their new values; sliced once after the loop.
// The 8x8 leaf (over the threshold), the only i32 leaf (fewer than min-group=2 of its type) and the
// batch stay as they were.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<8x8xf32>, %arg1: tensor<i32>, %arg2: tensor<3xf32>, %arg3: tensor<9xf32>) -> (tensor<8x8xf32>, tensor<i32>, tensor<f32>, tensor<9xf32>)
// CHECK-NEXT: %[[S0:[0-9]+]] = stablehlo.slice %arg3 [0:6] : (tensor<9xf32>) -> tensor<6xf32>
// CHECK-NEXT: %[[W:[0-9]+]] = stablehlo.reshape %[[S0]] : (tensor<6xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %[[B:[0-9]+]] = stablehlo.slice %arg3 [6:9] : (tensor<9xf32>) -> tensor<3xf32>
// CHECK: %[[NW:[0-9]+]] = stablehlo.multiply %[[W]], %{{.*}} : tensor<2x3xf32>
// CHECK-NEXT: %[[NB:[0-9]+]] = stablehlo.subtract %[[B]], %arg2 : tensor<3xf32>
// CHECK: %[[NW1:[0-9]+]] = stablehlo.reshape %[[NW]] : (tensor<2x3xf32>) -> tensor<6xf32>
// CHECK-NEXT: %[[NP:[0-9]+]] = stablehlo.concatenate %[[NW1]], %[[NB]], dim = 0 : (tensor<6xf32>, tensor<3xf32>) -> tensor<9xf32>
// CHECK-NEXT: return %arg0, %arg1, %{{[0-9]+}}, %[[NP]] : tensor<8x8xf32>, tensor<i32>, tensor<f32>, tensor<9xf32>
// CHECK-LABEL: func.func @main
// CHECK: %[[W1:[0-9]+]] = stablehlo.reshape %arg0 : (tensor<2x3xf32>) -> tensor<6xf32>
// CHECK-NEXT: %[[INIT:[0-9]+]] = stablehlo.concatenate %[[W1]], %arg1, dim = 0 : (tensor<6xf32>, tensor<3xf32>) -> tensor<9xf32>
// CHECK-NEXT: %[[L:[0-9]+]]:6 = stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[BIG:[a-zA-Z0-9_]+]] = %arg2, %[[N:[a-zA-Z0-9_]+]] = %arg3, %[[X:[a-zA-Z0-9_]+]] = %arg4, %[[H:[a-zA-Z0-9_]+]] = %{{[0-9]+}}, %[[P:[a-zA-Z0-9_]+]] = %[[INIT]]) : tensor<i32>, tensor<8x8xf32>, tensor<i32>, tensor<3xf32>, tensor<4xf32>, tensor<9xf32>
// CHECK: } do {
// CHECK-NEXT: %[[OUT:[0-9]+]]:4 = func.call @loopfuse_step(%[[BIG]], %[[N]], %[[X]], %[[P]])
// CHECK: stablehlo.return %{{[0-9]+}}, %[[OUT]]#0, %[[OUT]]#1, %[[X]], %{{[0-9]+}}, %[[OUT]]#3 : tensor<i32>, tensor<8x8xf32>, tensor<i32>, tensor<3xf32>, tensor<4xf32>, tensor<9xf32>
// CHECK-NEXT: }
// CHECK-NEXT: %[[F0:[0-9]+]] = stablehlo.slice %[[L]]#5 [0:6] : (tensor<9xf32>) -> tensor<6xf32>
// CHECK-NEXT: %[[FW:[0-9]+]] = stablehlo.reshape %[[F0]] : (tensor<6xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %[[FB:[0-9]+]] = stablehlo.slice %[[L]]#5 [6:9] : (tensor<9xf32>) -> tensor<3xf32>
// CHECK-NEXT: return %[[FW]], %[[FB]], %[[L]]#1, %[[L]]#2, %[[L]]#4 : tensor<2x3xf32>, tensor<3xf32>, tensor<8x8xf32>, tensor<i32>, tensor<4xf32>
// Without wrap-loop's loop (a single step) the pass changes nothing.
// NOLOOP-LABEL: func.func @main
// NOLOOP-NOT: stablehlo.concatenate
// NOLOOP-NOT: stablehlo.slice
// NOLOOP: return
func.func @main(%w: tensor<2x3xf32> {loopfuse.state = "['w']"}, %b: tensor<3xf32> {loopfuse.state = "['b']"},
                %big: tensor<8x8xf32> {loopfuse.state = "['big']"}, %n: tensor<i32> {loopfuse.state = "['n']"}, %x: tensor<3xf32>)
    -> (tensor<2x3xf32> {loopfuse.state = "['w']"}, tensor<3xf32> {loopfuse.state = "['b']"},
        tensor<8x8xf32> {loopfuse.state = "['big']"}, tensor<i32> {loopfuse.state = "['n']"}, tensor<f32>) {
  %c = stablehlo.constant dense<0.5> : tensor<2x3xf32>
  %0 = stablehlo.multiply %w, %c : tensor<2x3xf32>
  %1 = stablehlo.subtract %b, %x : tensor<3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %0, %1, %big, %n, %s : tensor<2x3xf32>, tensor<3xf32>, tensor<8x8xf32>, tensor<i32>, tensor<f32>
}

// -----

// (b) A stopping loop: the stop flag is not state and stays a loop value of its own, which the
// condition reads. 0-d leaves are packed as one element each; a state value the step also returns
// as aux (%0) is returned both ways.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<2xf32>) -> (tensor<f32>, tensor<i1>, tensor<2xf32>)
// CHECK-NEXT: stablehlo.slice %arg0 [0:1]
// CHECK-NEXT: stablehlo.reshape
// CHECK-NEXT: stablehlo.slice %arg0 [1:2]
// CHECK: %[[NP:[0-9]+]] = stablehlo.concatenate
// CHECK-NEXT: return %[[A:[0-9]+]], %{{[0-9]+}}, %[[NP]] : tensor<f32>, tensor<i1>, tensor<2xf32>
// CHECK-LABEL: func.func @main
// CHECK: %[[A:[0-9]+]] = stablehlo.reshape %arg0 : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[B:[0-9]+]] = stablehlo.reshape %arg1 : (tensor<f32>) -> tensor<1xf32>
// CHECK-NEXT: %[[INIT:[0-9]+]] = stablehlo.concatenate %[[A]], %[[B]], dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
// CHECK-NEXT: stablehlo.while(%[[I:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %{{[a-zA-Z0-9_]+}} = %{{[0-9]+}}, %[[STOP:[a-zA-Z0-9_]+]] = %{{[a-z0-9_]+}}, %[[P:[a-zA-Z0-9_]+]] = %[[INIT]]) : tensor<i32>, tensor<4xf32>, tensor<i1>, tensor<2xf32>
// CHECK-NEXT: cond {
// CHECK: stablehlo.not %[[STOP]]
// CHECK: } do {
// CHECK-NEXT: func.call @loopfuse_step(%[[P]])
func.func @main(%a: tensor<f32> {loopfuse.state = "['a']"}, %b: tensor<f32> {loopfuse.state = "['b']"})
    -> (tensor<f32> {loopfuse.state = "['a']"}, tensor<f32> {loopfuse.state = "['b']"}, tensor<f32>, tensor<i1> {loopfuse.stop}) {
  %0 = stablehlo.add %a, %b : tensor<f32>
  %1 = stablehlo.multiply %b, %b : tensor<f32>
  %2 = stablehlo.compare GT, %0, %1 : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %0, %1, %0, %2 : tensor<f32>, tensor<f32>, tensor<f32>, tensor<i1>
}

// -----

// (c) flatten=true: the step w - 0.5 * g, alike over both packed leaves, runs once over the buffer
// (the gradients concatenated once per step), and the step returns its result as the new buffer.
// FLAT-LABEL: func.func private @loopfuse_step(%arg0: tensor<2xf32>, %arg1: tensor<3xf32>, %arg2: tensor<5xf32>) -> tensor<5xf32>
// FLAT-NEXT: %[[G:[0-9]+]] = stablehlo.concatenate %arg0, %arg1, dim = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>
// FLAT-NEXT: %[[C:[a-z0-9_]+]] = stablehlo.constant dense<5.000000e-01> : tensor<5xf32>
// FLAT-NEXT: %[[U:[0-9]+]] = stablehlo.multiply %[[C]], %[[G]] : tensor<5xf32>
// FLAT-NEXT: %[[NEW:[0-9]+]] = stablehlo.subtract %arg2, %[[U]] : tensor<5xf32>
// FLAT-NEXT: return %[[NEW]] : tensor<5xf32>
func.func @main(%w0: tensor<2xf32> {loopfuse.state = "['w0']"}, %w1: tensor<3xf32> {loopfuse.state = "['w1']"},
                %g0: tensor<2xf32>, %g1: tensor<3xf32>)
    -> (tensor<2xf32> {loopfuse.state = "['w0']"}, tensor<3xf32> {loopfuse.state = "['w1']"}) {
  %c0 = stablehlo.constant dense<0.5> : tensor<2xf32>
  %c1 = stablehlo.constant dense<0.5> : tensor<3xf32>
  %0 = stablehlo.multiply %c0, %g0 : tensor<2xf32>
  %1 = stablehlo.subtract %w0, %0 : tensor<2xf32>
  %2 = stablehlo.multiply %c1, %g1 : tensor<3xf32>
  %3 = stablehlo.subtract %w1, %2 : tensor<3xf32>
  return %1, %3 : tensor<2xf32>, tensor<3xf32>
}

// -----

// (d) flatten=true with a forward pass: only the update chains into the return are flattened. The
// forward (d = w - x, squared, reduced) stays per leaf on slices of the parameters' buffer; the
// update chains read d too, so they get their own copy of it (`Flattener.recompute`: it reads one
// per-leaf operand, x, besides the buffer), which the flat chain computes from the whole buffer and
// x concatenated once; the momenta, read only by their update chain, get a buffer of their own,
// which the flat chain writes whole, and the parameters' chain reads its result.
// FLAT-LABEL: func.func private @loopfuse_step(%arg0: tensor<2xf32>, %arg1: tensor<3xf32>, %arg2: tensor<5xf32>, %arg3: tensor<5xf32>) -> (tensor<f32>, tensor<f32>, tensor<5xf32>, tensor<5xf32>)
// FLAT-NEXT: %[[W0:[0-9]+]] = stablehlo.slice %arg2 [0:2]
// FLAT-NEXT: %[[W1:[0-9]+]] = stablehlo.slice %arg2 [2:5]
// FLAT: %[[D0:[0-9]+]] = stablehlo.subtract %[[W0]], %arg0 : tensor<2xf32>
// FLAT-NEXT: stablehlo.multiply %[[D0]], %[[D0]] : tensor<2xf32>
// FLAT-NEXT: stablehlo.reduce
// FLAT-NEXT: %[[D1:[0-9]+]] = stablehlo.subtract %[[W1]], %arg1 : tensor<3xf32>
// FLAT-NEXT: stablehlo.multiply %[[D1]], %[[D1]] : tensor<3xf32>
// FLAT-NEXT: stablehlo.reduce
// FLAT-NEXT: %[[X:[0-9]+]] = stablehlo.concatenate %arg0, %arg1, dim = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>
// FLAT-NEXT: stablehlo.constant
// FLAT-NEXT: %[[BM:[0-9]+]] = stablehlo.multiply %{{[a-z0-9_]+}}, %arg3 : tensor<5xf32>
// FLAT-NEXT: %[[G:[0-9]+]] = stablehlo.subtract %arg2, %[[X]] : tensor<5xf32>
// FLAT-NEXT: %[[M:[0-9]+]] = stablehlo.add %[[BM]], %[[G]] : tensor<5xf32>
// FLAT-NEXT: stablehlo.constant
// FLAT-NEXT: %[[U:[0-9]+]] = stablehlo.multiply %{{[a-z0-9_]+}}, %[[M]] : tensor<5xf32>
// FLAT-NEXT: %[[W:[0-9]+]] = stablehlo.subtract %arg2, %[[U]] : tensor<5xf32>
// FLAT-NEXT: return %{{[0-9]+}}, %{{[0-9]+}}, %[[W]], %[[M]] : tensor<f32>, tensor<f32>, tensor<5xf32>, tensor<5xf32>
// FLAT-LABEL: func.func @main
// FLAT: %[[PW:[0-9]+]] = stablehlo.concatenate %arg0, %arg1, dim = 0
// FLAT-NEXT: %[[PM:[0-9]+]] = stablehlo.concatenate %arg2, %arg3, dim = 0
// FLAT-NEXT: stablehlo.while({{.*}} = %[[PW]], %{{[a-zA-Z0-9_]+}} = %[[PM]])
func.func @main(%w0: tensor<2xf32> {loopfuse.state = "['w0']"}, %w1: tensor<3xf32> {loopfuse.state = "['w1']"},
                %m0: tensor<2xf32> {loopfuse.state = "['m0']"}, %m1: tensor<3xf32> {loopfuse.state = "['m1']"},
                %x0: tensor<2xf32>, %x1: tensor<3xf32>)
    -> (tensor<2xf32> {loopfuse.state = "['w0']"}, tensor<3xf32> {loopfuse.state = "['w1']"},
        tensor<2xf32> {loopfuse.state = "['m0']"}, tensor<3xf32> {loopfuse.state = "['m1']"}, tensor<f32>, tensor<f32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %d0 = stablehlo.subtract %w0, %x0 : tensor<2xf32>
  %s0 = stablehlo.multiply %d0, %d0 : tensor<2xf32>
  %l0 = stablehlo.reduce(%s0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %d1 = stablehlo.subtract %w1, %x1 : tensor<3xf32>
  %s1 = stablehlo.multiply %d1, %d1 : tensor<3xf32>
  %l1 = stablehlo.reduce(%s1 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  %b0 = stablehlo.constant dense<0.9> : tensor<2xf32>
  %b1 = stablehlo.constant dense<0.9> : tensor<3xf32>
  %r0 = stablehlo.constant dense<0.1> : tensor<2xf32>
  %r1 = stablehlo.constant dense<0.1> : tensor<3xf32>
  %0 = stablehlo.multiply %b0, %m0 : tensor<2xf32>
  %1 = stablehlo.add %0, %d0 : tensor<2xf32>
  %2 = stablehlo.multiply %r0, %1 : tensor<2xf32>
  %3 = stablehlo.subtract %w0, %2 : tensor<2xf32>
  %4 = stablehlo.multiply %b1, %m1 : tensor<3xf32>
  %5 = stablehlo.add %4, %d1 : tensor<3xf32>
  %6 = stablehlo.multiply %r1, %5 : tensor<3xf32>
  %7 = stablehlo.subtract %w1, %6 : tensor<3xf32>
  return %3, %7, %1, %5, %l0, %l1 : tensor<2xf32>, tensor<3xf32>, tensor<2xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>
}

// -----

// (e) A state the caller packed (`loopfuse.pack`): one buffer that the step reads as slices
// (reshaped) and returns as the concatenation of its new leaves. The loop carries its pieces
// instead, which pack-state groups again: with flatten=true per role, so the buffer enters the loop
// as two slices (the parameters, the momenta: (d)'s buffers) and leaves it as their concatenation,
// and the step is (d)'s; without flatten=true a packed buffer is carried as it is.
// CHECK-LABEL: func.func private @loopfuse_step(%arg0: tensor<10xf32>, %arg1: tensor<2xf32>, %arg2: tensor<1x3xf32>) -> (tensor<10xf32>, tensor<f32>, tensor<f32>)
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.slice
// CHECK: %[[L:[0-9]+]]:6 = stablehlo.while(%{{[a-zA-Z0-9_]+}} = %c, %{{[a-zA-Z0-9_]+}} = %arg0,
// CHECK-NOT: stablehlo.concatenate
// CHECK: return %[[L]]#1, %[[L]]#4, %[[L]]#5 : tensor<10xf32>, tensor<4xf32>, tensor<4xf32>
// FLAT-LABEL: func.func private @loopfuse_step(%arg0: tensor<2xf32>, %arg1: tensor<1x3xf32>, %arg2: tensor<5xf32>, %arg3: tensor<5xf32>) -> (tensor<f32>, tensor<f32>, tensor<5xf32>, tensor<5xf32>)
// FLAT-NEXT: %[[W0:[0-9]+]] = stablehlo.slice %arg2 [0:2]
// FLAT-NEXT: %[[W1F:[0-9]+]] = stablehlo.slice %arg2 [2:5]
// FLAT-NEXT: %[[W1:[0-9]+]] = stablehlo.reshape %[[W1F]] : (tensor<3xf32>) -> tensor<1x3xf32>
// FLAT: %[[X:[0-9]+]] = stablehlo.concatenate %arg0, %{{[0-9]+}}, dim = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>
// FLAT: %[[G:[0-9]+]] = stablehlo.subtract %arg2, %[[X]] : tensor<5xf32>
// FLAT: %[[W:[0-9]+]] = stablehlo.subtract %arg2, %{{[0-9]+}} : tensor<5xf32>
// FLAT-NEXT: return %{{[0-9]+}}, %{{[0-9]+}}, %[[W]], %[[M:[0-9]+]] : tensor<f32>, tensor<f32>, tensor<5xf32>, tensor<5xf32>
// FLAT-LABEL: func.func @main
// FLAT: %[[PW:[0-9]+]] = stablehlo.slice %arg0 [0:5] : (tensor<10xf32>) -> tensor<5xf32>
// FLAT-NEXT: %[[PM:[0-9]+]] = stablehlo.slice %arg0 [5:10] : (tensor<10xf32>) -> tensor<5xf32>
// FLAT-NEXT: %[[L:[0-9]+]]:7 = stablehlo.while({{.*}}, %{{[a-zA-Z0-9_]+}} = %[[PW]], %{{[a-zA-Z0-9_]+}} = %[[PM]])
// FLAT: %[[NEW:[0-9]+]] = stablehlo.concatenate %[[L]]#5, %[[L]]#6, dim = 0 : (tensor<5xf32>, tensor<5xf32>) -> tensor<10xf32>
// FLAT-NEXT: return %[[NEW]], %[[L]]#3, %[[L]]#4 : tensor<10xf32>, tensor<4xf32>, tensor<4xf32>
func.func @main(%p: tensor<10xf32> {loopfuse.state = ".buffers[0]"}, %x0: tensor<2xf32>, %x1: tensor<1x3xf32>)
    -> (tensor<10xf32> {loopfuse.state = ".buffers[0]"}, tensor<f32>, tensor<f32>) {
  %w0 = stablehlo.slice %p [0:2] : (tensor<10xf32>) -> tensor<2xf32>
  %w1f = stablehlo.slice %p [2:5] : (tensor<10xf32>) -> tensor<3xf32>
  %w1 = stablehlo.reshape %w1f : (tensor<3xf32>) -> tensor<1x3xf32>
  %m0 = stablehlo.slice %p [5:7] : (tensor<10xf32>) -> tensor<2xf32>
  %m1f = stablehlo.slice %p [7:10] : (tensor<10xf32>) -> tensor<3xf32>
  %m1 = stablehlo.reshape %m1f : (tensor<3xf32>) -> tensor<1x3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %d0 = stablehlo.subtract %w0, %x0 : tensor<2xf32>
  %s0 = stablehlo.multiply %d0, %d0 : tensor<2xf32>
  %l0 = stablehlo.reduce(%s0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %d1 = stablehlo.subtract %w1, %x1 : tensor<1x3xf32>
  %s1 = stablehlo.multiply %d1, %d1 : tensor<1x3xf32>
  %l1 = stablehlo.reduce(%s1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x3xf32>, tensor<f32>) -> tensor<f32>
  %b0 = stablehlo.constant dense<0.9> : tensor<2xf32>
  %b1 = stablehlo.constant dense<0.9> : tensor<1x3xf32>
  %r0 = stablehlo.constant dense<0.1> : tensor<2xf32>
  %r1 = stablehlo.constant dense<0.1> : tensor<1x3xf32>
  %0 = stablehlo.multiply %b0, %m0 : tensor<2xf32>
  %1 = stablehlo.add %0, %d0 : tensor<2xf32>
  %2 = stablehlo.multiply %r0, %1 : tensor<2xf32>
  %3 = stablehlo.subtract %w0, %2 : tensor<2xf32>
  %4 = stablehlo.multiply %b1, %m1 : tensor<1x3xf32>
  %5 = stablehlo.add %4, %d1 : tensor<1x3xf32>
  %6 = stablehlo.multiply %r1, %5 : tensor<1x3xf32>
  %7 = stablehlo.subtract %w1, %6 : tensor<1x3xf32>
  %n1 = stablehlo.reshape %7 : (tensor<1x3xf32>) -> tensor<3xf32>
  %n3 = stablehlo.reshape %5 : (tensor<1x3xf32>) -> tensor<3xf32>
  %c = stablehlo.concatenate %3, %n1, %1, %n3, dim = 0 : (tensor<2xf32>, tensor<3xf32>, tensor<2xf32>, tensor<3xf32>) -> tensor<10xf32>
  return %c, %l0, %l1 : tensor<10xf32>, tensor<f32>, tensor<f32>
}

// -----

// (f) Not a packed state: the step reads the 1-D state buffer through a slice ([1:4]) that is not one
// of the pieces of the concatenation it returns ([0:2], [2:5]), so flatten=true cannot carry it as
// pieces and the buffer is carried as it is.
// FLAT-LABEL: func.func private @loopfuse_step(%arg0: tensor<5xf32>) -> (tensor<5xf32>, tensor<3xf32>)
// FLAT-LABEL: func.func @main
// FLAT-NOT: stablehlo.slice
// FLAT: stablehlo.while(%{{[a-zA-Z0-9_]+}} = %c, %{{[a-zA-Z0-9_]+}} = %arg0,
// FLAT-NOT: stablehlo.concatenate
// FLAT: return
func.func @main(%p: tensor<5xf32> {loopfuse.state = ".buffers[0]"})
    -> (tensor<5xf32> {loopfuse.state = ".buffers[0]"}, tensor<3xf32>) {
  %a = stablehlo.slice %p [0:2] : (tensor<5xf32>) -> tensor<2xf32>
  %b = stablehlo.slice %p [2:5] : (tensor<5xf32>) -> tensor<3xf32>
  %m = stablehlo.slice %p [1:4] : (tensor<5xf32>) -> tensor<3xf32>
  %c = stablehlo.constant dense<0.5> : tensor<2xf32>
  %d = stablehlo.constant dense<0.5> : tensor<3xf32>
  %0 = stablehlo.multiply %a, %c : tensor<2xf32>
  %1 = stablehlo.multiply %b, %d : tensor<3xf32>
  %2 = stablehlo.concatenate %0, %1, dim = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>
  return %2, %m : tensor<5xf32>, tensor<3xf32>
}
