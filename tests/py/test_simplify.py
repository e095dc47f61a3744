"""simplify preserves values bit for bit (StableHLO reference interpreter) and really rewrites."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jaxlib.mlir import ir

from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import Simplify
from loopfuse.passes.functions import main_func
from ir_helpers import interpret, op_counts
from problems import assert_trees_equal

DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}


def _random_inputs(module: ir.Module, rng: np.random.Generator) -> list[np.ndarray]:
    main = main_func(module.operation)
    return [_random(t.shape, DTYPES[str(t.element_type)], rng) for t in main.type.inputs]


def _random(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    """Random values, starting with the special values (signed zeros, inf, nan ...) where there is room."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        specials = [0, 1, -1, info.min, info.max]
        flat = rng.integers(info.min, info.max, size=np.prod(shape), endpoint=True).astype(dtype)
    else:
        specials = [-0.0, 0.0, np.inf, -np.inf, np.nan, np.finfo(dtype).smallest_subnormal]
        flat = rng.standard_normal(np.prod(shape)).astype(dtype)
    n = min(len(specials), flat.size)
    flat[:n] = specials[:n]
    return flat.reshape(shape)



def _simplified(text: str) -> tuple[ir.Module, ir.Module]:
    """(original, simplified) copies of `text`; the simplified one has been verified."""
    before, after = parse_module(text), parse_module(text)
    run_pass(after, Simplify())
    assert after.operation.verify()
    return before, after


def _check(text: str, expected_counts: dict) -> ir.Module:
    before, after = _simplified(text)
    counts = op_counts(after)
    assert {name: counts[name] for name in expected_counts} == expected_counts, str(after)
    args = _random_inputs(before, np.random.default_rng(0))
    assert_trees_equal(interpret(before, args), interpret(after, args))
    return after


CASES = {
    "mul_one": ("""
func.func @main(%x: tensor<3x4xf32>, %h: tensor<8xf16>, %i: tensor<6xi32>) -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<8xf16>, tensor<6xi32>) {
  %c1 = stablehlo.constant dense<1.0> : tensor<f32>
  %ones = stablehlo.broadcast_in_dim %c1, dims = [] : (tensor<f32>) -> tensor<3x4xf32>
  %a = stablehlo.multiply %x, %ones : tensor<3x4xf32>
  %b = stablehlo.multiply %ones, %x : tensor<3x4xf32>
  %h1 = stablehlo.constant dense<1.0> : tensor<8xf16>
  %c = stablehlo.multiply %h, %h1 : tensor<8xf16>
  %i1 = stablehlo.constant dense<1> : tensor<6xi32>
  %d = stablehlo.multiply %i1, %i : tensor<6xi32>
  return %a, %b, %c, %d : tensor<3x4xf32>, tensor<3x4xf32>, tensor<8xf16>, tensor<6xi32>
}""", {"stablehlo.multiply": 0, "stablehlo.constant": 0}),
    "int_zero": ("""
func.func @main(%x: tensor<16xi32>) -> (tensor<16xi32>, tensor<16xi32>, tensor<16xi32>) {
  %z = stablehlo.constant dense<0> : tensor<i32>
  %zeros = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<i32>) -> tensor<16xi32>
  %a = stablehlo.add %x, %zeros : tensor<16xi32>
  %b = stablehlo.add %zeros, %x : tensor<16xi32>
  %c = stablehlo.subtract %x, %zeros : tensor<16xi32>
  return %a, %b, %c : tensor<16xi32>, tensor<16xi32>, tensor<16xi32>
}""", {"stablehlo.add": 0, "stablehlo.subtract": 0}),
    "float_signed_zero": ("""
func.func @main(%x: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) {
  %neg = stablehlo.constant dense<-0.0> : tensor<16xf32>
  %pos = stablehlo.constant dense<0.0> : tensor<16xf32>
  %a = stablehlo.add %x, %neg : tensor<16xf32>
  %b = stablehlo.add %neg, %x : tensor<16xf32>
  %c = stablehlo.subtract %x, %pos : tensor<16xf32>
  return %a, %b, %c : tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
}""", {"stablehlo.add": 0, "stablehlo.subtract": 0}),
    "broadcast_broadcast": ("""
func.func @main(%x: tensor<3x1xf32>) -> tensor<2x3x4x5xf32> {
  %a = stablehlo.broadcast_in_dim %x, dims = [1, 0] : (tensor<3x1xf32>) -> tensor<1x3x5xf32>
  %b = stablehlo.broadcast_in_dim %a, dims = [0, 1, 3] : (tensor<1x3x5xf32>) -> tensor<2x3x4x5xf32>
  return %b : tensor<2x3x4x5xf32>
}""", {"stablehlo.broadcast_in_dim": 1}),
    "reshape_reshape": ("""
func.func @main(%x: tensor<2x6xf32>) -> (tensor<4x3xf32>, tensor<2x6xf32>, tensor<12xf32>) {
  %a = stablehlo.reshape %x : (tensor<2x6xf32>) -> tensor<12xf32>
  %b = stablehlo.reshape %a : (tensor<12xf32>) -> tensor<3x4xf32>
  %c = stablehlo.reshape %b : (tensor<3x4xf32>) -> tensor<4x3xf32>
  %d = stablehlo.reshape %b : (tensor<3x4xf32>) -> tensor<2x6xf32>
  return %c, %d, %a : tensor<4x3xf32>, tensor<2x6xf32>, tensor<12xf32>
}""", {"stablehlo.reshape": 2}),
    "transpose_transpose": ("""
func.func @main(%x: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<4x2x3xf32>) {
  %a = stablehlo.transpose %x, dims = [1, 2, 0] : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
  %b = stablehlo.transpose %a, dims = [2, 0, 1] : (tensor<3x4x2xf32>) -> tensor<2x3x4xf32>
  %c = stablehlo.transpose %x, dims = [1, 0, 2] : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
  %d = stablehlo.transpose %c, dims = [2, 1, 0] : (tensor<3x2x4xf32>) -> tensor<4x2x3xf32>
  return %b, %d : tensor<2x3x4xf32>, tensor<4x2x3xf32>
}""", {"stablehlo.transpose": 1}),
    "convert_same_type": ("""
func.func @main(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf16>) {
  %a = stablehlo.convert %x : tensor<8xf32>
  %b = stablehlo.convert %x : (tensor<8xf32>) -> tensor<8xf16>
  return %a, %b : tensor<8xf32>, tensor<8xf16>
}""", {"stablehlo.convert": 1}),
}


@pytest.mark.parametrize("name", CASES)
def test_rewrites_preserve_bits(name):
    text, counts = CASES[name]
    _check(text, counts)


def test_float_plus_positive_zero_is_kept():
    text = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %pos = stablehlo.constant dense<0.0> : tensor<8xf32>
  %a = stablehlo.add %x, %pos : tensor<8xf32>
  return %a : tensor<8xf32>
}"""
    after = _check(text, {"stablehlo.add": 1})
    [x] = _random_inputs(after, np.random.default_rng(0))
    assert np.signbit(x[0]) and not np.signbit(interpret(after, [x])[0][0])  # -0.0 + 0.0 is +0.0


def test_multiply_by_two_is_kept():
    text = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<8xf32>
  %a = stablehlo.multiply %x, %two : tensor<8xf32>
  return %a : tensor<8xf32>
}"""
    _check(text, {"stablehlo.multiply": 1})


@settings(max_examples=20, deadline=None)
@given(st.permutations(range(3)), st.permutations(range(3)))
def test_transpose_composition(p1, p2):
    shape = (2, 3, 4)
    mid = [shape[p] for p in p1]
    out = [mid[p] for p in p2]
    ty = lambda s: f"tensor<{'x'.join(map(str, s))}xf32>"
    text = f"""
func.func @main(%x: {ty(shape)}) -> {ty(out)} {{
  %a = stablehlo.transpose %x, dims = {list(p1)} : ({ty(shape)}) -> {ty(mid)}
  %b = stablehlo.transpose %a, dims = {list(p2)} : ({ty(mid)}) -> {ty(out)}
  return %b : {ty(out)}
}}"""
    identity = [p1[p] for p in p2] == [0, 1, 2]
    _check(text, {"stablehlo.transpose": 0 if identity else 1})


def test_lowered_jax_function():
    def f(x):
        return (x.reshape(2, 8).reshape(4, 4) * 1.0).T.T.T

    x = _random((16,), np.float32, np.random.default_rng(1))
    before, after = _simplified(jax.jit(f).lower(x).as_text())
    counts = op_counts(after)
    assert counts["stablehlo.reshape"] == 1 and counts["stablehlo.transpose"] == 1, str(after)
    assert counts["stablehlo.multiply"] == 0 and counts["stablehlo.broadcast_in_dim"] == 0, str(after)
    assert_trees_equal([np.asarray(f(x))], interpret(after, [x]))
