"""flatten-update keeps an optax step bit for bit (StableHLO reference interpreter) and really flattens it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.pass_manager import make_pass, run_pass
from loopfuse.passes import FlattenUpdate, PassOptionError
from loopfuse.compile.trace import trace
from ir_helpers import concatenates, interpret, op_counts
from problems import assert_trees_equal

SHAPES = [(3,), (2, 3), (4, 1, 2), (5,), (1,), (2, 2), (3, 4), (6,), (2, 1), (1, 3, 2),
          (7,), (4, 4), (2, 5), (3, 1), (8,), (1, 1), (2, 2, 2), (9,), (3, 3), (5, 2)]
ELEMENTWISE = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide", "stablehlo.sqrt")


def _params(rng: np.random.Generator) -> dict:
    return {f"w{i:02d}": jnp.asarray(rng.standard_normal(s), jnp.float32) for i, s in enumerate(SHAPES)}


def _loss(params, batch):
    x, y = batch
    hidden = jnp.tanh(x @ params["w11"])                 # a matmul: its gradient is not elementwise
    fit = jnp.sum((hidden.sum(1, keepdims=True) * params["w04"] - y) ** 2)
    return fit + sum(jnp.sum(jnp.sin(w) ** 2) for w in jax.tree_util.tree_leaves(params))


def _optax_step(opt):
    def step(state, batch):
        loss, grads = jax.value_and_grad(_loss)(state["params"], batch)
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}

    return step


def _state_and_batch(opt, rng):
    params = _params(rng)
    opt_state = opt.init(params)
    # non-trivial moments and step count, so every term of the update matters
    opt_state = jax.tree_util.tree_map(lambda x: jnp.abs(x + rng.standard_normal(x.shape).astype(x.dtype))
                                       if x.dtype == jnp.float32 else x + 3, opt_state)
    batch = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(5, 4), (5, 1)])
    return {"params": params, "opt": opt_state}, batch




def _flat_args(state, batch) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state) + jax.tree_util.tree_leaves(batch)]


def _per_group_lr():
    """Adam with two learning rates over alternate leaves: updates that differ only in a scalar,
    one group since the scalars become a vector."""
    labels = {f"w{i:02d}": "slow" if i % 2 else "fast" for i in range(len(SHAPES))}
    return optax.multi_transform({"fast": optax.adam(3e-2), "slow": optax.adam(1e-2)}, labels)


@pytest.mark.parametrize("make_opt", [lambda: optax.adam(1e-2), lambda: optax.adamw(1e-2, weight_decay=0.1),
                                      _per_group_lr], ids=["adam", "adamw", "per_group_lr"])
def test_optax_step_bits(make_opt):
    opt = make_opt()
    rng = np.random.default_rng(0)
    state, batch = _state_and_batch(opt, rng)
    traced = trace(_optax_step(opt), state, batch, {}, None)
    text = str(traced.module)
    before, after = parse_module(text), parse_module(text)
    run_pass(after, FlattenUpdate())
    assert after.operation.verify()

    counts, old = op_counts(after), op_counts(before)
    assert counts["stablehlo.concatenate"] >= 3, str(after)  # params, mu, nu (and gradients)
    assert counts["stablehlo.slice"] >= 3 * len(SHAPES)
    assert sum(counts[n] for n in ELEMENTWISE) < sum(old[n] for n in ELEMENTWISE) / 4
    if make_opt is _per_group_lr:  # the two learning rates, one per leaf, as a vector of constants
        assert "stablehlo.concatenate %cst" in str(after)

    for seed in range(3):
        state, batch = _state_and_batch(opt, np.random.default_rng(seed))
        args = _flat_args(state, batch)
        assert_trees_equal(interpret(before, args), interpret(after, args))


# the default run keeps the pass's bits (test_optax_step_bits); this compiles it through compile_step with simplify
@pytest.mark.slow
def test_compile_step_matches_jit(tmp_path):
    opt = optax.adam(1e-2)
    step = _optax_step(opt)
    state, batch = _state_and_batch(opt, np.random.default_rng(1))
    expected_state, expected_aux = jax.jit(step)(state, batch)

    compiled = loopfuse.compile_step(step, passes=["simplify", "flatten-update"], dump_ir=tmp_path)
    new_state, aux = compiled(jax.tree_util.tree_map(jnp.copy, state), batch)
    [final] = tmp_path.glob("*/*-final.mlir")
    assert "stablehlo.concatenate" in final.read_text()
    for e, a in zip(jax.tree_util.tree_leaves((expected_state, expected_aux)),
                    jax.tree_util.tree_leaves((new_state, aux))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-6)


# a big problem: test_optax_step_bits flattens 20 leaves, test_pack_state's test_reference_interpreter_bits
# bounds the trees of concatenates (passes/_concat.py) by default
@pytest.mark.slow
def test_many_leaves_are_one_update():
    """With a thousand leaves the whole Adam update is a handful of flat vectors, made in seconds."""
    opt = optax.adam(1e-3)
    params = {f"w{i:04d}": jnp.zeros(SHAPES[i % len(SHAPES)], jnp.float32) for i in range(1000)}
    state = {"params": params, "opt": opt.init(params)}

    def step(state, grads):
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {}

    module = trace(step, state, params, {}, None).module
    run_pass(module, FlattenUpdate())
    counts = op_counts(module)
    assert concatenates(module) == (4, 16), counts   # gradients, mu, nu, params: trees of <= 16 operands each
    assert counts["stablehlo.sqrt"] == 1 and counts["stablehlo.divide"] == 3, counts


def test_min_group_option():
    text = """
func.func @main(%a: tensor<2xf32>, %b: tensor<3xf32>) -> (tensor<2xf32>, tensor<3xf32>) {
  %x = stablehlo.negate %a : tensor<2xf32>
  %y = stablehlo.negate %b : tensor<3xf32>
  return %x, %y : tensor<2xf32>, tensor<3xf32>
}"""
    module = parse_module(text)
    run_pass(module, FlattenUpdate(min_group=3))
    assert op_counts(module)["stablehlo.concatenate"] == 0
    run_pass(module, FlattenUpdate(min_group=2))
    assert op_counts(module)["stablehlo.concatenate"] == 1
    with pytest.raises(PassOptionError, match="pass 'flatten-update' option 'min-group': must be >= 2, got 1"):
        FlattenUpdate(min_group=1)
    with pytest.raises(PassOptionError, match="pass 'flatten-update' option 'min-group': expects int, got True"):
        FlattenUpdate(min_group=True)
    with pytest.raises(PassOptionError, match="option 'min_group': no such option .*: min-group"):
        make_pass("flatten-update", "min_group=2")
