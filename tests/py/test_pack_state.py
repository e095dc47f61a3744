"""pack-state moves values, never changes them: wrap-loop's loop with packed state computes bitwise what
it computed before (StableHLO reference interpreter), and loopfuse's loop(K) with ``passes=["pack-state"]``
equals K ``jax.jit`` steps bitwise for the common optax optimizers and the differential corpus."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import pipeline
from loopfuse.mlir_context import parse_module
from loopfuse.pass_manager import run_pass
from loopfuse.passes import PackState, WrapLoop
from loopfuse.trace import trace
from corpus import PROGRAMS
from ir_helpers import interpret, op_counts
from problems import assert_trees_equal, batch, fresh, init_state, mlp_params, train_step

K = 3
OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=0.1),
    "sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "lion": lambda: optax.lion(1e-3),
    "rmsprop": lambda: optax.rmsprop(1e-2),
    "schedule": lambda: optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
    "global_norm_clip": lambda: optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2)),
}
PARAMS = mlp_params((4, 16, 8, 1))  # leaves of 1 to 64 elements, plus a 0-d scale


def _jit_steps(fn, state, data, k=K):
    """k ``jax.jit`` steps, aux stacked as loop(k) returns it."""
    step, auxes = jax.jit(fn), []
    for _ in range(k):
        state, aux = step(state, data)
        auxes.append(aux)
    return state, jax.tree_util.tree_map(lambda *rows: jnp.stack(rows), *auxes)


def _traced(opt):
    state = init_state(opt, PARAMS)
    return trace(train_step(opt), state, batch(), {}, None), state


@pytest.mark.parametrize("name", ["adam", "sgd_momentum"])
def test_reference_interpreter_bits(name):
    """wrap-loop + pack-state equals wrap-loop alone on the StableHLO reference interpreter."""
    opt = OPTIMIZERS[name]()
    traced, state = _traced(opt)
    plain, packed = parse_module(str(traced.module)), parse_module(str(traced.module))
    run_pass(plain, WrapLoop(steps=K))
    run_pass(packed, WrapLoop(steps=K))
    run_pass(packed, PackState())
    assert packed.operation.verify()
    counts = op_counts(packed)
    assert counts["stablehlo.concatenate"] == 2  # the f32 leaves, before the loop and in its body (one i32 count)
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, batch()))]
    assert_trees_equal(interpret(plain, args), interpret(packed, args))


def test_threshold_and_min_group():
    """Leaves over max-leaf-elements stay separate; an element type with fewer than min-group leaves too."""
    traced, _ = _traced(OPTIMIZERS["adam"]())
    module = parse_module(str(traced.module))
    run_pass(module, WrapLoop(steps=K))
    run_pass(module, PackState(max_leaf_elements=16, min_group=2))
    text = str(module)
    concat = [line for line in text.splitlines() if "stablehlo.concatenate" in line]
    assert len(concat) == 2 and "4x16" in text.split("stablehlo.while")[1].split("\n")[0]
    assert all("64xf32" not in line and "128xf32" not in line for line in concat)  # the 4x16 and 16x8 weights stay out
    module = parse_module(str(traced.module))
    run_pass(module, WrapLoop(steps=K))
    before = str(module)
    run_pass(module, PackState(min_group=1000))
    assert str(module) == before


def test_without_a_loop_nothing_changes():
    traced, _ = _traced(OPTIMIZERS["adam"]())
    module = parse_module(str(traced.module))
    run_pass(module, PackState())
    assert str(module) == str(traced.module)


def test_pipeline_runs_it_after_wrap_loop():
    names = [p.name for p in pipeline.build(["pack-state", "simplify"], steps=4)]
    assert names == ["drop-unused-outputs", "simplify", "wrap-loop", "pack-state", "alias-state"]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_loop_equals_jit_steps(name):
    opt = OPTIMIZERS[name]()
    fn, state, data = train_step(opt), init_state(opt, PARAMS), batch()
    loop = loopfuse.compile_step(fn, passes=["pack-state"], keep_aux=("loss",)).loop(K)
    stages = loop.lower(state, data)
    assert "stablehlo.concatenate" not in stages["00-traced"] and "stablehlo.concatenate" in stages["final"]
    got_state, got_aux = loop(fresh(state), data)
    want_state, want_aux = _jit_steps(fn, fresh(state), data)
    assert_trees_equal(got_state, want_state)
    assert_trees_equal(got_aux["loss"], want_aux["loss"])


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_corpus_loop_with_packing_equals_default(name):
    """Every corpus program's loop(K) with packing equals the default loop(K) (itself checked against
    ``jax.jit`` by test_corpus.py) bitwise."""
    p = PROGRAMS[name]()
    got = loopfuse.compile_step(p.fn, passes=["pack-state"]).loop(K)(fresh(p.state), p.batch)
    assert_trees_equal(got, loopfuse.compile_step(p.fn).loop(K)(fresh(p.state), p.batch))
