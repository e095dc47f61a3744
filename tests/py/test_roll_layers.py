"""roll-layers (``compile_step(..., memory_budget=b)``): repeated layers run as a forward and a backward
loop over stacked leaves.

The rolled program computes the same ops on the same values as the unrolled one: under the StableHLO
reference interpreter the two are bitwise equal. XLA compiles the loop bodies to other last bits
than the unrolled program (and than the hand-written stacked scan with ``jax.checkpoint``), so against
``jax.jit`` the tests hold a stated tolerance: every state leaf within `RTOL` of its largest value plus
`ATOL`. Adam divides a gradient that is zero but for rounding (a key bias's under softmax) by its
own size, so such a parameter moves by the learning rate times rounding noise over Adam's epsilon,
wherever the rounding differs (jax.jit and the hand-written scan differ there by as much); the tests
that compare states use Adam with `EPS`, which keeps that noise at rounding size."""
import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxlib.mlir import ir

import layered
import loopfuse
import transformer
from ir_helpers import interpret, lit_cases
from loopfuse.compile import cache
from loopfuse.memory import xla_dump
from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.pass_manager import run_pass
from loopfuse.passes import MicroBatch, RollLayers, rewriter
from loopfuse.passes.functions import main_func
from loopfuse.passes.module_pass import reports
from corpus import PROGRAMS
from problems import assert_trees_equal, fresh

RTOL, ATOL = 1e-5, 1e-6     # rolled against jax.jit, after a few steps: see the module docstring
EPS = 1e-5                   # Adam's epsilon in the tests that compare states
SMALL = dict(layers=4, width=32, heads=2, seq=16, batch=4, vocab=64)


def leaves_close(a, b, atol=ATOL) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        np.testing.assert_array_less(np.abs(x - y), RTOL * np.max(np.abs(y)) + atol)


def run(call, state, batch, steps: int):
    for _ in range(steps):
        state, aux = call(state, batch)
    return state, aux


def run_losses(call, state, batch, steps: int) -> list:
    out = []
    for _ in range(steps):
        state, aux = call(state, batch)
        out.append(float(aux["loss"]))
    return out


def rolled(step, **kw):
    return loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, **kw)


def report(step, state, batch) -> str:
    """roll-layers' report for `step` on (state, batch): the passes only, no XLA compile."""
    return reports(parse_module(step.lower(state, batch)["final"]).operation).get("roll-layers", "")


# 0.0 is held to jax.jit by test_roll_models' GPTs (check_rolls): slow here; 0.5 (activations also saved per
# layer) by nothing else in the default run
@pytest.mark.parametrize("budget", [pytest.param(0.0, marks=pytest.mark.slow), 0.5])
def test_rolled_equals_unrolled_in_the_reference_interpreter(budget):
    step, state, tokens = transformer.gpt(**transformer.TINY, onehot=True)   # see gpt(onehot=)
    forced = loopfuse.compile_step(step, keep_aux=("loss",), donate=False,
                                   passes=f"roll-layers{{force=true memory-budget={budget}}}")
    stages = forced.lower(state, tokens)
    plain = loopfuse.compile_step(step, keep_aux=("loss",), donate=False).lower(state, tokens)
    assert "stablehlo.while" in stages["final"] and "stablehlo.while" not in plain["final"]
    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((state, tokens))]
    got = interpret(parse_module(stages["final"]), args)
    expected = interpret(parse_module(plain["final"]), args)
    assert len(got) == len(expected)
    for x, y in zip(got, expected):
        assert x.tobytes() == y.tobytes()


LIT = Path(__file__).resolve().parents[1] / "lit"


@pytest.mark.parametrize("name", ["roll-layers", "roll-layers-parts", "roll-layers-stacks", "roll-layers-stacks-jax12",
                                  "roll-layers-rms", "roll-layers-norm", "roll-layers-update-after",
                                  "roll-layers-labels"])
def test_the_lit_cases_rolled_equal_their_input_in_the_reference_interpreter(name):
    """Each case of the roll-layers lit tests (forced to roll; the one that does not roll too) computes,
    under the reference interpreter, bitwise what the traced step it rolls computes: the sum of a leaf
    every layer reads kept in the backward loop's carry (case d), one layer's value kept in a carry
    (case e), an encoder's and a cross-attending decoder's stacks, ..."""
    rng = np.random.default_rng(0)
    for case, text in lit_cases(LIT / f"{name}.mlir"):
        module = parse_module(text)
        rolled = parse_module(text)
        run_pass(rolled, RollLayers(force=True))
        expected_loops = any(line.startswith("// CHECK:") and "stablehlo.while" in line for line in case.splitlines())
        assert ("stablehlo.while" in str(rolled)) == expected_loops
        args = [rng.normal(size=ir.RankedTensorType(t).shape).astype(np.float32)
                for t in main_func(module.operation).type.inputs]
        for got, expected in zip(interpret(rolled, args), interpret(module, args), strict=True):
            assert got.tobytes() == expected.tobytes()


def test_the_micro_batch_lit_cases_rolled_equal_micro_batch_alone_in_the_reference_interpreter():
    """Each case of roll-layers-micro-batch.mlir, micro-batched and then rolled (the layers inside the micro-batch
    loop, the update of a packed state after it: case c), computes under the reference interpreter bitwise what
    the micro-batched step computes (micro-batch reassociates the slices' sums; roll-layers changes no value)."""
    rng = np.random.default_rng(0)
    for _, text in lit_cases(LIT / "roll-layers-micro-batch.mlir"):
        sliced, rolled = parse_module(text), parse_module(text)
        run_pass(sliced, MicroBatch(slices=2))
        for p in (MicroBatch(slices=2), RollLayers(force=True)):
            run_pass(rolled, p)
        args = [rng.normal(size=ir.RankedTensorType(t).shape).astype(np.float32)
                for t in main_func(sliced.operation).type.inputs]
        for got, expected in zip(interpret(rolled, args), interpret(sliced, args), strict=True):
            assert got.tobytes() == expected.tobytes()


def stack_copies(folder: Path, block: dict, layers: int) -> list[str]:
    """The copies of a stack of `block`'s leaves (`layers` rows) in the entry computation of the
    optimized program XLA dumped into `folder`."""
    files = xla_dump.module_files(folder)
    hlo = xla_dump.hlo_module(files["hlo"].read_text())
    shapes = {b.instruction: b.shape.split("]")[0].split("[")[-1] for b in
              xla_dump.buffer_assignment(files["buffers"].read_text()).values()}
    stacks = {",".join(map(str, (layers, *x.shape))) for x in jax.tree_util.tree_leaves(block)}
    return [f"{n} = copy{hlo.instructions[n].operands}: [{shapes[n]}]" for n in hlo.computations[hlo.entry]
            if hlo.instructions[n].opcode == "copy" and shapes.get(n) in stacks]


# default: the stem test counts copies of stacked buffers in XLA's dump, the GPT variants roll packed
@pytest.mark.slow
def test_packed_gpt_rolls_and_matches_jit(tmp_path):
    step, state, tokens = transformer.gpt(**SMALL, opt=optax.adamw(3e-4, eps=EPS))
    call = rolled(step, xla_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    compiled = call.compiled(loopfuse.pack(state, layers=True), tokens)
    # no stack is copied: XLA:CPU copies a while loop's result before an update-slice after the loop,
    # which was every stack once a call (the write of layer 0's rows; now in a loop of its own)
    assert stack_copies(tmp_path, state[0]["blocks"][0], SMALL["layers"]) == []
    text = compiled.reports["roll-layers"]
    # the loops read the donated stacks: XLA's region analysis, which can then change results, stays off
    assert "region_analysis: off, roll-layers adds control flow of its own" in str(compiled.program)
    assert text.startswith("rolled [0]['blocks'], [1][0].mu['blocks'], [1][0].nu['blocks'] [0:4]: 4 layers")
    assert "36 stacked leaves updated inside the backward loop" in text
    assert len(text.splitlines()) == 1, text     # no other run tried: not Adam's mu and nu as two "layers"
    new, aux = run(call, loopfuse.pack(state, layers=True), tokens, 3)
    leaves_close(new.unpack(), run(jax.jit(step), fresh(state), tokens, 3)[0])


SEVENTEEN = {**transformer.TINY, "layers": 17}


def test_a_packed_state_of_more_than_16_layers_updates_inside_the_backward_loop():
    """jnp.concatenate builds a packed buffer of more than 16 pieces as a tree of concatenates: the
    pass still finds each layer's leaf in it, so the update runs inside the backward loop."""
    step, state, tokens = transformer.gpt(**SEVENTEEN)
    text = report(rolled(step), loopfuse.pack(state, layers=True), tokens)
    assert "[0:17]: 17 layers" in text and "36 stacked leaves updated inside the backward loop" in text


@pytest.mark.slow
def test_more_than_16_packed_layers_match_jit_below_its_memory():
    """... and no stacked gradient exists: the temporaries are below a quarter of jax.jit's (1.8x of
    them when the update ran after the loop)."""
    step, state, tokens = transformer.gpt(**SEVENTEEN, opt=optax.adamw(3e-4, eps=EPS))
    call, packed = rolled(step), loopfuse.pack(state, layers=True)
    reference = jax.jit(step, donate_argnums=0)
    jit_temp = reference.lower(state, tokens).compile().memory_analysis().temp_size_in_bytes
    assert call.memory_stats(packed, tokens).temp < 0.25 * jit_temp
    leaves_close(run(call, packed, tokens, 2)[0].unpack(), run(reference, fresh(state), tokens, 2)[0])


def test_a_state_given_leaf_by_leaf_rolls_where_its_activations_outweigh_its_leaves():
    """Stacking the layers' leaves inside the call costs a copy of them in temporaries: the pass rolls
    a state given as a pytree only where the activations it saves weigh more (many tokens, few
    parameters), and says why not otherwise (few tokens)."""
    many_tokens = dict(transformer.TINY, seq=64, batch=16)
    step, state, tokens = transformer.gpt(**many_tokens)
    assert report(rolled(step), state, tokens).startswith("rolled [0]['blocks']")
    step, state, tokens = transformer.gpt(**transformer.TINY)
    assert re.fullmatch(   # the stack: the 3 layers' 12 leaves and 2 moments; the activations: an estimate
        r"did not roll \[0\]\['blocks'\], \[1\]\[0\]\.mu\['blocks'\], \[1\]\[0\]\.nu\['blocks'\] \[0:3\]: stacking the "
        r"layers' leaves inside each call would cost 115\.3 KiB of temporaries, more than the ~[0-9.]+ KiB of "
        r"activations rolling saves; loopfuse\.pack\(state, layers=True\) keeps them stacked between calls",
        report(rolled(step), state, tokens))
    assert report(rolled(step), loopfuse.pack(state, layers=True), tokens).startswith("rolled [0]['blocks']")


@pytest.mark.slow
def test_packed_layers_roll_in_place_below_the_hand_written_scan():
    step, state, tokens = transformer.gpt(**SMALL, opt=optax.adamw(3e-4, eps=EPS))
    scan_step, scan_state, _ = transformer.gpt_scan(**SMALL, opt=optax.adamw(3e-4, eps=EPS))
    call = rolled(step)
    packed = loopfuse.pack(state, layers=True)
    memory = {"rolled": call.memory_stats(packed, tokens).temp,
              "scan": jax.jit(scan_step, donate_argnums=0).lower(scan_state, tokens).compile().memory_analysis().temp_size_in_bytes,
              "jit": jax.jit(step, donate_argnums=0).lower(state, tokens).compile().memory_analysis().temp_size_in_bytes}
    assert memory["rolled"] < memory["scan"] < memory["jit"], memory
    new, aux = run(call, packed, tokens, 3)
    leaves_close(transformer.stacked(new.unpack()), run(jax.jit(scan_step), fresh(scan_state), tokens, 3)[0])


@pytest.mark.slow
def test_memory_budget_trades_memory_for_recomputation():
    step, state, tokens = transformer.gpt(**SMALL)
    packed = loopfuse.pack(state, layers=True)
    temp = {b: loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=b).memory_stats(packed, tokens).temp
            for b in (0.0, 0.5)}
    reports = {b: loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=b).compiled(packed, tokens).reports
               for b in (0.0, 0.5, 1.0)}
    assert temp[0.0] < temp[0.5]
    assert "also saved per layer" in reports[0.5]["roll-layers"] and "also saved" not in reports[0.0]["roll-layers"]
    assert "roll-layers" not in reports[1.0]          # 1.0: the step as traced, the pass does not run


@pytest.mark.slow
def test_update_after_a_global_norm_clip_runs_after_the_loop():
    opt = optax.chain(optax.clip_by_global_norm(1e-3), optax.adam(1e-2, eps=EPS))
    step, state, tokens = transformer.gpt(**transformer.TINY, opt=opt)
    call, packed = rolled(step), loopfuse.pack(state, layers=True)
    text = call.compiled(packed, tokens).reports["roll-layers"]
    assert text.startswith("rolled") and "update runs after the backward loop" in text
    leaves_close(run(call, packed, tokens, 2)[0].unpack(), run(jax.jit(step), fresh(state), tokens, 2)[0])


def test_a_leaf_every_layer_reads_has_its_gradient_summed_in_the_backward_loop():
    """jax sums the gradient of a leaf every layer reads over the layers; the backward loop sums it in
    its carry, the same additions in the same order (bitwise in the reference interpreter), so no
    value per layer is saved for a sum after the loop: the temporaries fall below jax.jit's (they were
    1.35x of them, 2.65 MB against 1.97 MB, with that sum after the loop)."""
    step, state, x = layered.tied_mlp(6, 8, 32, optax.adam(1e-3, eps=EPS))
    packed = loopfuse.pack(state, layers=True)
    forced = loopfuse.compile_step(step, keep_aux=("loss",), donate=False, passes="roll-layers{force=true}")
    stages = forced.lower(packed, x)
    assert "sums 1 over the layers" in reports(parse_module(stages["final"]).operation)["roll-layers"]
    plain = loopfuse.compile_step(step, keep_aux=("loss",), donate=False).lower(packed, x)
    args = [np.asarray(a) for a in jax.tree_util.tree_leaves((packed, x))]
    for got, expected in zip(interpret(parse_module(stages["final"]), args),
                             interpret(parse_module(plain["final"]), args), strict=True):
        assert got.tobytes() == expected.tobytes()
    step, state, x = layered.tied_mlp(6, 256, 32, optax.adam(1e-3, eps=EPS))
    packed = loopfuse.pack(state, layers=True)
    jit_temp = jax.jit(step, donate_argnums=0).lower(state, x).compile().memory_analysis().temp_size_in_bytes
    assert rolled(step).memory_stats(packed, x).temp < 0.8 * jit_temp
    leaves_close(run(rolled(step), packed, x, 3)[0].unpack(), run(jax.jit(step), fresh(state), x, 3)[0])


@pytest.mark.slow
def test_a_block_unlike_the_others_is_not_rolled():
    step, state, tokens = transformer.gpt(**transformer.TINY)

    def unlike(params, tokens):       # block 1's MLP has another activation: no two neighbours are alike
        x = params["tok"][tokens[:, :-1]] + params["pos"]
        for i, b in enumerate(params["blocks"]):
            x = transformer.block(b, x, 2, act=jax.nn.relu if i == 1 else jax.nn.gelu)
        return transformer._head(params, x, tokens)
    opt = optax.adam(1e-2, eps=EPS)
    fn = transformer.optax_step(unlike, opt)
    state = (state[0], opt.init(state[0]))
    text = report(rolled(fn), loopfuse.pack(state, layers=True), tokens)
    assert text.startswith("did not roll [0]['blocks']") and "the same at every layer" in text, text
    leaves_close(run(rolled(fn), fresh(state), tokens, 2), run(jax.jit(fn), fresh(state), tokens, 2))


def test_a_drop_keeps_the_classes_a_fresh_validation_finds(monkeypatch):
    """`Roles.drop` classifies again only the roles that read a dropped one: on the GPT with an unlike stem
    and last block (whose tries drop roles that read values computed after their loop), each drop leaves
    the roles, their operand classes and the odd positions that validating the remaining roles from
    nothing finds."""
    from copy import deepcopy

    from loopfuse.passes import layer_roles
    drops, drop = [], layer_roles.Roles.drop

    def checked(self, g, bad, why):
        fresh = deepcopy(self)
        fresh.remove(g, bad, why)
        fresh.operands = [None] * len(fresh.ops)
        layer_roles._validate(g, fresh)
        drop(self, g, bad, why)
        assert (self.ops, self.operands, self.odd, self.dropped) == (fresh.ops, fresh.operands, fresh.odd, fresh.dropped)
        drops.append(len(bad))
    monkeypatch.setattr(layer_roles.Roles, "drop", checked)
    step, state, tokens = layered.gpt_variant("stem_and_last", **transformer.TINY)
    report(rolled(step), loopfuse.pack(fresh(state), layers=True), tokens)
    assert len(drops) > 3, drops


@pytest.mark.slow
def test_a_partial_run_rolls_and_the_rest_stays():
    params = transformer.params(layers=4, width=16, heads=2, seq=8, vocab=32)
    params["blocks"].append(transformer.params(layers=1, width=16, heads=4, seq=8, vocab=32)["blocks"][0])
    params["blocks"][-1]["up"] = jnp.zeros((16, 32))        # a narrower MLP: not the same shapes
    params["blocks"][-1]["up_b"] = jnp.zeros(32)
    params["blocks"][-1]["down"] = jnp.zeros((32, 16))

    def loss(p, t):
        x = p["tok"][t[:, :-1]] + p["pos"]
        for i, b in enumerate(p["blocks"]):
            x = transformer.block(b, x, 2 if i < 4 else 4)
        return transformer._head(p, x, t)
    opt = optax.adam(1e-2, eps=EPS)
    fn, state, tokens = transformer.optax_step(loss, opt), (params, opt.init(params)), transformer.tokens(8, 2, 32)
    packed = loopfuse.pack(state, layers=True)
    text = rolled(fn).compiled(packed, tokens).reports["roll-layers"]
    assert "[0:4]: 4 layers" in text, text
    leaves_close(run(rolled(fn), packed, tokens, 2)[0].unpack(), run(jax.jit(fn), fresh(state), tokens, 2)[0])


@pytest.mark.slow
def test_flax_nnx_blocks_roll():
    """... below the memory of the hand-written scan of the same nnx model."""
    size = dict(layers=3, width=16, heads=2, seq=8, vocab=32, batch=2)
    step, state, tokens = transformer.nnx_gpt(**size, opt=optax.adamw(3e-4, eps=EPS))
    scan_step, scan_state, _ = transformer.nnx_gpt_scan(**size)
    call, packed = loopfuse.compile_step(step, memory_budget=0.0), loopfuse.pack(state, layers=True)
    assert call.compiled(packed, tokens).reports["roll-layers"].startswith("rolled [0]['blocks']")
    scan = jax.jit(scan_step, donate_argnums=0).lower(scan_state, tokens).compile().memory_analysis()
    assert call.memory_stats(packed, tokens).temp < scan.temp_size_in_bytes
    leaves_close(run(call, packed, tokens, 2)[0].unpack(), run(jax.jit(step), fresh(state), tokens, 2)[0])


class _Block(eqx.Module):
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.up, self.down = eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 8, key=k2)

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(x)))


class _Net(eqx.Module):
    layers: list

    def __init__(self, n, key):
        self.layers = [_Block(k) for k in jax.random.split(key, n)]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.slow
def test_equinox_list_of_modules_rolls():
    opt = optax.sgd(1e-2, momentum=0.9)
    params = eqx.filter(_Net(3, jax.random.key(0)), eqx.is_array)

    def loss(p, batch):
        return jnp.mean((jax.vmap(p)(batch["x"]) - batch["y"]) ** 2)

    def step(state, batch):
        p, s = state
        value, grads = jax.value_and_grad(loss)(p, batch)
        updates, s = opt.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), {"loss": value}
    batch = {"x": np.ones((4, 8), np.float32), "y": np.zeros((4, 8), np.float32)}
    state = (params, opt.init(params))
    # layer 0 reads the data (no input gradient): it joins the run, its input gradient's ops computed
    # there and dropped, so all three layers roll in place in the packed buffers (no stack to copy)
    call = loopfuse.compile_step(step, memory_budget=0.0)
    packed = loopfuse.pack(state, layers=True)
    assert call.compiled(packed, batch).reports["roll-layers"].startswith("rolled [0].layers, [1][0].trace.layers [0:3]")
    leaves_close(run(call, packed, batch, 2)[0].unpack(), run(jax.jit(step), fresh(state), batch, 2)[0])


@pytest.mark.slow
def test_loop_and_minimize_take_the_budget():
    many_tokens = dict(transformer.TINY, seq=64, batch=16)     # a pytree state rolls (see above)
    step, state, tokens = transformer.gpt(**many_tokens, opt=optax.adamw(3e-4, eps=EPS))
    loop = rolled(step).loop(3)
    assert "rolled" in loop.compiled(fresh(state), tokens).reports["roll-layers"]
    new, history = loop(fresh(state), tokens)
    expected, aux = run(jax.jit(step), fresh(state), tokens, 3)
    leaves_close(new, expected)
    leaves_close(history["loss"][-1], aux["loss"])

    params, _ = state
    loss = lambda p, t: transformer._head(p, _forward(p, t), t)     # noqa: E731
    sols = {b: loopfuse.minimize(loss, params, tokens, optax.adam(1e-2, eps=EPS), steps=4,
                                 backend=loopfuse.CompiledLoop(steps=2, memory_budget=b)) for b in (None, 0.0)}
    leaves_close(sols[0.0].params, sols[None].params)


def _forward(p, t):
    x = p["tok"][t[:, :-1]] + p["pos"]
    for b in p["blocks"]:
        x = transformer.block(b, x, transformer.TINY["heads"])
    return x


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match=r"memory_budget must be in \[0, 1\], got 2"):
        loopfuse.compile_step(lambda s, b: (s, {}), memory_budget=2)
    with pytest.raises(TypeError, match=r"CompiledLoop\(memory_budget=...\) must be a number"):
        loopfuse.CompiledLoop(memory_budget="all")


def test_a_budget_of_one_is_the_step_as_traced_decided_once():
    """1.0 is kept as None, so the pipeline, verify's culprits and the backends see no budget."""
    step = lambda s, b: (s * b, {})   # noqa: E731
    assert loopfuse.StepOptions(memory_budget=1).memory_budget is None
    assert loopfuse.CompiledStep(memory_budget=1.0).memory_budget is None
    assert loopfuse.StepOptions(memory_budget=0).memory_budget == 0.0
    assert loopfuse.compile_step(step, memory_budget=1.0).options == loopfuse.compile_step(step).options


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_corpus_with_memory_budget_zero(name):
    """The differential corpus at ``memory_budget=0.0``, and under roll-layers forced (each program rolls
    where its layers allow, whatever the stacking costs). A program that rolls (the transformer, forced)
    within the tolerance of jax.jit, one step and loop(K); every one that does not (all at 0.0: the
    transformer's tiny activations do not repay stacking its leaves) bitwise, left as traced."""
    p = PROGRAMS[name]()
    default_loop = loopfuse.compile_step(p.fn).loop(3)(fresh(p.state), p.batch)
    for options in ({"memory_budget": 0.0}, {"passes": "roll-layers{force=true}"}):
        step = loopfuse.compile_step(p.fn, **options)
        text = step.compiled(fresh(p.state), p.batch).reports["roll-layers"]
        got, expected = step(fresh(p.state), p.batch), jax.jit(p.fn)(fresh(p.state), p.batch)
        looped = step.loop(3)(fresh(p.state), p.batch)
        if text.startswith("rolled"):     # AdamW (lr 1e-2, eps 1e-8) moves a parameter whose gradient is
            assert name == "transformer_adamw" and "passes" in options   # rounding noise by up to lr:
            leaves_close(got, expected, atol=1e-2 * 1e-2)     # the state within 1% of lr, the loss within RTOL
            losses = run_losses(jax.jit(p.fn), fresh(p.state), p.batch, 3)
            np.testing.assert_allclose(looped[1]["loss"], losses, rtol=RTOL)
        else:     # as traced: what the default loop computes, which test_corpus checks against its reference
            assert text.startswith(("no run of alike layers", "did not roll")), text
            assert_trees_equal(got, expected)
            assert_trees_equal(looped, default_loop)


@pytest.mark.slow
def test_verify_holds_a_rolled_program_to_its_tolerance(monkeypatch):
    step, state, tokens = transformer.gpt(**transformer.TINY)      # AdamW, eps 1e-8: as users run it
    new, aux = rolled(step, verify=True)(loopfuse.pack(state, layers=True), tokens)     # within the tolerance
    assert np.isfinite(aux["loss"])

    def first_row(stacked, index):        # a wrong rewrite: every layer reads layer 0's rows
        return rewriter.static_row(stacked, 0)
    monkeypatch.setattr(rewriter, "row", first_row)
    cache.RECENT.clear()                  # (the program above, compiled right, is kept in memory)
    with pytest.raises(loopfuse.MiscompileError, match="roll-layers") as caught:
        rolled(step, verify=True)(loopfuse.pack(state, layers=True), tokens)
    assert caught.value.culprits == ["memory_budget (the pass 'roll-layers')"]


def test_layers_the_step_scans_over_itself_are_named_a_loop_already():
    """equinox's filter_vmap + lax.scan idiom (flax's nn.scan, nnx.scan alike): the layers' leaves are stacked and
    the step loops over them; nothing rolls, and the report says why rather than only that no index differs."""
    def step(state, x):
        def loss(w):
            h, _ = jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)
            return jnp.mean(h ** 2)
        value, g = jax.value_and_grad(loss)(state)
        return state - 0.1 * g, {"loss": value}
    w, x = jnp.full((4, 16, 16), 0.1), jnp.ones((8, 16))
    text = loopfuse.compile_step(step, memory_budget=0.0).compiled(w, x).reports["roll-layers"]
    assert text.startswith("no run of alike layers") and "are a device loop already" in text, text
