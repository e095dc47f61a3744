// RUN: loopfuse-opt %s --split-input-file --cond-to-select | filecheck %s

// A lax.cond as jax lowers it (the index a converted boolean), branch 0 passing the state through,
// branch 1 an update of elementwise ops and a call of such ops, and a step count (optax.MultiSteps'
// shape): the branches' ops run before, each result a select on the boolean itself. (The case's
// attribute is what roll-layers puts back where no layers roll: test_cond_to_select.py.)
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.case
// CHECK: %[[NEW:.*]] = stablehlo.subtract %arg1
// CHECK: %[[ZERO:.*]] = call @zeros
// CHECK: %[[NEXT:.*]] = stablehlo.add %arg3
// CHECK: %[[W:.*]] = stablehlo.select %arg0, %[[NEW]], %arg1 : tensor<i1>, tensor<4xf32>
// CHECK: %[[M:.*]] = stablehlo.select %arg0, %[[ZERO]], %arg2 : tensor<i1>, tensor<4xf32>
// CHECK: %[[C:.*]] = stablehlo.select %arg0, %[[NEXT]], %arg3 : tensor<i1>, tensor<i32>
// CHECK: return %[[W]], %[[M]], %[[C]]
func.func @main(%p: tensor<i1>, %w: tensor<4xf32>, %m: tensor<4xf32>, %c: tensor<i32>)
    -> (tensor<4xf32>, tensor<4xf32>, tensor<i32>) {
  %i = stablehlo.convert %p : (tensor<i1>) -> tensor<i32>
  %r:3 = "stablehlo.case"(%i) ({
    stablehlo.return %w, %m, %c : tensor<4xf32>, tensor<4xf32>, tensor<i32>
  }, {
    %lr = stablehlo.constant dense<1.000000e-01> : tensor<4xf32>
    %step = stablehlo.multiply %lr, %m : tensor<4xf32>
    %new = stablehlo.subtract %w, %step : tensor<4xf32>
    %zero = func.call @zeros() : () -> tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %next = stablehlo.add %c, %one : tensor<i32>
    stablehlo.return %new, %zero, %next : tensor<4xf32>, tensor<4xf32>, tensor<i32>
  }) {mhlo.frontend_attributes = {_xla_compute_type = "host"}} : (tensor<i32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<i32>)
  return %r#0, %r#1, %r#2 : tensor<4xf32>, tensor<4xf32>, tensor<i32>
}
func.func private @zeros() -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %b = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<f32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}

// -----

// Any other index (lax.switch over two branches): branch 1 where it is not 0, as the case runs its
// last branch for an index out of range; a reduction with an elementwise body is cheap.
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.case
// CHECK: %[[SUM:.*]] = stablehlo.reduce
// CHECK: %[[NEG:.*]] = stablehlo.negate %arg1
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK: %[[ONE:.*]] = stablehlo.compare NE, %arg0, %[[ZERO]]
// CHECK: %[[S:.*]] = stablehlo.select %[[ONE]], %[[NEG]], %[[SUM]] : tensor<i1>, tensor<f32>
// CHECK: return %[[S]]
func.func @main(%i: tensor<i32>, %x: tensor<f32>, %v: tensor<8xf32>) -> tensor<f32> {
  %r = "stablehlo.case"(%i) ({
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %sum = stablehlo.reduce(%v init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
    stablehlo.return %sum : tensor<f32>
  }, {
    %neg = stablehlo.negate %x : tensor<f32>
    stablehlo.return %neg : tensor<f32>
  }) : (tensor<i32>) -> tensor<f32>
  return %r : tensor<f32>
}

// -----

// Negative: a branch with a matrix product (the branch not taken would cost as much as the one
// taken), a case of three branches, and one whose branches both return one value for a result, stay cases.
// CHECK-LABEL: func.func @main
// CHECK: "stablehlo.case"
// CHECK: stablehlo.dot_general
// CHECK: "stablehlo.case"
// CHECK: "stablehlo.case"
// CHECK-NOT: stablehlo.select
func.func @main(%p: tensor<i1>, %i: tensor<i32>, %x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  %k = stablehlo.convert %p : (tensor<i1>) -> tensor<i32>
  %a = "stablehlo.case"(%k) ({
    stablehlo.return %x : tensor<4x4xf32>
  }, {
    %d = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    stablehlo.return %d : tensor<4x4xf32>
  }) : (tensor<i32>) -> tensor<4x4xf32>
  %b = "stablehlo.case"(%i) ({
    stablehlo.return %x : tensor<4x4xf32>
  }, {
    %n = stablehlo.negate %x : tensor<4x4xf32>
    stablehlo.return %n : tensor<4x4xf32>
  }, {
    %s = stablehlo.sine %x : tensor<4x4xf32>
    stablehlo.return %s : tensor<4x4xf32>
  }) : (tensor<i32>) -> tensor<4x4xf32>
  %c:2 = "stablehlo.case"(%k) ({
    stablehlo.return %x, %x : tensor<4x4xf32>, tensor<4x4xf32>
  }, {
    %n = stablehlo.negate %x : tensor<4x4xf32>
    stablehlo.return %n, %x : tensor<4x4xf32>, tensor<4x4xf32>
  }) : (tensor<i32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  return %a, %b, %c#0, %c#1 : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Two conds on one boolean (a cond and its transpose, as jax differentiates lax.cond): each made
// selects on it, the index converted once for both erased once.
// CHECK-LABEL: func.func @main
// CHECK-NOT: stablehlo.convert
// CHECK: %[[A:.*]] = stablehlo.sine %arg1
// CHECK: %[[S:.*]] = stablehlo.select %arg0, %[[A]], %arg1
// CHECK: %[[B:.*]] = stablehlo.cosine %[[S]]
// CHECK: %[[T:.*]] = stablehlo.select %arg0, %[[B]], %[[S]]
// CHECK: return %[[T]]
func.func @main(%p: tensor<i1>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %i = stablehlo.convert %p : (tensor<i1>) -> tensor<i32>
  %a = "stablehlo.case"(%i) ({
    stablehlo.return %x : tensor<4xf32>
  }, {
    %s = stablehlo.sine %x : tensor<4xf32>
    stablehlo.return %s : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  %b = "stablehlo.case"(%i) ({
    stablehlo.return %a : tensor<4xf32>
  }, {
    %c = stablehlo.cosine %a : tensor<4xf32>
    stablehlo.return %c : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}
