// RUN: loopfuse-opt %s --split-input-file --fold-slices | filecheck %s

// A packed buffer cut into its leaves and put back together: the slices, reshaped, join into the
// buffer itself; the constant stays where it is, after the negate (nothing is folded or hoisted).
// CHECK-LABEL: func.func @whole_buffer
// CHECK-NEXT: %[[N:.*]] = stablehlo.negate %arg0 : tensor<9xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<9xf32>
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %arg0, %[[C]] : tensor<9xf32>
// CHECK-NEXT: return %arg0, %[[M]], %[[N]] : tensor<9xf32>, tensor<9xf32>, tensor<9xf32>
func.func @whole_buffer(%p: tensor<9xf32>) -> (tensor<9xf32>, tensor<9xf32>, tensor<9xf32>) {
  %n = stablehlo.negate %p : tensor<9xf32>
  %0 = stablehlo.slice %p [0:6] : (tensor<9xf32>) -> tensor<6xf32>
  %w = stablehlo.reshape %0 : (tensor<6xf32>) -> tensor<2x3xf32>
  %c = stablehlo.constant dense<2.0> : tensor<9xf32>
  %b = stablehlo.slice %p [6:9] : (tensor<9xf32>) -> tensor<3xf32>
  %w1 = stablehlo.reshape %w : (tensor<2x3xf32>) -> tensor<6xf32>
  %1 = stablehlo.concatenate %w1, %b, dim = 0 : (tensor<6xf32>, tensor<3xf32>) -> tensor<9xf32>
  %2 = stablehlo.multiply %1, %c : tensor<9xf32>
  return %1, %2, %n : tensor<9xf32>, tensor<9xf32>, tensor<9xf32>
}

// -----

// Consecutive rows of a stacked tensor, each reshaped, join into one slice of those rows,
// reshaped; the run stops where the rows do not follow on (row 3 after rows 1..2 of another
// tensor), and other operands stay between the runs.
// CHECK-LABEL: func.func @rows
// CHECK-NEXT: %[[R:.*]] = stablehlo.slice %arg0 [1:3, 0:2] : (tensor<4x2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.reshape %[[R]] : (tensor<2x2xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.slice %arg1 [3:4, 0:2] : (tensor<4x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT: %[[G:.*]] = stablehlo.reshape %[[S]] : (tensor<1x2xf32>) -> tensor<2xf32>
// CHECK-NEXT: %[[J:.*]] = stablehlo.concatenate %[[F]], %arg2, %[[G]], dim = 0 : (tensor<4xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<8xf32>
// CHECK-NEXT: return %[[J]]
func.func @rows(%x: tensor<4x2xf32>, %y: tensor<4x2xf32>, %z: tensor<2xf32>) -> tensor<8xf32> {
  %0 = stablehlo.slice %x [1:2, 0:2] : (tensor<4x2xf32>) -> tensor<1x2xf32>
  %1 = stablehlo.reshape %0 : (tensor<1x2xf32>) -> tensor<2xf32>
  %2 = stablehlo.slice %x [2:3, 0:2] : (tensor<4x2xf32>) -> tensor<1x2xf32>
  %3 = stablehlo.reshape %2 : (tensor<1x2xf32>) -> tensor<2xf32>
  %4 = stablehlo.slice %y [3:4, 0:2] : (tensor<4x2xf32>) -> tensor<1x2xf32>
  %5 = stablehlo.reshape %4 : (tensor<1x2xf32>) -> tensor<2xf32>
  %6 = stablehlo.concatenate %1, %3, %z, %5, dim = 0 : (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<8xf32>
  return %6 : tensor<8xf32>
}

// -----

// A slice of all of its operand and a concatenate of one operand are that operand.
// CHECK-LABEL: func.func @whole
// CHECK-NEXT: return %arg0, %arg0 : tensor<2x3xf32>, tensor<2x3xf32>
func.func @whole(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
  %0 = stablehlo.slice %x [0:2, 0:3] : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.concatenate %x, dim = 0 : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
}

// -----

// Negative: slices that are not whole rows ([0:2, 0:1] then [0:2, 1:2]), that skip a row
// ([0:1] then [2:3]), that come out of order, that are strided, or joined along another dimension
// stay as they are.
// CHECK-LABEL: func.func @not_joined
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.concatenate 
// CHECK-NEXT: = stablehlo.reshape 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.concatenate 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.concatenate 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.concatenate 
// CHECK-NEXT: = stablehlo.reshape 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.concatenate 
// CHECK-NEXT: = stablehlo.slice 
// CHECK-NEXT: = stablehlo.reshape 
// CHECK-NEXT: return
func.func @not_joined(%x: tensor<2x2xf32>, %y: tensor<4xf32>) -> (tensor<2x2xf32>, tensor<2xf32>, tensor<4xf32>, tensor<2xf32>, tensor<2x2xf32>) {
  %0 = stablehlo.slice %x [0:2, 0:1] : (tensor<2x2xf32>) -> tensor<2x1xf32>
  %1 = stablehlo.slice %x [0:2, 1:2] : (tensor<2x2xf32>) -> tensor<2x1xf32>
  %2 = stablehlo.concatenate %0, %1, dim = 0 : (tensor<2x1xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  %3 = stablehlo.reshape %2 : (tensor<4x1xf32>) -> tensor<2x2xf32>
  %4 = stablehlo.slice %y [0:1] : (tensor<4xf32>) -> tensor<1xf32>
  %5 = stablehlo.slice %y [2:3] : (tensor<4xf32>) -> tensor<1xf32>
  %6 = stablehlo.concatenate %4, %5, dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
  %7 = stablehlo.slice %y [2:4] : (tensor<4xf32>) -> tensor<2xf32>
  %8 = stablehlo.slice %y [0:2] : (tensor<4xf32>) -> tensor<2xf32>
  %9 = stablehlo.concatenate %7, %8, dim = 0 : (tensor<2xf32>, tensor<2xf32>) -> tensor<4xf32>
  %10 = stablehlo.slice %y [0:4:2] : (tensor<4xf32>) -> tensor<2xf32>
  %11 = stablehlo.slice %y [1:4:2] : (tensor<4xf32>) -> tensor<2xf32>
  %12 = stablehlo.concatenate %10, %11, dim = 0 : (tensor<2xf32>, tensor<2xf32>) -> tensor<4xf32>
  %13 = stablehlo.reshape %12 : (tensor<4xf32>) -> tensor<2x2xf32>
  %14 = stablehlo.slice %x [0:1, 0:2] : (tensor<2x2xf32>) -> tensor<1x2xf32>
  %15 = stablehlo.slice %x [1:2, 0:2] : (tensor<2x2xf32>) -> tensor<1x2xf32>
  %16 = stablehlo.concatenate %14, %15, dim = 1 : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
  %17 = stablehlo.slice %16 [0:1, 0:2] : (tensor<1x4xf32>) -> tensor<1x2xf32>
  %18 = stablehlo.reshape %17 : (tensor<1x2xf32>) -> tensor<2xf32>
  return %3, %6, %9, %18, %13 : tensor<2x2xf32>, tensor<2xf32>, tensor<4xf32>, tensor<2xf32>, tensor<2x2xf32>
}
