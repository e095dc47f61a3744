// RUN: loopfuse-opt %s --split-input-file --simplify | filecheck %s

// x * 1 and 1 * x fold for floats and integers, also when the one is a broadcast scalar.
// CHECK-LABEL: func.func @mul_one
// CHECK-NOT: stablehlo.multiply
// CHECK-NOT: stablehlo.constant
// CHECK: return %arg0, %arg0, %arg1 : tensor<4xf32>, tensor<4xf32>, tensor<2x3xi32>
func.func @mul_one(%x: tensor<4xf32>, %i: tensor<2x3xi32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<2x3xi32>) {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %a = stablehlo.multiply %x, %one : tensor<4xf32>
  %b = stablehlo.multiply %one, %x : tensor<4xf32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %ones = stablehlo.broadcast_in_dim %c1, dims = [] : (tensor<i32>) -> tensor<2x3xi32>
  %c = stablehlo.multiply %i, %ones : tensor<2x3xi32>
  return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<2x3xi32>
}

// -----

// Negative: x * 2, x * a non-splat constant and x * y stay.
// CHECK-LABEL: func.func @mul_not_one
// CHECK: stablehlo.multiply %arg0, %{{.*}} : tensor<2xf32>
// CHECK: stablehlo.multiply %arg0, %{{.*}} : tensor<2xf32>
// CHECK: stablehlo.multiply %arg0, %arg1 : tensor<2xf32>
func.func @mul_not_one(%x: tensor<2xf32>, %y: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
  %two = stablehlo.constant dense<2.0> : tensor<2xf32>
  %a = stablehlo.multiply %x, %two : tensor<2xf32>
  %mixed = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = stablehlo.multiply %x, %mixed : tensor<2xf32>
  %c = stablehlo.multiply %x, %y : tensor<2xf32>
  return %a, %b, %c : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
}

// -----

// Integers: x + 0, 0 + x and x - 0 fold.
// CHECK-LABEL: func.func @int_zero
// CHECK-NOT: stablehlo.add
// CHECK-NOT: stablehlo.subtract
// CHECK: return %arg0, %arg0, %arg0 : tensor<4xi32>, tensor<4xi32>, tensor<4xi32>
func.func @int_zero(%x: tensor<4xi32>) -> (tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) {
  %zero = stablehlo.constant dense<0> : tensor<4xi32>
  %a = stablehlo.add %x, %zero : tensor<4xi32>
  %b = stablehlo.add %zero, %x : tensor<4xi32>
  %c = stablehlo.subtract %x, %zero : tensor<4xi32>
  return %a, %b, %c : tensor<4xi32>, tensor<4xi32>, tensor<4xi32>
}

// -----

// Floats: x + (-0.0), (-0.0) + x and x - (+0.0) are exactly x.
// CHECK-LABEL: func.func @float_zero
// CHECK-NOT: stablehlo.add
// CHECK-NOT: stablehlo.subtract
// CHECK: return %arg0, %arg0, %arg0 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
func.func @float_zero(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %neg = stablehlo.constant dense<-0.0> : tensor<f32>
  %negs = stablehlo.broadcast_in_dim %neg, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %pos = stablehlo.constant dense<0.0> : tensor<4xf32>
  %a = stablehlo.add %x, %negs : tensor<4xf32>
  %b = stablehlo.add %negs, %x : tensor<4xf32>
  %c = stablehlo.subtract %x, %pos : tensor<4xf32>
  return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Negative: x + (+0.0) maps -0.0 to +0.0 and x - (-0.0) is x + 0.0, so both stay; 0 - x is not x.
// CHECK-LABEL: func.func @float_zero_kept
// CHECK: stablehlo.add %arg0, %{{.*}} : tensor<4xf32>
// CHECK: stablehlo.add %{{.*}}, %arg0 : tensor<4xf32>
// CHECK: stablehlo.subtract %arg0, %{{.*}} : tensor<4xf32>
// CHECK: stablehlo.subtract %{{.*}}, %arg0 : tensor<4xf32>
func.func @float_zero_kept(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %pos = stablehlo.constant dense<0.0> : tensor<4xf32>
  %neg = stablehlo.constant dense<-0.0> : tensor<4xf32>
  %a = stablehlo.add %x, %pos : tensor<4xf32>
  %b = stablehlo.add %pos, %x : tensor<4xf32>
  %c = stablehlo.subtract %x, %neg : tensor<4xf32>
  %d = stablehlo.subtract %pos, %x : tensor<4xf32>
  return %a, %b, %c, %d : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Two broadcasts become one with composed dimensions; the size-1 dim stays broadcast.
// CHECK-LABEL: func.func @broadcast_broadcast
// CHECK: %[[B:.*]] = stablehlo.broadcast_in_dim %arg0, dims = [0, 2] : (tensor<2x3xf32>) -> tensor<2x4x3xf32>
// CHECK-NOT: stablehlo.broadcast_in_dim
// CHECK: return %[[B]]
func.func @broadcast_broadcast(%x: tensor<2x3xf32>) -> tensor<2x4x3xf32> {
  %a = stablehlo.broadcast_in_dim %x, dims = [0, 1] : (tensor<2x3xf32>) -> tensor<2x3x1xf32>
  %b = stablehlo.broadcast_in_dim %a, dims = [0, 2, 1] : (tensor<2x3x1xf32>) -> tensor<2x4x3xf32>
  return %b : tensor<2x4x3xf32>
}

// -----

// reshape(reshape(x)) is one reshape; back to the operand's own type it is x.
// CHECK-LABEL: func.func @reshape_reshape
// CHECK: %[[R:.*]] = stablehlo.reshape %arg0 : (tensor<2x6xf32>) -> tensor<4x3xf32>
// CHECK-NOT: stablehlo.reshape
// CHECK: return %[[R]], %arg0 : tensor<4x3xf32>, tensor<2x6xf32>
func.func @reshape_reshape(%x: tensor<2x6xf32>) -> (tensor<4x3xf32>, tensor<2x6xf32>) {
  %a = stablehlo.reshape %x : (tensor<2x6xf32>) -> tensor<12xf32>
  %b = stablehlo.reshape %a : (tensor<12xf32>) -> tensor<4x3xf32>
  %c = stablehlo.reshape %x : (tensor<2x6xf32>) -> tensor<3x4xf32>
  %d = stablehlo.reshape %c : (tensor<3x4xf32>) -> tensor<2x6xf32>
  return %b, %d : tensor<4x3xf32>, tensor<2x6xf32>
}

// -----

// An intermediate reshape with another user stays; the outer reshape still reads x directly.
// CHECK-LABEL: func.func @reshape_shared
// CHECK: %[[A:.*]] = stablehlo.reshape %arg0 : (tensor<2x6xf32>) -> tensor<12xf32>
// CHECK: %[[B:.*]] = stablehlo.reshape %arg0 : (tensor<2x6xf32>) -> tensor<4x3xf32>
// CHECK: return %[[A]], %[[B]]
func.func @reshape_shared(%x: tensor<2x6xf32>) -> (tensor<12xf32>, tensor<4x3xf32>) {
  %a = stablehlo.reshape %x : (tensor<2x6xf32>) -> tensor<12xf32>
  %b = stablehlo.reshape %a : (tensor<12xf32>) -> tensor<4x3xf32>
  return %a, %b : tensor<12xf32>, tensor<4x3xf32>
}

// -----

// transpose pairs compose: an identity disappears, any other permutation is one transpose.
// CHECK-LABEL: func.func @transpose_transpose
// CHECK: %[[T:.*]] = stablehlo.transpose %arg0, dims = [2, 0, 1] : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
// CHECK-NOT: stablehlo.transpose
// CHECK: return %arg0, %[[T]] : tensor<2x3x4xf32>, tensor<4x2x3xf32>
func.func @transpose_transpose(%x: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<4x2x3xf32>) {
  %a = stablehlo.transpose %x, dims = [1, 2, 0] : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
  %b = stablehlo.transpose %a, dims = [2, 0, 1] : (tensor<3x4x2xf32>) -> tensor<2x3x4xf32>
  %c = stablehlo.transpose %x, dims = [1, 0, 2] : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
  %d = stablehlo.transpose %c, dims = [2, 1, 0] : (tensor<3x2x4xf32>) -> tensor<4x2x3xf32>
  return %b, %d : tensor<2x3x4xf32>, tensor<4x2x3xf32>
}

// -----

// Negative: a single non-identity transpose stays.
// CHECK-LABEL: func.func @transpose_kept
// CHECK: stablehlo.transpose %arg0, dims = [1, 0]
func.func @transpose_kept(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %a = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %a : tensor<3x2xf32>
}

// -----

// convert to the same type is x; a real conversion stays.
// CHECK-LABEL: func.func @convert
// CHECK: %[[C:.*]] = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: return %arg0, %[[C]] : tensor<4xf32>, tensor<4xbf16>
func.func @convert(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xbf16>) {
  %a = stablehlo.convert %x : tensor<4xf32>
  %b = stablehlo.convert %x : (tensor<4xf32>) -> tensor<4xbf16>
  return %a, %b : tensor<4xf32>, tensor<4xbf16>
}

// -----

// Negative: dynamic shapes are left alone.
// CHECK-LABEL: func.func @dynamic
// CHECK: stablehlo.multiply
// CHECK: stablehlo.convert
func.func @dynamic(%x: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>) {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %m = stablehlo.multiply %x, %one : (tensor<?xf32>, tensor<4xf32>) -> tensor<?xf32>
  %c = stablehlo.convert %x : tensor<?xf32>
  return %m, %c : tensor<?xf32>, tensor<?xf32>
}

// -----

// Negative: complex and dense_resource constants are not read, so nothing folds.
// CHECK-LABEL: func.func @unread_constants
// CHECK: stablehlo.multiply %arg0
// CHECK: stablehlo.multiply %arg1
func.func @unread_constants(%z: tensor<2xcomplex<f32>>, %x: tensor<2xf32>) -> (tensor<2xcomplex<f32>>, tensor<2xf32>) {
  %one = stablehlo.constant dense<(1.0, 0.0)> : tensor<2xcomplex<f32>>
  %a = stablehlo.multiply %z, %one : tensor<2xcomplex<f32>>
  %blob = stablehlo.constant dense_resource<ones> : tensor<2xf32>
  %b = stablehlo.multiply %x, %blob : tensor<2xf32>
  return %a, %b : tensor<2xcomplex<f32>>, tensor<2xf32>
}
{-#
  dialect_resources: {
    builtin: {
      ones: "0x040000000000803F0000803F"
    }
  }
#-}
