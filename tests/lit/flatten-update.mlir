// RUN: loopfuse-opt %s --split-input-file --flatten-update | filecheck %s
// RUN: loopfuse-opt %s --split-input-file --pass-pipeline='builtin.module(flatten-update{min-group=3})' | filecheck %s --check-prefix=MIN3

// The moment update m' = 0.9 * m + 0.1 * g of three leaves of different shapes, each with its own
// constant ops (as JAX emits them), becomes one update of the concatenated leaves.
// CHECK-LABEL: func.func @main
// CHECK-DAG: %[[M0:.*]] = stablehlo.reshape %arg0 : (tensor<2x3xf32>) -> tensor<6xf32>
// CHECK-DAG: %[[M2:.*]] = stablehlo.reshape %arg2 : (tensor<2x2x2xf32>) -> tensor<8xf32>
// CHECK: %[[M:.*]] = stablehlo.concatenate %[[M0]], %arg1, %[[M2]], dim = 0 : (tensor<6xf32>, tensor<4xf32>, tensor<8xf32>) -> tensor<18xf32>
// CHECK: %[[G:.*]] = stablehlo.concatenate %{{.*}}, %arg4, %{{.*}}, dim = 0
// CHECK: %[[B1:.*]] = stablehlo.constant dense<{{0.89999[0-9]*}}> : tensor<18xf32>
// CHECK: %[[MB:.*]] = stablehlo.multiply %[[B1]], %[[M]] : tensor<18xf32>
// CHECK: %[[B2:.*]] = stablehlo.constant dense<1.000000e-01> : tensor<18xf32>
// CHECK: %[[GB:.*]] = stablehlo.multiply %[[B2]], %[[G]] : tensor<18xf32>
// CHECK: %[[NEW:.*]] = stablehlo.add %[[MB]], %[[GB]] : tensor<18xf32>
// CHECK: %[[S0:.*]] = stablehlo.slice %[[NEW]] [0:6]
// CHECK: %[[R0:.*]] = stablehlo.reshape %[[S0]] : (tensor<6xf32>) -> tensor<2x3xf32>
// CHECK: %[[S1:.*]] = stablehlo.slice %[[NEW]] [6:10]
// CHECK: %[[S2:.*]] = stablehlo.slice %[[NEW]] [10:18]
// CHECK: %[[R2:.*]] = stablehlo.reshape %[[S2]] : (tensor<8xf32>) -> tensor<2x2x2xf32>
// CHECK-NOT: stablehlo.multiply
// CHECK: return %[[R0]], %[[S1]], %[[R2]]
// MIN3-LABEL: func.func @main
// MIN3: stablehlo.concatenate
func.func @main(%m0: tensor<2x3xf32>, %m1: tensor<4xf32>, %m2: tensor<2x2x2xf32>,
                %g0: tensor<2x3xf32>, %g1: tensor<4xf32>, %g2: tensor<2x2x2xf32>)
    -> (tensor<2x3xf32>, tensor<4xf32>, tensor<2x2x2xf32>) {
  %c0 = stablehlo.constant dense<0.9> : tensor<f32>
  %b0 = stablehlo.broadcast_in_dim %c0, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
  %x0 = stablehlo.multiply %b0, %m0 : tensor<2x3xf32>
  %d0 = stablehlo.constant dense<0.1> : tensor<2x3xf32>
  %y0 = stablehlo.multiply %d0, %g0 : tensor<2x3xf32>
  %n0 = stablehlo.add %x0, %y0 : tensor<2x3xf32>
  %c1 = stablehlo.constant dense<0.9> : tensor<f32>
  %b1 = stablehlo.broadcast_in_dim %c1, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %x1 = stablehlo.multiply %b1, %m1 : tensor<4xf32>
  %d1 = stablehlo.constant dense<0.1> : tensor<f32>
  %e1 = stablehlo.broadcast_in_dim %d1, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %y1 = stablehlo.multiply %e1, %g1 : tensor<4xf32>
  %n1 = stablehlo.add %x1, %y1 : tensor<4xf32>
  %b2 = stablehlo.constant dense<0.9> : tensor<2x2x2xf32>
  %x2 = stablehlo.multiply %b2, %m2 : tensor<2x2x2xf32>
  %d2 = stablehlo.constant dense<0.1> : tensor<2x2x2xf32>
  %y2 = stablehlo.multiply %d2, %g2 : tensor<2x2x2xf32>
  %n2 = stablehlo.add %x2, %y2 : tensor<2x2x2xf32>
  return %n0, %n1, %n2 : tensor<2x3xf32>, tensor<4xf32>, tensor<2x2x2xf32>
}

// -----

// A chain of updates stays flat: the step p - lr * m' reads the flat m' directly (the trees are
// visited in the other order, and reordered to match), and a broadcast 0-d argument (lr) is a
// shared scalar broadcast once to the flat shape. m' is returned too, so its slices stay.
// CHECK-LABEL: func.func @main
// CHECK: %[[M:.*]] = stablehlo.concatenate %arg0, %arg1, dim = 0 : (tensor<3xf32>, tensor<5xf32>) -> tensor<8xf32>
// CHECK: %[[NEG:.*]] = stablehlo.negate %[[M]] : tensor<8xf32>
// CHECK: stablehlo.slice %[[NEG]] [0:3]
// CHECK: stablehlo.slice %[[NEG]] [3:8]
// CHECK: %[[P:.*]] = stablehlo.concatenate %arg2, %arg3, dim = 0
// CHECK: %[[LR:.*]] = stablehlo.broadcast_in_dim %arg4, dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK: %[[STEP:.*]] = stablehlo.multiply %[[LR]], %[[NEG]] : tensor<8xf32>
// CHECK: %[[NEW:.*]] = stablehlo.subtract %[[P]], %[[STEP]] : tensor<8xf32>
// CHECK: %[[P0:.*]] = stablehlo.slice %[[NEW]] [0:3]
// CHECK: %[[P1:.*]] = stablehlo.slice %[[NEW]] [3:8]
// CHECK-NOT: stablehlo.concatenate
// CHECK: return %[[P0]], %[[P1]], %{{.*}}, %{{.*}} :
// MIN3-LABEL: func.func @main
// MIN3-NOT: stablehlo.concatenate
func.func @main(%m0: tensor<3xf32>, %m1: tensor<5xf32>, %p0: tensor<3xf32>, %p1: tensor<5xf32>, %lr: tensor<f32>)
    -> (tensor<3xf32>, tensor<5xf32>, tensor<3xf32>, tensor<5xf32>) {
  %n0 = stablehlo.negate %m0 : tensor<3xf32>
  %n1 = stablehlo.negate %m1 : tensor<5xf32>
  %l1 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<5xf32>
  %s1 = stablehlo.multiply %l1, %n1 : tensor<5xf32>
  %q1 = stablehlo.subtract %p1, %s1 : tensor<5xf32>
  %l0 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<3xf32>
  %s0 = stablehlo.multiply %l0, %n0 : tensor<3xf32>
  %q0 = stablehlo.subtract %p0, %s0 : tensor<3xf32>
  return %q0, %q1, %n0, %n1 : tensor<3xf32>, tensor<5xf32>, tensor<3xf32>, tensor<5xf32>
}

// -----

// compare, select, sqrt, convert and a repeated per-leaf operand (x * x) are matched too.
// CHECK-LABEL: func.func @main
// CHECK: %[[X:.*]] = stablehlo.concatenate %{{.*}}, %arg1, dim = 0 : (tensor<4xf32>, tensor<3xf32>) -> tensor<7xf32>
// CHECK: %[[SQ:.*]] = stablehlo.multiply %[[X]], %[[X]] : tensor<7xf32>
// CHECK: %[[R:.*]] = stablehlo.sqrt %[[SQ]] : tensor<7xf32>
// CHECK: %[[GT:.*]] = stablehlo.compare GT, %[[R]], %{{.*}}, FLOAT : (tensor<7xf32>, tensor<7xf32>) -> tensor<7xi1>
// CHECK: %[[SEL:.*]] = stablehlo.select %[[GT]], %[[R]], %[[X]] : tensor<7xi1>, tensor<7xf32>
// CHECK: stablehlo.convert %[[SEL]] : (tensor<7xf32>) -> tensor<7xf16>
// CHECK-NOT: stablehlo.sqrt
func.func @main(%x0: tensor<2x2xf32>, %x1: tensor<3xf32>, %t: tensor<f32>) -> (tensor<2x2xf16>, tensor<3xf16>) {
  %t0 = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %q0 = stablehlo.multiply %x0, %x0 : tensor<2x2xf32>
  %r0 = stablehlo.sqrt %q0 : tensor<2x2xf32>
  %c0 = stablehlo.compare GT, %r0, %t0, FLOAT : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xi1>
  %s0 = stablehlo.select %c0, %r0, %x0 : tensor<2x2xi1>, tensor<2x2xf32>
  %h0 = stablehlo.convert %s0 : (tensor<2x2xf32>) -> tensor<2x2xf16>
  %t1 = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<3xf32>
  %q1 = stablehlo.multiply %x1, %x1 : tensor<3xf32>
  %r1 = stablehlo.sqrt %q1 : tensor<3xf32>
  %c1 = stablehlo.compare GT, %r1, %t1, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
  %s1 = stablehlo.select %c1, %r1, %x1 : tensor<3xi1>, tensor<3xf32>
  %h1 = stablehlo.convert %s1 : (tensor<3xf32>) -> tensor<3xf16>
  return %h0, %h1 : tensor<2x2xf16>, tensor<3xf16>
}

// -----

// Negative: trees of different element types (f32, f16), different ops (add, subtract), different
// repetition of operands (x * x, y * z) and a single tree.
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.concatenate
// CHECK-NOT: stablehlo.slice
func.func @main(%a: tensor<4xf32>, %b: tensor<2x2xf16>, %c: tensor<3xf32>, %d: tensor<5xf32>, %e: tensor<6xf32>, %f: tensor<5xf32>)
    -> (tensor<4xf32>, tensor<2x2xf16>, tensor<3xf32>, tensor<5xf32>, tensor<6xf32>, tensor<5xf32>, tensor<6xf32>) {
  %na = stablehlo.negate %a : tensor<4xf32>
  %nb = stablehlo.negate %b : tensor<2x2xf16>
  %cc = stablehlo.add %c, %c : tensor<3xf32>
  %dd = stablehlo.subtract %d, %d : tensor<5xf32>
  %ee = stablehlo.maximum %e, %e : tensor<6xf32>
  %df = stablehlo.maximum %d, %f : tensor<5xf32>
  %ex = stablehlo.exponential %e : tensor<6xf32>
  return %na, %nb, %cc, %dd, %ee, %df, %ex : tensor<4xf32>, tensor<2x2xf16>, tensor<3xf32>, tensor<5xf32>, tensor<6xf32>, tensor<5xf32>, tensor<6xf32>
}

// -----

// Trees that differ only in their shared scalars (a per-leaf learning rate: 0.9 as a splat, 0.5
// and a computed 0-d value as broadcasts) are one group: the scalars become one vector, each
// broadcast to its tree's size and concatenated; a scalar the trees share (the 2.0) stays one.
// CHECK-LABEL: func.func @main
// CHECK-DAG: %[[K9:.*]] = stablehlo.constant dense<0.899999976> : tensor<4xf32>
// CHECK-DAG: %[[K5:.*]] = stablehlo.constant dense<5.000000e-01> : tensor<3xf32>
// CHECK-DAG: %[[KV:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<2xf32>
// CHECK-DAG: %[[X:.*]] = stablehlo.concatenate %arg0, %arg1, %arg2, dim = 0 : (tensor<4xf32>, tensor<3xf32>, tensor<2xf32>) -> tensor<9xf32>
// CHECK-DAG: %[[K:.*]] = stablehlo.concatenate %[[K9]], %[[K5]], %[[KV]], dim = 0 : (tensor<4xf32>, tensor<3xf32>, tensor<2xf32>) -> tensor<9xf32>
// CHECK: %[[M:.*]] = stablehlo.multiply %[[X]], %[[K]] : tensor<9xf32>
// CHECK-NEXT: %[[TWO:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<9xf32>
// CHECK-NEXT: stablehlo.add %[[M]], %[[TWO]] : tensor<9xf32>
// CHECK-NOT: stablehlo.multiply
func.func @main(%a: tensor<4xf32>, %c: tensor<3xf32>, %e: tensor<2xf32>, %s: tensor<f32>)
    -> (tensor<4xf32>, tensor<3xf32>, tensor<2xf32>) {
  %two = stablehlo.constant dense<2.0> : tensor<f32>
  %k9 = stablehlo.constant dense<0.9> : tensor<4xf32>
  %a2 = stablehlo.broadcast_in_dim %two, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %ak = stablehlo.multiply %a, %k9 : tensor<4xf32>
  %ar = stablehlo.add %ak, %a2 : tensor<4xf32>
  %k5 = stablehlo.constant dense<0.5> : tensor<f32>
  %b5 = stablehlo.broadcast_in_dim %k5, dims = [] : (tensor<f32>) -> tensor<3xf32>
  %c2 = stablehlo.broadcast_in_dim %two, dims = [] : (tensor<f32>) -> tensor<3xf32>
  %ck = stablehlo.multiply %c, %b5 : tensor<3xf32>
  %cr = stablehlo.add %ck, %c2 : tensor<3xf32>
  %sq = stablehlo.sqrt %s : tensor<f32>
  %bs = stablehlo.broadcast_in_dim %sq, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %e2 = stablehlo.broadcast_in_dim %two, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %ek = stablehlo.multiply %e, %bs : tensor<2xf32>
  %er = stablehlo.add %ek, %e2 : tensor<2xf32>
  return %ar, %cr, %er : tensor<4xf32>, tensor<3xf32>, tensor<2xf32>
}

// -----

// Negative: isomorphic trees that cannot run at one point: %b2 reads %a2 (one tree feeds the
// other), and %y reads %x through a non-elementwise op (the transpose needs %x first).
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[A:.*]] = stablehlo.abs %arg0
// CHECK: stablehlo.abs %[[A]]
// CHECK: %[[X:.*]] = stablehlo.exponential %arg1
// CHECK: %[[T:.*]] = stablehlo.transpose %[[X]]
// CHECK: stablehlo.exponential %[[T]]
func.func @main(%a: tensor<4xf32>, %x: tensor<2x3xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<2x3xf32>, tensor<3x2xf32>) {
  %a2 = stablehlo.abs %a : tensor<4xf32>
  %b2 = stablehlo.abs %a2 : tensor<4xf32>
  %x2 = stablehlo.exponential %x : tensor<2x3xf32>
  %t = stablehlo.transpose %x2, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %y2 = stablehlo.exponential %t : tensor<3x2xf32>
  return %a2, %b2, %x2, %y2 : tensor<4xf32>, tensor<4xf32>, tensor<2x3xf32>, tensor<3x2xf32>
}

// -----

// Three isomorphic trees where the third reads the first: the first two are flattened, the third
// stays (it is a group of one); with min-group=3 nothing is.
// CHECK-LABEL: func.func @main
// CHECK: %[[F:.*]] = stablehlo.concatenate %arg0, %arg1, dim = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>
// CHECK: %[[S:.*]] = stablehlo.sqrt %[[F]] : tensor<5xf32>
// CHECK: %[[A:.*]] = stablehlo.slice %[[S]] [0:2]
// CHECK: %[[B:.*]] = stablehlo.slice %[[S]] [2:5]
// CHECK: %[[C:.*]] = stablehlo.sqrt %[[A]] : tensor<2xf32>
// CHECK: return %[[A]], %[[B]], %[[C]]
// MIN3-LABEL: func.func @main
// MIN3-NOT: stablehlo.concatenate
func.func @main(%a: tensor<2xf32>, %b: tensor<3xf32>) -> (tensor<2xf32>, tensor<3xf32>, tensor<2xf32>) {
  %a2 = stablehlo.sqrt %a : tensor<2xf32>
  %b2 = stablehlo.sqrt %b : tensor<3xf32>
  %c2 = stablehlo.sqrt %a2 : tensor<2xf32>
  return %a2, %b2, %c2 : tensor<2xf32>, tensor<3xf32>, tensor<2xf32>
}

// -----

// A use inside a region counts at its enclosing op: the flat code goes before the stablehlo.if.
// CHECK-LABEL: func.func @main
// CHECK: %[[F:.*]] = stablehlo.negate %{{.*}} : tensor<5xf32>
// CHECK: %[[X:.*]] = stablehlo.slice %[[F]] [0:2]
// CHECK: "stablehlo.if"
// CHECK: stablehlo.abs %[[X]]
func.func @main(%p: tensor<i1>, %a: tensor<2xf32>, %b: tensor<3xf32>) -> (tensor<2xf32>, tensor<3xf32>) {
  %x = stablehlo.negate %a : tensor<2xf32>
  %y = stablehlo.negate %b : tensor<3xf32>
  %r = "stablehlo.if"(%p) ({
    %z = stablehlo.abs %x : tensor<2xf32>
    stablehlo.return %z : tensor<2xf32>
  }, {
    stablehlo.return %x : tensor<2xf32>
  }) : (tensor<i1>) -> tensor<2xf32>
  return %r, %y : tensor<2xf32>, tensor<3xf32>
}

// -----

// A group of more than 16 leaves (here 18 moments minus their gradients): each flat vector is built
// as jnp.concatenate builds it, a tree of concatenates of at most 16 operands (XLA compiles a wide
// concatenate more slowly: _concat.py), 16 + 2 pieces, then their concatenation.
// CHECK-LABEL: func.func @main
// CHECK: %[[A:.*]] = stablehlo.concatenate %arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6, %arg7, %arg8, %arg9, %arg10, %arg11, %arg12, %arg13, %arg14, %arg15, dim = 0 : {{.*}} -> tensor<32xf32>
// CHECK-NEXT: %[[B:.*]] = stablehlo.concatenate %arg16, %arg17, dim = 0 : (tensor<2xf32>, tensor<2xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[M:.*]] = stablehlo.concatenate %[[A]], %[[B]], dim = 0 : (tensor<32xf32>, tensor<4xf32>) -> tensor<36xf32>
// CHECK: %[[G:.*]] = stablehlo.concatenate %{{.*}}, %{{.*}}, dim = 0 : (tensor<32xf32>, tensor<4xf32>) -> tensor<36xf32>
// CHECK: stablehlo.subtract %[[M]], %[[G]] : tensor<36xf32>
// CHECK-NOT: stablehlo.subtract
// MIN3-LABEL: func.func @main
func.func @main(%m0: tensor<2xf32>, %m1: tensor<2xf32>, %m2: tensor<2xf32>, %m3: tensor<2xf32>, %m4: tensor<2xf32>, %m5: tensor<2xf32>, %m6: tensor<2xf32>, %m7: tensor<2xf32>, %m8: tensor<2xf32>, %m9: tensor<2xf32>, %m10: tensor<2xf32>, %m11: tensor<2xf32>, %m12: tensor<2xf32>, %m13: tensor<2xf32>, %m14: tensor<2xf32>, %m15: tensor<2xf32>, %m16: tensor<2xf32>, %m17: tensor<2xf32>, %g0: tensor<2xf32>, %g1: tensor<2xf32>, %g2: tensor<2xf32>, %g3: tensor<2xf32>, %g4: tensor<2xf32>, %g5: tensor<2xf32>, %g6: tensor<2xf32>, %g7: tensor<2xf32>, %g8: tensor<2xf32>, %g9: tensor<2xf32>, %g10: tensor<2xf32>, %g11: tensor<2xf32>, %g12: tensor<2xf32>, %g13: tensor<2xf32>, %g14: tensor<2xf32>, %g15: tensor<2xf32>, %g16: tensor<2xf32>, %g17: tensor<2xf32>)
    -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
  %n0 = stablehlo.subtract %m0, %g0 : tensor<2xf32>
  %n1 = stablehlo.subtract %m1, %g1 : tensor<2xf32>
  %n2 = stablehlo.subtract %m2, %g2 : tensor<2xf32>
  %n3 = stablehlo.subtract %m3, %g3 : tensor<2xf32>
  %n4 = stablehlo.subtract %m4, %g4 : tensor<2xf32>
  %n5 = stablehlo.subtract %m5, %g5 : tensor<2xf32>
  %n6 = stablehlo.subtract %m6, %g6 : tensor<2xf32>
  %n7 = stablehlo.subtract %m7, %g7 : tensor<2xf32>
  %n8 = stablehlo.subtract %m8, %g8 : tensor<2xf32>
  %n9 = stablehlo.subtract %m9, %g9 : tensor<2xf32>
  %n10 = stablehlo.subtract %m10, %g10 : tensor<2xf32>
  %n11 = stablehlo.subtract %m11, %g11 : tensor<2xf32>
  %n12 = stablehlo.subtract %m12, %g12 : tensor<2xf32>
  %n13 = stablehlo.subtract %m13, %g13 : tensor<2xf32>
  %n14 = stablehlo.subtract %m14, %g14 : tensor<2xf32>
  %n15 = stablehlo.subtract %m15, %g15 : tensor<2xf32>
  %n16 = stablehlo.subtract %m16, %g16 : tensor<2xf32>
  %n17 = stablehlo.subtract %m17, %g17 : tensor<2xf32>
  return %n0, %n1, %n2, %n3, %n4, %n5, %n6, %n7, %n8, %n9, %n10, %n11, %n12, %n13, %n14, %n15, %n16, %n17 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
}

// -----

// Groups rewritten in another order than their dependencies: the adds (first in the block) read a
// multiply, which reads a negate; the negates' rewrite changes the multiply's operand after the
// adds' rewrite has left it for the dead-code sweep. (A worklist of ops keyed by hash went stale
// here and erased an op twice: in these bindings an op's hash changes with its operands.)
// CHECK-LABEL: func.func @main
// CHECK: %[[N:.*]] = stablehlo.negate %{{.*}} : tensor<8xf32>
// CHECK: %[[NS:.*]] = stablehlo.slice %[[N]] [3:8]
// CHECK: %[[M:.*]] = stablehlo.concatenate %arg3, %[[NS]], dim = 0
// CHECK: %[[Y:.*]] = stablehlo.multiply %[[M]], %[[M]] : tensor<8xf32>
// CHECK: %[[YS:.*]] = stablehlo.slice %[[Y]] [3:8]
// CHECK: %[[A:.*]] = stablehlo.concatenate %arg0, %[[YS]], dim = 0
// CHECK: stablehlo.add %[[A]], %[[A]] : tensor<9xf32>
// CHECK-NOT: stablehlo.negate
// CHECK-NOT: stablehlo.multiply
func.func @main(%p1: tensor<4xf32>, %a1: tensor<3xf32>, %a2: tensor<5xf32>, %b1: tensor<3xf32>)
    -> (tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<5xf32>) {
  %x1 = stablehlo.add %p1, %p1 : tensor<4xf32>
  %z1 = stablehlo.negate %a1 : tensor<3xf32>
  %y1 = stablehlo.multiply %b1, %b1 : tensor<3xf32>
  %z2 = stablehlo.negate %a2 : tensor<5xf32>
  %y2 = stablehlo.multiply %z2, %z2 : tensor<5xf32>
  %x2 = stablehlo.add %y2, %y2 : tensor<5xf32>
  return %x1, %z1, %y1, %x2 : tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<5xf32>
}
