"""pack-state moves values, never changes them: wrap-loop's loop with packed state computes bitwise what
it computed before (StableHLO reference interpreter), and loopfuse's loop(K) with ``passes=["pack-state"]``
equals K ``jax.jit`` steps bitwise for the common optax optimizers and the differential corpus, but for the
cases XLA compiles to other last bits (tolerances below, measured). flatten=true is exact in the IR, within
FLATTEN_RTOL after XLA."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.compile import pipeline
from loopfuse.state import packed
from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import PackState, WrapLoop
from loopfuse.compile.trace import trace
from corpus import PROGRAMS, marked
from ir_helpers import concatenates, interpret, op_counts
from problems import NEWER_XLA, assert_trees_close, assert_trees_equal, batch, fresh, init_state, mlp_params, train_step

K = 3
OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=0.1),
    "sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "lion": lambda: optax.lion(1e-3),
    "rmsprop": lambda: optax.rmsprop(1e-2),
    "schedule": lambda: optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
}
# The default run's optimizers: momentum (a trace, no count) and inject_hyperparams (Adam's moments and
# count, 0-d hyperparameters and a second count). The others, slow, lay their state out as these do: Adam
# and AdamW as inject_hyperparams' inner state, Lion as that less nu, RMSProp as momentum, the schedule
# as Adam with a second count (plain Adam runs by default in the corpus programs and clipped Adam).
OPTIMIZER_NAMES = marked(OPTIMIZERS, slow=("adam", "adamw", "lion", "rmsprop", "schedule"))
CLIP = lambda: optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2))  # noqa: E731
# XLA compiles the packed clipped-Adam loop to other last bits (the pass is exact: see
# test_reference_interpreter_bits); measured: 1 ulp on two 1-element leaves after 3 steps.
CLIP_RTOL = 1e-6
# XLA compiles these packed loops to other last bits: the RNN (measured: 1.2e-6 relative), and with
# jax 0.12 the sort/top-k fit's Adam update (1.4e-7 relative after 3 steps; its aux bitwise). Both are in
# corpus.DEFAULT: the default run holds these tolerances.
CORPUS_RTOL = {"rnn": 1e-5, "sort_top_k": 1e-6}
# With flatten=true XLA compiles the flat update to other last bits on Adam, inject_hyperparams and
# clipped Adam (measured: up to 2e-7 relative after 3 steps), and the corpus RNN and transformer (the
# rewrite is exact: see test_reference_interpreter_bits).
FLATTEN_RTOL, FLATTEN_ATOL = 1e-5, 1e-7
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


def _interpretable(text: str) -> str:
    """`text` with chlo.square (which the reference interpreter lacks) written as the multiply it is."""
    return re.sub(r"chlo.square (%[\w#]+) : (tensor<[^>]*>) -> tensor<[^>]*>", r"stablehlo.multiply \1, \1 : \2", text)


def _with_and_without(traced, pass_: PackState):
    """`traced`'s module (made interpretable) after wrap-loop, and after wrap-loop and `pass_`, verified."""
    text = _interpretable(str(traced.module))
    plain, rewritten = parse_module(text), parse_module(text)
    run_pass(plain, WrapLoop(steps=K))
    run_pass(rewritten, WrapLoop(steps=K))
    run_pass(rewritten, pass_)
    assert rewritten.operation.verify()
    return plain, rewritten


@pytest.mark.parametrize("flatten", [False, True], ids=["pack", "pack+flatten"])
@pytest.mark.parametrize("make_opt", [OPTIMIZERS["adam"], OPTIMIZERS["sgd_momentum"], CLIP], ids=["adam", "sgd", "clip"])
def test_reference_interpreter_bits(make_opt, flatten):
    """wrap-loop + pack-state equals wrap-loop alone on the StableHLO reference interpreter."""
    opt = make_opt()
    traced, state = _traced(opt)
    plain, packed = _with_and_without(traced, PackState(flatten=flatten))
    counts, old = op_counts(packed), op_counts(plain)
    if flatten:  # the update runs once over the buffer: far fewer elementwise ops
        assert counts["stablehlo.multiply"] < 0.75 * old["stablehlo.multiply"]
    else:  # the f32 leaves (Adam's 21), before the loop and returned by the step (one i32 count: not
        # packed), each concatenated as a tree of at most 16 operands per concatenate (passes/_concat.py)
        roots, widest = concatenates(packed)
        assert roots == 2 and widest <= 16
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, batch()))]
    assert_trees_equal(interpret(plain, args), interpret(packed, args))


@pytest.mark.parametrize("flatten", [False, True], ids=["pack", "pack+flatten"])
def test_caller_packed_state_reference_interpreter_bits(flatten):
    """A state packed by the caller (`loopfuse.pack`): with flatten=true the loop carries the
    buffers' leaves, which pack-state groups again per role (as `pack`'s buffers, one per mirrored
    subtree, nearly are already); without, the buffers as they are. The same values as wrap-loop
    alone on the StableHLO reference interpreter."""
    opt = OPTIMIZERS["adam"]()
    state = loopfuse.pack(init_state(opt, PARAMS))
    traced = trace(packed.on_packed(train_step(opt), state.layout), state, batch(), {}, None)
    plain, rewritten = _with_and_without(traced, PackState(flatten=flatten))
    main = str(rewritten).split("@main(")[1]
    before, after = main.split("stablehlo.while")
    if flatten:  # `pack` put the params, mu and nu in buffers of their own: the params' enters whole; mu and nu
        # give up their 0-d leaf (PARAMS' scale: a 0-d update is no flat chain) to the params' group
        assert "stablehlo.slice %arg0" not in before and after.count("stablehlo.concatenate") == 2
    else:
        assert "stablehlo.slice" not in before and "stablehlo.concatenate" not in after
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, batch()))]
    assert_trees_equal(interpret(plain, args), interpret(rewritten, args))


def test_flatten_rewrites_only_the_update():
    """flatten=true leaves the forward pass per leaf (on slices of the parameters' buffer) and gives
    each of Adam's moments a buffer of its own: the structure of a hand-written ``ravel_pytree`` step
    (BENCHMARKS.md, "Packed state through the device loop")."""
    traced, _ = _traced(OPTIMIZERS["adam"]())
    plain, packed = parse_module(str(traced.module)), parse_module(str(traced.module))
    for module in (plain, packed):
        run_pass(module, WrapLoop(steps=K))
    run_pass(packed, PackState(flatten=True))
    counts, old = op_counts(packed), op_counts(plain)
    assert counts["stablehlo.sqrt"] < old["stablehlo.sqrt"]  # Adam's update runs flat
    for name in ("stablehlo.reduce", "stablehlo.dot_general", "stablehlo.tanh"):
        assert counts[name] == old[name]
    main = str(packed).split("@main(")[1]
    assert main.count("stablehlo.concatenate") == 3  # the parameters, mu, nu: packed once before the loop


def test_flatten_recomputes_an_elementwise_gradient():
    """A per-leaf loss whose gradient is elementwise in the leaf (``mean((p - t) ** 2)``, leaves of
    several shapes): with flatten=true the update chain gets its own copy of ``p - t`` (the loss
    reads it too), so the gradient is computed once over the parameters' buffer and the targets
    concatenated, each leaf's 1/n a vector: no per-leaf gradient is left to concatenate. The same
    values as wrap-loop alone on the StableHLO reference interpreter."""
    opt = optax.adam(1e-2)
    rng = np.random.default_rng(0)
    shapes = [(3,), (2, 3), (4, 1), (5,), (1,), (2, 2)]
    params = {f"p{i}": jnp.asarray(rng.standard_normal(s), jnp.float32) for i, s in enumerate(shapes)}
    targets = {k: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for k, v in params.items()}

    def step(state, t):
        p, o = state
        loss, grads = jax.value_and_grad(lambda p: sum(jnp.mean((p[k] - t[k]) ** 2) for k in p))(p)
        updates, o = opt.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), loss

    state = (params, opt.init(params))
    plain, rewritten = _with_and_without(trace(step, state, targets, {}, None), PackState(flatten=True))
    body = str(rewritten).split("@loopfuse_step(")[1].split("func.func")[0]
    total = sum(int(np.prod(s)) for s in shapes)
    targets_flat = re.search(rf"(%\d+) = stablehlo.concatenate %arg1, .*-> tensor<{total}xf32>", body)
    assert targets_flat and re.search(rf"stablehlo.subtract %arg\d+, {targets_flat[1]} : tensor<{total}xf32>", body)
    assert body.count("stablehlo.concatenate") == 2, body  # the targets, the 1/n: the buffers are flat results
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, targets))]
    assert_trees_equal(interpret(plain, args), interpret(rewritten, args))


def test_flatten_leaves_large_leaves_alone():
    """flatten=true flattens only the update chains of leaves within max-leaf-elements: a large
    leaf, which is not packed, keeps its own update, reading and writing it in place (concatenating
    the large leaves' alike updates copied them all every step: on the GPT model, its attention
    weights', 124 more kernels and a slower step, BENCHMARKS.md). The same values as wrap-loop
    alone on the StableHLO reference interpreter."""
    traced, state = _traced(OPTIMIZERS["adam"]())   # PARAMS: w of 64 and 128 elements, then leaves of <= 16
    plain, rewritten = _with_and_without(traced, PackState(flatten=True, max_leaf_elements=16))
    step = str(rewritten).split("@loopfuse_step(")[1].split("func.func")[0]
    sqrts = re.findall(r"stablehlo.sqrt %\d+ : (tensor<[^>]*>)", step)   # Adam's, and the 0-d scale's
    assert sorted(sqrts) == ["tensor<16x8xf32>", "tensor<33xf32>", "tensor<4x16xf32>", "tensor<f32>"], sqrts
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, batch()))]
    assert_trees_equal(interpret(plain, args), interpret(rewritten, args))


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


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_flatten_within_tolerance(name):
    opt = OPTIMIZERS[name]()
    fn, state, data = train_step(opt), init_state(opt, PARAMS), batch()
    got = loopfuse.compile_step(fn, passes=["pack-state{flatten=true}"], keep_aux=("loss",)).loop(K)(fresh(state), data)
    want = _jit_steps(fn, fresh(state), data)
    assert_trees_close(got[0], want[0], rtol=FLATTEN_RTOL, atol=FLATTEN_ATOL)
    assert_trees_close(got[1]["loss"], want[1]["loss"], rtol=FLATTEN_RTOL, atol=FLATTEN_ATOL)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_loop_equals_jit_steps(name):
    opt = OPTIMIZERS[name]()
    fn, state, data = train_step(opt), init_state(opt, PARAMS), batch()
    loop = loopfuse.compile_step(fn, passes=["pack-state"], keep_aux=("loss",)).loop(K)
    stages = loop.lower(state, data)
    assert "stablehlo.concatenate" not in stages["00-traced"] and "stablehlo.concatenate" in stages["final"]
    got_state, got_aux = loop(fresh(state), data)
    want_state, want_aux = _jit_steps(fn, fresh(state), data)
    if NEWER_XLA:   # jaxlib 0.11+'s XLA fuses the packed loop to other last bits (Lion, RMSProp): opt-in, 1e-5
        assert_trees_close((got_state, got_aux["loss"]), (want_state, want_aux["loss"]), rtol=FLATTEN_RTOL,
                           atol=FLATTEN_ATOL)
        return
    assert_trees_equal(got_state, want_state)
    assert_trees_equal(got_aux["loss"], want_aux["loss"])


def test_clipped_adam_within_tolerance():
    """Global-norm clipping (per-leaf reduction order kept) is exact in the IR but not bitwise after
    XLA: within CLIP_RTOL of K jax.jit steps."""
    opt = CLIP()
    fn, state, data = train_step(opt), init_state(opt, PARAMS), batch()
    got = loopfuse.compile_step(fn, passes=["pack-state"], keep_aux=("loss",)).loop(K)(fresh(state), data)
    want = _jit_steps(fn, fresh(state), data)
    rtol = FLATTEN_RTOL if NEWER_XLA else CLIP_RTOL
    assert_trees_close(got[0], want[0], rtol=rtol, atol=0.0)
    assert_trees_close(got[1]["loss"], want[1]["loss"], rtol=rtol, atol=0.0)


@pytest.mark.parametrize("name", marked())
def test_corpus_loop_with_packing_equals_default(name):
    """Every corpus program's loop(K) with packing equals the default loop(K) (itself checked against
    ``jax.jit`` by test_corpus.py) bitwise, but those in CORPUS_RTOL, which are within that tolerance."""
    p = PROGRAMS[name]()
    got = loopfuse.compile_step(p.fn, passes=["pack-state"]).loop(K)(fresh(p.state), p.batch)
    want = loopfuse.compile_step(p.fn).loop(K)(fresh(p.state), p.batch)
    if name in CORPUS_RTOL:
        assert_trees_close(got, want, rtol=CORPUS_RTOL[name], atol=0.0)
    else:
        assert_trees_equal(got, want)


@pytest.mark.parametrize("name", marked())
def test_corpus_loop_with_flatten_within_tolerance(name):
    """flatten=true on every corpus program: within FLATTEN_RTOL (and 1e-6 absolute) of the default
    loop(K) (measured: the RNN 1.2e-6 relative, the transformer 2.1e-7 absolute on one small element with
    jax 0.12, batchnorm in last bits, the others bitwise)."""
    p = PROGRAMS[name]()
    got = loopfuse.compile_step(p.fn, passes=["pack-state{flatten=true}"]).loop(K)(fresh(p.state), p.batch)
    want = loopfuse.compile_step(p.fn).loop(K)(fresh(p.state), p.batch)
    assert_trees_close(got, want, rtol=FLATTEN_RTOL, atol=1e-6)
