"""The canonicalization patterns (passes/canonicalize.py) keep every value bit for bit (StableHLO
reference interpreter) and really rewrite; the walk-driver fallback gives the greedy driver's IR."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from loopfuse.compile.mlir_context import parse_module
from loopfuse.passes import _mlir_compat
from loopfuse.passes.canonicalize import fold_slices
from loopfuse.passes.functions import main_func
from ir_helpers import interpret, op_counts
from problems import assert_trees_equal

PACKED = """
func.func @main(%p: tensor<9xf32>, %q: tensor<4xf32>) -> (tensor<13xf32>, tensor<2x3xf32>) {
  %0 = stablehlo.slice %p [0:6] : (tensor<9xf32>) -> tensor<6xf32>
  %w = stablehlo.reshape %0 : (tensor<6xf32>) -> tensor<2x3xf32>
  %b = stablehlo.slice %p [6:9] : (tensor<9xf32>) -> tensor<3xf32>
  %w1 = stablehlo.reshape %w : (tensor<2x3xf32>) -> tensor<6xf32>
  %q0 = stablehlo.slice %q [0:4] : (tensor<4xf32>) -> tensor<4xf32>
  %1 = stablehlo.concatenate %w1, %b, %q0, dim = 0 : (tensor<6xf32>, tensor<3xf32>, tensor<4xf32>) -> tensor<13xf32>
  return %1, %w : tensor<13xf32>, tensor<2x3xf32>
}"""


def _folded(text: str):
    before, after = parse_module(text), parse_module(text)
    fold_slices(after.operation)
    assert after.operation.verify()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(t.shape).astype(np.float32) for t in main_func(before.operation).type.inputs]
    assert_trees_equal(interpret(before, args), interpret(after, args))
    return after


def test_a_packed_buffer_cut_and_joined_again_is_the_buffer():
    after = _folded(PACKED)
    counts = op_counts(after)
    # the concatenate is %p and %q (whole slices fold too); the 2x3 leaf is still read, as a slice reshaped
    assert (counts["stablehlo.concatenate"], counts["stablehlo.slice"], counts["stablehlo.reshape"]) == (1, 1, 1), str(after)
    assert "stablehlo.concatenate %arg0, %arg1, dim = 0" in str(after)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_any_cut_of_rows_joined_keeps_every_element(data):
    """A concatenate of pieces of whole rows of one 6x2 tensor, in an order with runs and gaps,
    each piece reshaped to 1-D or not: the fold keeps the values, and a run in order is one slice."""
    cuts = sorted(data.draw(st.sets(st.integers(1, 5), max_size=4)))
    bounds = list(zip([0, *cuts], [*cuts, 6]))
    order = data.draw(st.permutations(range(len(bounds))))
    lines, names = [], []
    for n, k in enumerate(order):
        a, b = bounds[k]
        lines.append(f"%s{n} = stablehlo.slice %x [{a}:{b}, 0:2] : (tensor<6x2xf32>) -> tensor<{b - a}x2xf32>")
        lines.append(f"%r{n} = stablehlo.reshape %s{n} : (tensor<{b - a}x2xf32>) -> tensor<{2 * (b - a)}xf32>")
        names.append(f"%r{n}")
    types = ", ".join(f"tensor<{2 * (bounds[k][1] - bounds[k][0])}xf32>" for k in order)
    text = f"""
func.func @main(%x: tensor<6x2xf32>) -> tensor<12xf32> {{
  {chr(10).join(lines)}
  %c = stablehlo.concatenate {", ".join(names)}, dim = 0 : ({types}) -> tensor<12xf32>
  return %c : tensor<12xf32>
}}"""
    after = _folded(text)
    runs = 1 + sum(b != a + 1 for a, b in zip(order, order[1:]))
    counts = op_counts(after)
    assert counts["stablehlo.concatenate"] == (runs > 1), str(after)
    assert counts["stablehlo.slice"] == (runs if runs > 1 else 0), str(after)


def test_the_walk_driver_fallback_gives_the_same_ir(monkeypatch):
    greedy = parse_module(PACKED)
    fold_slices(greedy.operation)
    monkeypatch.setattr(_mlir_compat, "_no_folding", lambda api: None)
    walked = parse_module(PACKED)
    fold_slices(walked.operation)
    assert str(walked) == str(greedy)


def test_the_no_folding_configuration_fails_its_self_test_where_the_driver_would_hoist_constants():
    api = _mlir_compat.rewrite()
    assert _mlir_compat._no_folding(api) is not None
    with pytest.raises(AssertionError, match="the pattern saw"):
        _mlir_compat._test_rewrite(api, api.GreedyRewriteConfig())   # the default: folding and constant CSE on
