"""cond-to-select computes what the case computed: each case of its lit test under the reference interpreter,
bitwise, at every index (a boolean's two values; an integer's 0, 1 and two out of range). XLA may round the ops
moved out of a branch otherwise (fused with their neighbours), so it runs with roll-layers, opt-in, and where no
layers roll roll-layers puts the cases back as they were."""
import itertools
from pathlib import Path

import jax
import numpy as np
from jaxlib.mlir import ir

from corpus import PROGRAMS
from ir_helpers import interpret, lit_cases
import loopfuse
from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import CondToSelect, RollLayers
from loopfuse.passes.cond_to_select import Selects
from loopfuse.passes.functions import main_func
from problems import fresh

LIT = Path(__file__).resolve().parents[1] / "lit" / "cond-to-select.mlir"
INDICES = {1: [np.bool_(False), np.bool_(True)], 32: [np.int32(i) for i in (-1, 0, 1, 5)]}


def test_the_lit_cases_select_what_the_case_computes_in_the_reference_interpreter():
    rng = np.random.default_rng(0)
    for case, text in lit_cases(LIT):
        module, selected = parse_module(text), parse_module(text)
        run_pass(selected, CondToSelect())
        assert ("stablehlo.case" in str(selected)) == ("CHECK: \"stablehlo.case\"" in case)
        with module.context:
            types = [ir.RankedTensorType(t) for t in main_func(module.operation).type.inputs]
        choices = [INDICES[t.element_type.width] if isinstance(t.element_type, ir.IntegerType)
                   else [rng.normal(size=t.shape).astype(np.float32)] for t in types]
        for args in itertools.product(*choices):
            for got, expected in zip(interpret(selected, list(args)), interpret(module, list(args)), strict=True):
                assert got.tobytes() == expected.tobytes()


def test_where_no_layers_roll_the_cases_are_put_back_as_they_were():
    """roll-layers makes the cases selects first, so that an update in a cond lines up layer by layer, and
    puts them back where nothing rolls: a step left as traced compiles as jax.jit's (the cond of the corpus'
    cond_switch, its sums fused with other ops once made selects, differed in a last bit)."""
    for _, text in lit_cases(LIT):
        module, rolled, undone = parse_module(text), parse_module(text), parse_module(text)
        run_pass(rolled, RollLayers(force=True))
        with undone.context:
            selects = Selects(main_func(undone.operation))
            assert len(selects) == (0 if "dot_general" in text else text.count('"stablehlo.case"'))
            selects.undo()
        for other in (rolled, undone):
            assert str(main_func(other.operation)) == str(main_func(module.operation))


def test_xla_rounds_the_corpus_cond_made_selects_in_another_last_bit():
    """The case where the pass is unsafe as a default: the corpus' cond_switch (a cond of sums, jax's transpose of
    it in the backward pass) over three steps in one loop; made selects, one state leaf differs in a last bit
    from the loop as traced (within 1e-6 of the leaf's largest element: jaxlib 0.12.1, which runs this loop as one
    kernel, 2.4e-6 relative on an element 0.004), where the reference interpreter computes the same bits."""
    p = PROGRAMS["cond_switch"]()
    selected = loopfuse.compile_step(p.fn, passes="cond-to-select").loop(3)(fresh(p.state), p.batch)
    traced = loopfuse.compile_step(p.fn).loop(3)(fresh(p.state), p.batch)
    pairs = list(zip(jax.tree_util.tree_leaves(selected), jax.tree_util.tree_leaves(traced)))
    assert not all(np.array_equal(a, b) for a, b in pairs)
    for a, b in pairs:
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.max(np.abs(b)))
