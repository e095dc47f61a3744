"""Each structural pass preserves results: reference interpreter (bit-exact) and PJRT (XLA may
fuse a smaller graph differently, so 1e-6 relative) before vs after."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxlib.mlir import ir

import loopfuse
from loopfuse.compile import xla
from loopfuse.run import runtime
from loopfuse.passes.functions import arg_attrs, main_func, result_attrs, string_attr
from loopfuse.passes.vocabulary import ALIAS, STATE
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import AliasState, DropUnusedOutputs, FoldInit, WrapLoop
from loopfuse.compile.trace import trace, with_init
from ir_helpers import interpret
from problems import batch, init_state, mlp_params, train_step


def _traced(keep_aux=None):
    opt = optax.adam(1e-2)
    return trace(train_step(opt), init_state(opt, mlp_params((3, 4, 1))), batch(n=4, d_in=3), {}, keep_aux)


def _inputs(module, seed=0):
    rng = np.random.default_rng(seed)
    with module.context:
        types = [ir.RankedTensorType(t) for t in main_func(module.operation).type.inputs]
        out = []
        for t in types:
            if isinstance(t.element_type, ir.IntegerType):
                out.append(rng.integers(0, 5, size=t.shape).astype(np.int32))
            else:
                out.append(rng.normal(size=t.shape).astype(np.float32))
        return out



def _compile(module):
    """`module` compiled by PJRT with XLA's default options."""
    devices = [jax.devices()[0]]
    return xla.compile_module(str(module), devices, xla.compile_options(devices, {}, shardy=False))


def _pjrt(module, arrays):
    exe = _compile(module)
    args = [jax.device_put(a) for a in arrays]
    return [np.asarray(shards[0]) for shards in exe.execute_sharded(args).disassemble_into_single_device_arrays()]


def _same(run, a, b):
    if run is interpret:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_alias_state_aliases_each_state_leaf_to_its_result():
    """The attribute pairs each state argument with the result of the same leaf, and XLA honours it:
    the compiled executable aliases every state byte (none before the pass)."""
    t = _traced()
    n_state = len(t.state_paths)
    before = runtime.MemoryStats.of(_compile(t.module))
    run_pass(t.module, AliasState())
    f = main_func(t.module.operation)
    aliases = [ir.IntegerAttr(a[ALIAS]).value if ALIAS in a else None for a in arg_attrs(f)]
    assert aliases == list(range(n_state)) + [None] * (len(aliases) - n_state)
    assert [string_attr(a, STATE) for a in arg_attrs(f)[:n_state]] == \
        [string_attr(r, STATE) for r in result_attrs(f)[:n_state]]
    after = runtime.MemoryStats.of(_compile(t.module))
    state_bytes = sum(a.nbytes for a in _inputs(t.module)[:n_state])
    assert before.alias == 0 and after.alias == state_bytes > 0, (before, after)


@pytest.mark.parametrize("run", [interpret, _pjrt])
def test_alias_state_preserves_results_bitwise(run):
    t = _traced()
    arrays = _inputs(t.module)
    before = run(t.module, arrays)
    run_pass(t.module, AliasState())
    after = run(t.module, arrays)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("run", [interpret, _pjrt])
def test_drop_unused_outputs_keeps_the_requested_results_exactly(run):
    """The dropped aux (the gradients and their squares) includes work of its own, which goes too."""
    opt, step = optax.adam(1e-2), train_step(optax.adam(1e-2))

    def with_squares(state, b):
        new_state, aux = step(state, b)
        return new_state, {**aux, "squares": jax.tree_util.tree_map(lambda g: g * g, aux["grads"])}
    t = trace(with_squares, init_state(opt, mlp_params((3, 4, 1))), batch(n=4, d_in=3), {}, ("loss",))
    arrays = _inputs(t.module)
    before = run(t.module, arrays)
    n_ops_before = str(t.module).count(" = stablehlo.")
    run_pass(t.module, DropUnusedOutputs())
    after = run(t.module, arrays)
    kept = [j for j in range(len(before)) if j < len(t.state_paths) or t.aux_kept[j - len(t.state_paths)]]
    assert len(after) == len(kept) < len(before)
    assert str(t.module).count(" = stablehlo.") < n_ops_before
    for j, b in zip(kept, after):
        _same(run, before[j], b)


def test_wrap_loop_equals_k_interpreted_steps():
    t = _traced(keep_aux=("loss",))
    run_pass(t.module, DropUnusedOutputs())
    arrays, n_state, k = _inputs(t.module), len(t.state_paths), 3
    state, losses = arrays[:n_state], []
    for _ in range(k):
        outs = interpret(t.module, state + arrays[n_state:])
        state, losses = outs[:n_state], losses + [outs[n_state]]
    run_pass(t.module, WrapLoop(steps=k))
    looped = interpret(t.module, arrays)
    for a, b in zip(looped[:n_state], state):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(looped[n_state], np.stack(losses))


def test_fold_init_equals_the_loop_interpreted_on_the_inits_state():
    """fold-init's @main on (params, batch) computes, in the reference interpreter, bit for bit what the loop before
    it computes on the state jax.jit of the init makes from them."""
    opt = optax.adam(1e-2)
    params, b = mlp_params((3, 4, 1)), batch(n=4, d_in=3)

    def init(p, _):
        return p, opt.init(p)
    t = with_init(trace(train_step(opt), init_state(opt, params), b, {}, ("loss",), loop=True), init, params, b)
    for p in (DropUnusedOutputs(), WrapLoop(steps=3), AliasState()):
        run_pass(t.module, p)
    looped = interpret(t.module, jax.tree_util.tree_leaves((jax.jit(init)(params, b), b)))
    run_pass(t.module, FoldInit())
    folded = interpret(t.module, jax.tree_util.tree_leaves((params, b)))
    assert len(folded) == len(looped)
    for a, c in zip(folded, looped):
        np.testing.assert_array_equal(a, c)


def test_wrap_loop_complex_aux_history_equals_k_jit_steps():
    """A complex (and a boolean) aux leaf gets a [K] history of its own dtype (issue: a float zero was
    built for the complex history), equal to the aux of K separate jax.jit calls."""
    def step(w, x):
        z = jnp.exp(1j * w) * (x + 2j)
        return w * 0.5 + x, {"z": z, "positive": jnp.all(w > 0)}

    k, w0, x = 4, np.linspace(-1.0, 1.0, 3, dtype=np.float32), np.float32(0.25)
    w, expected = jnp.asarray(w0), []
    jitted = jax.jit(step)
    for _ in range(k):
        w, aux = jitted(w, x)
        expected.append(aux)
    final, history = loopfuse.compile_step(step).loop(k)(jnp.asarray(w0), x)
    assert history["z"].dtype == jnp.complex64 and history["z"].shape == (k, 3)
    np.testing.assert_array_equal(np.asarray(final), np.asarray(w))
    np.testing.assert_allclose(np.asarray(history["z"]), np.stack([a["z"] for a in expected]), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(history["positive"]), np.stack([a["positive"] for a in expected]))


CALLS = """
func.func private @sums(%x: tensor<3xf32>) -> tensor<f32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %s : tensor<f32>
}
func.func private @calls_out(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = stablehlo.custom_call @host(%x) {has_side_effect = true} : (tensor<3xf32>) -> tensor<3xf32>
  return %y : tensor<3xf32>
}
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = func.call @sums(%x) : (tensor<3xf32>) -> tensor<f32>
  %1 = func.call @calls_out(%x) : (tensor<3xf32>) -> tensor<3xf32>
  return %x : tensor<3xf32>
}"""


def test_a_function_is_pure_where_no_op_in_it_has_effects_its_regions_terminators_none():
    """A reduce's region ends in stablehlo.return, a terminator, not an effect: the function of a sum is
    pure and its unused call erased; a call of a function with an effectful custom call stays."""
    from loopfuse.compile.mlir_context import parse_module
    from loopfuse.passes.dead_code import erase_dead_ops, first_effect, pure_callees
    module = parse_module(CALLS)
    pure = pure_callees(module.operation)
    assert pure == {"sums"}
    main = main_func(module.operation)
    effect = first_effect(main.operation, pure)
    assert effect is not None and "calls_out" in str(effect)
    assert erase_dead_ops(main.body.blocks[0], pure) == 1
    assert "@sums(" not in str(main) and "@calls_out(" in str(main)
