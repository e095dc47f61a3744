"""roll-layers on the stacks of blocks people write (issue 38): however the blocks are held, around
unlike first and last blocks, per-layer constants, a first block that reads the data; and a
differential fuzz of generated layered models (tests/py/layer_fuzz.py) against jax.jit.

Tolerance as test_roll_layers.py's (its module docstring): every state leaf within `RTOL` of its largest
value plus `ATOL` of jax.jit's after two steps; Adam's epsilon `EPS` keeps rounding-noise gradients
at rounding size."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxlib.mlir import ir

import layer_fuzz
import layered
import loopfuse
import transformer
from loopfuse.compile.mlir_context import parse_module
from loopfuse.drivers import chunks
from loopfuse.memory import xla_dump
from loopfuse.passes.layer_runs import runs
from loopfuse.passes.roll_layers import NOT_ROLLED_STACKED, UPDATE_RUN
from problems import fresh
from test_roll_layers import EPS, leaves_close, report as roll_report, run

TINY = dict(layers=4, width=16, heads=2, seq=8, batch=2, vocab=32)
FUZZ_DEFAULT = (0, 1, 43)     # 43: packed, micro-batches; under -m slow, 19: also clipped, an update run writing a leaf
# it does not read; 151: packed, micro-batches, 11 layers under keys h_0 .. h_10 (leaf order is not layer order)
FUZZ_SLOW = [s for s in range(420) if s not in FUZZ_DEFAULT]   # 150, 158: a run ending with the odd layer of blocks
# without their residual, its extra op left after the run (`layer_fuzz.Model.may_end`); 187: the alike layers after
# such a layer roll (the parts on either side of the layer before the one `Roles.odd` points at)


def rolled_runs(report: str) -> list[range]:
    """The runs of layers roll-layers' report says it rolled (not the update runs after a micro-batch loop)."""
    return [range(int(a), int(b)) for a, b in re.findall(rf"^rolled (?!{UPDATE_RUN}).*? \[(\d+):(\d+)\]", report, re.M)]


def check_rolls(step, state, batch, expected: range | list[range], packed: bool = True, call=None, **options):
    """`step` rolls the layers `expected` (a run's, or several runs', in any order) and matches jax.jit within
    the tolerance after two steps (`call`: the compiled step to check, else ``compile_step`` with `options`, or
    `rolling`'s without)."""
    call = call or (loopfuse.compile_step(step, keep_aux=("loss",), **options) if options else rolling(step))
    s = loopfuse.pack(fresh(state), layers=True) if packed else fresh(state)
    report = call.compiled(s, batch).reports["roll-layers"]
    in_order = lambda found: sorted(found, key=lambda r: (r.start, r.stop))  # noqa: E731
    assert in_order(rolled_runs(report)) == in_order(expected if isinstance(expected, list) else [expected]), report
    got, _ = run(call, s, batch, 2)
    leaves_close(got.unpack() if packed else got, run(jax.jit(step), fresh(state), batch, 2)[0])
    return report


@pytest.mark.parametrize("spelling, paths", [
    ("list", ["[0]['b'][0]['w']", "[0]['b'][1]['w']", "[0]['b'][2]['w']"]),
    ("linen", ["[0]['params']['Block_0']['Dense_0']['kernel']", "[0]['params']['Block_1']['Dense_0']['kernel']",
               "[0]['params']['Block_2']['Dense_0']['kernel']"]),
    ("dict h_i", ["[0]['h_0']['w']", "[0]['h_1']['w']", "[0]['h_2']['w']"]),
    ("digits", ["[0]['0']['w']", "[0]['1']['w']", "[0]['2']['w']"]),
    ("no container", ["[0]['w1']", "[0]['w2']", "[0]['w3']"]),
    ("attributes", ["[0].layer0.w", "[0].layer1.w", "[0].layer2.w"]),
    ("haiku", ["[0]['block/linear']['w']", "[0]['block_1/linear']['w']", "[0]['block_2/linear']['w']"]),
    ("haiku, no block", ["[0]['linear']['w']", "[0]['linear_1']['w']", "[0]['linear_2']['w']"]),
    ("haiku nets", ["[0]['mlp/~/linear_0']['w']", "[0]['mlp/~/linear_1']['w']", "[0]['mlp/~/linear_2']['w']"]),
])
def test_runs_are_found_however_the_blocks_are_held(spelling, paths):
    found = runs(paths + ["[0]['head']"], ["f32[4,4]"] * 3 + ["f32[4]"])
    assert [(r.length, [leaf for layer in range(r.length) for leaf in r.leaves(layer)]) for r in found] == [(3, [0, 1, 2])]


def test_the_outer_index_is_proposed_first():
    """Blocks of two layer norms each: the run over the blocks comes before the runs inside them."""
    paths = [f"['Block_{b}']['LayerNorm_{n}']" for b in range(3) for n in range(2)]
    found = runs(paths, ["f32[4]"] * 6)
    assert [(r.length, list(r.families)) for r in found][0] == (3, ["['Block_*']"])


# default: linen's key spelling (test_runs_are_found_however_the_blocks_are_held), keyed layers (test_packed)
@pytest.mark.slow
def test_a_flax_linen_gpt_rolls_every_block():
    """Eight blocks, each with two layer norms (``LayerNorm_0``, ``LayerNorm_1``): those are a run of two inside
    each block, not modules held apart from the blocks' (`layer_runs.with_partners`). Joined to the blocks'
    run over blocks 0 and 1, they rolled those two alone, where activations are worth rolling (issue 31's
    sizes: 0.78x jax.jit's temporaries packed instead of 0.16x, bench_roll_models' linen row)."""
    step, state, tokens = layered.linen_gpt(layers=8, width=32, heads=2, seq=64, batch=8, vocab=32,
                                            opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, tokens, range(0, 8))


@pytest.mark.slow
def test_twelve_linen_blocks_roll_and_their_packed_state_stays_in_layer_order():
    """``Block_0`` .. ``Block_11``: jax orders the leaves ``Block_10`` before ``Block_2``; the stacks are by
    index, and each call's new state goes back to its rows (`packed.Layout.pack`), two steps as jax.jit's
    (slow: the default run has test_packed.py's twelve keyed layers and the four-block linen GPT)."""
    step, state, tokens = layered.linen_gpt(**dict(TINY, layers=12), opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, tokens, range(0, 12))


def test_an_equinox_mlp_whose_first_block_reads_the_data_rolls_every_block():
    step, state, data = layered.eqx_mlp(layers=4, width=8, hidden=16, batch=4, opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, data, range(0, 4))


@pytest.mark.slow
def test_equinox_layer_norm_blocks_roll_with_the_first_that_reads_the_data():
    """``eqx.nn.LayerNorm`` takes its variance with ``jnp.var``, a jitted function that jax lowers in two forms:
    ``_var`` at the first block, which reads the data, and ``_var_0``, which also returns what its derivative
    reads, at the others. Their two callees made the first layer unlike the others'; roll-layers inlines the
    calls to a function's forms (`roll_layers.inline_forms`) and all four roll. Before, layers 1-3 rolled and
    the packed state held 1.05x jax.jit's temporaries (a user's trial: 0.78x on its larger model)."""
    step, state, data = layered.eqx_mlp(layers=4, width=32, hidden=64, batch=32, opt=optax.adamw(1e-3, eps=EPS),
                                        norm=True)
    check_rolls(step, state, data, range(0, 4))
    assert packed_temp_ratio(step, state, data) < 0.6


def test_a_functions_forms_inlined_change_no_value_where_nothing_rolls():
    """The inlined forms stay inlined where the run then does not roll (stacking inside the call would cost more
    than it saves): no value changes, the result is jax.jit's bitwise (XLA inlines every call)."""
    step, state, data = layered.eqx_mlp(layers=4, width=8, hidden=16, batch=4, norm=True)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0)
    report = call.compiled(fresh(state), data).reports["roll-layers"]
    stages = call.lower(fresh(state), data)
    assert report.startswith("did not roll") and "call @_var(" in stages["00-traced"], report
    assert "call @_var(" not in stages["final"] and "call @_var_0(" not in stages["final"]
    got, expected = run(call, fresh(state), data, 2)[0], run(jax.jit(step), fresh(state), data, 2)[0]
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.slow     # ~6 s: the suite's time
def test_a_residual_conv_nets_blocks_roll():
    """Convolutions (their windows, padding and the backward's transposed and input-gradient convolutions, all
    in op attributes) roll like products: the stem and head read the image and the classes, the blocks roll."""
    step, state, data = layered.conv_resnet(4, 4, 8, 4, opt=optax.adamw(1e-3, eps=EPS))
    report = check_rolls(step, state, data, range(0, 4))
    assert report.startswith("rolled [0].blocks, [1][0].mu.blocks, [1][0].nu.blocks [0:4]"), report


def test_blocks_under_haikus_module_names_roll():
    """haiku's names, ``block/linear`` then ``block_1/linear``: each layer is what is under ``block_l``, the
    first the unnumbered one; packed, the stacks are the run's (`loopfuse.pack` finds it alike)."""
    step, state, data = layered.haiku_mlp(4, 8, 16, opt=optax.adamw(1e-3, eps=EPS))
    report = check_rolls(step, state, data, range(0, 4))
    assert "[0]['block_*']" in report, report


def test_a_layers_modules_held_apart_roll_as_one_layer():
    """A loop creating haiku's ``hk.LayerNorm`` and ``hk.Linear`` itself: ``layer_norm_l`` and ``linear_l`` are
    two runs over the same layers, read layer by layer together (`layer_runs.with_partners`), so one run holds
    both and each layer's linear leaves are updated in the backward loop (before, the layer norms rolled alone,
    the linear leaves read per layer, their update after the loops: 0.51x of jax.jit's temporaries packed at
    bench_roll_models' size, against 0.26x)."""
    step, state, data = layered.haiku_mlp(4, 8, 16, opt=optax.adamw(1e-3, eps=EPS), blocks=False)
    report = check_rolls(step, state, data, range(0, 4))
    assert report.startswith("rolled [0]['layer_norm_*'], [0]['linear_*'], "), report


@pytest.mark.slow     # ~7 s; the join itself: layer_runs.with_partners' doctest
def test_a_linen_loop_of_modules_with_a_head_of_the_same_kind_rolls_them_together():
    """``nn.Dense`` then ``nn.BatchNorm`` created in a loop, then a head ``nn.Dense``: ``Dense_0`` .. ``Dense_4``
    and ``BatchNorm_0`` .. ``BatchNorm_3`` are runs of other lengths over the same layers, joined over the layers
    of both (`layer_runs.with_partners`). Before, the BatchNorm layers rolled alone (the Dense leaves read per
    layer), and ``memory_budget=0.0`` held 1.18x the temporaries of the step as traced (a user's trial)."""
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(4):
                x = nn.relu(nn.BatchNorm(use_running_average=False, momentum=0.9)(nn.Dense(64)(x)))
            return nn.Dense(10)(x)
    net, opt = Net(), optax.sgd(0.1, momentum=0.9)
    x, y = jax.random.normal(jax.random.key(2), (128, 16)), jax.random.randint(jax.random.key(3), (128,), 0, 10)
    variables = net.init(jax.random.key(0), x)

    def step(state, batch):
        params, stats, o = state

        def loss(p):
            logits, new = net.apply({"params": p, "batch_stats": stats}, batch["x"], mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), new["batch_stats"]
        (value, stats), g = jax.value_and_grad(loss, has_aux=True)(params)
        u, o = opt.update(g, o, params)
        return (optax.apply_updates(params, u), stats, o), {"loss": value}
    state, data = (variables["params"], variables["batch_stats"], opt.init(variables["params"])), {"x": x, "y": y}
    report = check_rolls(step, state, data, range(1, 4), packed=False)
    assert report.startswith("rolled [0]['BatchNorm_*'], [0]['Dense_*'], "), report
    traced = loopfuse.compile_step(step).memory_stats(fresh(state), data).temp
    assert rolling(step).memory_stats(fresh(state), data).temp <= traced
    assert packed_temp_ratio(step, state, data) < 0.9


@pytest.mark.parametrize("encoder, decoder", [(4, 4), (3, 4), (4, 3)])
def test_an_encoders_and_a_decoders_stacks_both_roll(encoder, decoder):
    """An encoder then a decoder, alike products. The encoder's input-gradient chain (none at its first layer,
    which reads the data) runs on into the decoder's layers, so it is longer than the run and starts at the
    run's second layer; placed there (its first position dead), the encoder rolls (before, the chain was cut
    at the run's start, a decoder layer's op at the encoder's last, and nothing rolled). Through the residual
    stream the shift map also reaches the other stack's per-layer ops (a bias's broadcast, its moments' decay):
    chains of as many ops as a run has layers, valid roles reading that stack's leaves as per-layer values.
    They are not the run's work (`layer_roles._apart`): before, the first stack rolled computed them in its
    loops, and the other then found its ops taken (at equal depths, or a shorter encoder: the decoder did not
    roll)."""
    step, state, x = layered.two_stacks(encoder, 8, 16, opt=optax.adam(1e-2, eps=EPS), decoder=decoder)
    report = check_rolls(step, state, x, [range(encoder), range(decoder)],
                         passes="roll-layers{force=true}")    # a toy: rolling repays little
    assert "rolled [0]['enc']" in report and "rolled [0]['dec']" in report, report


def test_stacks_of_alike_blocks_are_runs_of_their_own():
    """The same block in an encoder and a decoder: the stacks' families have the same layers and leaves, as a
    run's parameters and moments do, but their last keys tell them apart (``['enc']``, ``['dec']``), each with
    the same roots (the parameters, each moment). Before, the two stacks were one run of four families, read
    one after the other. Parameters held as a bare list keep their moments (``[0]``, ``.mu``: other last keys,
    other roots)."""
    paths = [f"{root}['{stack}'][{l}]['w']" for root in ("[0]", "[1].mu") for stack in ("enc", "dec") for l in (0, 1)]
    found = runs(paths, ["f32[4,4]"] * len(paths))
    assert sorted(sorted(r.families) for r in found) == [["[0]['dec']", "[1].mu['dec']"], ["[0]['enc']", "[1].mu['enc']"]]
    bare = [f"{root}[{l}]['w']" for root in ("[0]", "[1][0].mu", "[1][0].nu") for l in (0, 1, 2)]
    assert [sorted(r.families) for r in runs(bare, ["f32[4,4]"] * len(bare))] == [["[0]", "[1][0].mu", "[1][0].nu"]]


def test_layers_held_as_a_bare_list_roll_with_their_moments():
    """``params = [layer, layer, ...]``, as JAX's tutorials write an MLP: one run of the parameters and both
    moments, each layer's leaves updated in the backward loop."""
    rng = np.random.default_rng(0)
    params = [{"w": jnp.asarray(rng.normal(size=(8, 8)) / 8 ** 0.5, jnp.float32), "b": jnp.zeros(8)} for _ in range(4)]

    def loss(p, x):
        for layer in p:
            x = x + jnp.tanh(x @ layer["w"] + layer["b"])
        return jnp.mean(x ** 2)
    opt = optax.adam(1e-2, eps=EPS)
    x = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    report = check_rolls(transformer.optax_step(loss, opt), (params, opt.init(params)), x, range(4),
                         passes="roll-layers{force=true}")
    assert report.startswith("rolled [0], [1][0].mu, [1][0].nu [0:4]") and "6 stacked leaves updated" in report, report


@pytest.mark.parametrize("encoder, decoder", [pytest.param(4, 4, marks=pytest.mark.slow), (3, 5)])
def test_an_autoencoders_stacks_of_the_same_block_both_roll(encoder, decoder):
    """Each stack is its run (above). Seen from one run, the stacks' chains all run through both (every op of
    a block has its like in every layer of either stack), so nearly every chain is cut to a window, which the
    ops that read the run's leaves place; the others are cut in order, the fewest bytes crossing, and one whose
    windows tie waits for the chains after it. Before, at 3 + 5, the first of those took its first window, the
    encoder's: the decoder's run carried 8 values, its leaves updated after its loops, the encoder rolled 2 of
    its 3 layers; at 4 + 4 (one run) nothing rolled. SGD with momentum (its trace mirrors the parameters):
    under Adam, one bias gradient of the last layer is rounding noise (-3.8e-7 against 4.1), which jax 0.12's
    jax.jit and the rolled program round apart, and Adam moves it by 3.6% of a step (README, Exactness)."""
    step, state, x = layered.autoencoder(encoder, decoder, 8, 16, opt=optax.sgd(1e-2, momentum=0.9))
    report = check_rolls(step, state, x, [range(encoder), range(decoder)], passes="roll-layers{force=true}")
    assert report.count("forward loop carries 1 value(s)") == 2 and report.count("4 stacked leaves updated") == 2, report


def test_a_decoder_whose_every_block_reads_the_encoders_output_rolls():
    """Cross-attention's shape: each decoder block reads the encoder's output m. The encoder's residual adds
    are a chain as long as the decoder's run, valid roles of it (an encoder layer's leaf read per layer), and
    m its last one's value at one position, which no decoder op may read so. Left out as another stack's
    work (`layer_roles._apart`), m is one value from outside the run, read by every layer, and its gradient,
    jax's sum of every layer's term, is summed in the backward loop's carry (before, neither stack rolled).
    With jax 0.11+, the stacks' backward ops are chains twice the run's length, cut at the decoder's window
    only since the decoder's shorter chains are not counted as outside the run before they are placed
    (lit: roll-layers-stacks-jax12.mlir)."""
    step, state, x = layered.two_stacks(4, 8, 16, opt=optax.adam(1e-2, eps=EPS), cross=True)
    report = check_rolls(step, state, x, [range(4), range(4)], passes="roll-layers{force=true}")
    assert "sums 1 over the layers" in report, report


@pytest.mark.parametrize("head", ["identity", "sin"])
def test_layer_normed_blocks_roll_up_to_an_unlike_last_block(head):
    """The first block reads the data, so the ops computing a block's input gradient are missing in it: their
    chains, one op short, are layers 1 .. 4's (the gradient of each layer norm's input); the tanh's backward
    chains, one short too, layers 0 .. 3's. In the part 0 .. 3, both fit as the part's whole or as its dead
    first position: each goes where the fewest bytes cross, the chains that touch only other short ones
    (a layer norm's backward) placed after those. This rolled nothing when a part took the whole over the
    dead first position whatever the cost, and those chains' offsets tied."""
    step, state, x = layered.normed_mlp(5, 8, 4, head={"identity": lambda h: h, "sin": jnp.sin}[head],
                                        opt=optax.adamw(1e-3, eps=EPS))
    check_rolls(step, state, x, range(0, 4))


@pytest.mark.slow     # ~5 s; the default run has its lit case (roll-layers-norm.mlir, test_roll_layers)
def test_layer_normed_blocks_roll_beside_a_loss_alike_to_their_input_gradient():
    """The squared error against a target: its gradient's ``2 (x - y)`` is the op the layer norm's ``2 (x - mean)``
    is at every layer but the first, which reads the data and computes no input gradient. The shift map's chain
    of those ops is then as long as the run, its first op layer 1's: one position late (`layer_roles._one_late`),
    with the chains that read it. Nothing rolled before (a user's trial: the packed state then held 1.37x
    jax.jit's temporaries; here 1.43x)."""
    step, state, data = layered.normed_mlp(4, 64, 64, head=jnp.tanh, opt=optax.adamw(1e-3, eps=EPS), target=True)
    check_rolls(step, state, data, range(0, 4))
    assert packed_temp_ratio(step, state, data) < 0.6


@pytest.mark.slow
def test_rms_normed_blocks_roll_with_the_first_that_reads_the_data():
    """An RMS norm's input gradient reads the block's input itself (a forward carry), which the first block,
    reading the data, does not compute: its chains read the carry at layers 1 .. 3 and have no op at layer 0,
    where they take the layer's input that the other roles read there (`layer_roles._carried_in`) and their
    results are dropped. All four roll, below half jax.jit's temporaries; layer 0 was left out before, its
    packed rows read into buffers of their own, and the rolled three took 1.09x jax.jit's temporaries (six
    blocks of 128 at 1.32x, now 0.56x)."""
    step, state, data = layered.rms_mlp(4, 64, 64, opt=optax.adamw(1e-3, eps=EPS))
    check_rolls(step, state, data, range(0, 4))
    assert packed_temp_ratio(step, state, data) < 0.5


def rolling(step):
    """`step` compiled as the tests roll it: ``memory_budget=0.0``, the loss kept."""
    return loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0)


def packed_temp_ratio(step, state, data, call=None) -> float:
    """The temporaries of `step` (`call`, else `rolling(step)`) on its state packed with its layers stacked, over
    jax.jit's (donated), from the compiled executables."""
    call = call or rolling(step)
    jit_temp = jax.jit(step, donate_argnums=0).lower(fresh(state), data).compile().memory_analysis().temp_size_in_bytes
    return call.memory_stats(loopfuse.pack(fresh(state), layers=True), data).temp / jit_temp


def buffer_copies(folder, packed, key: str = "blocks") -> list[str]:
    """The copies of a whole buffer of `packed` that holds layers ([`key`]) in the entry computation
    of the optimized program XLA dumped into `folder` (as test_roll_layers.stack_copies)."""
    files = xla_dump.module_files(folder)
    hlo = xla_dump.hlo_module(files["hlo"].read_text())
    shapes = {b.instruction: b.shape.split("]")[0].split("[")[-1] for b in
              xla_dump.buffer_assignment(files["buffers"].read_text()).values()}
    sizes = {str(b.size) for b, paths in zip(packed.buffers, packed.layout.held_paths())
             if all(f"['{key}']" in p for p in paths)}
    return [f"{n} = copy{hlo.instructions[n].operands}: [{shapes[n]}]" for n in hlo.computations[hlo.entry]
            if hlo.instructions[n].opcode == "copy" and shapes.get(n) in sizes]


@pytest.mark.slow     # default: lit roll-layers-parts (layers left out), roll-layers-micro-batch (d) (their rows)
def test_an_unlike_stem_and_last_block_are_left_as_they_are(tmp_path):
    step, state, tokens = layered.gpt_variant("stem_and_last", **dict(TINY, layers=5), opt=optax.adamw(3e-4, eps=EPS))
    # the packed buffers hold all five layers: the three rolled ones roll over them in place, the rows
    # of the two left out read into buffers of their own, which this tiny model's activations repay with
    # jax 0.10's program and not with 0.12's (bench_roll_models measures the size): forced
    report = check_rolls(step, state, tokens, range(1, 4), passes="roll-layers{force=true}",
                         xla_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    assert "layers 0 and 4 left as they are: their ops differ from the others'" in report
    # their rows are read before the loops that write the buffers in place and written over the loops'
    # result: read and concatenated where the step does, XLA copied every buffer the loops write whole
    assert buffer_copies(tmp_path, loopfuse.pack(state, layers=True)) == []


@pytest.mark.slow     # ~8 s: the suite's time
def test_a_part_whose_layers_are_alike_but_do_not_pay_says_so():
    """Where no part of a run rolls, the report names the alike part refused for its cost besides the whole
    run's reason: one sequence of 4 tokens has too few activations to repay reading the left-out rows."""
    step, state, tokens = layered.gpt_variant("stem_and_last", **dict(TINY, layers=5, batch=1, seq=4),
                                              opt=optax.adamw(3e-4, eps=EPS))
    report = roll_report(rolling(step), loopfuse.pack(fresh(state), layers=True), tokens)
    assert rolled_runs(report) == []
    assert re.search(r"did not roll .*\[0:5\]: no backward op is the same at every layer .*; layers 1-3 are alike "
                     r"but did not roll: reading the packed rows of the layers left out of the run would cost", report)


def test_parts_too_short_to_beat_the_rolled_whole_run_are_not_analyzed(monkeypatch):
    """The tied MLP's whole run rolls with one op left out (not every op alike), so the search looks for a part
    of fewer layers that rolls every op; no part of 3 of its 4 layers can roll more ops than the whole run (a
    role is one of the run's chains), and none is analyzed (5 were, each one more analysis and plan of the
    step). The whole run rolls, as before."""
    from loopfuse.passes import layer_roles
    analyzed, roles = [], layer_roles.Layout.roles
    monkeypatch.setattr(layer_roles.Layout, "roles", lambda self, g, first=0, last=0: analyzed.append((first, last))
                        or roles(self, g, first, last))
    step, state, data = layered.tied_mlp(4, 8, 4)
    report = roll_report(rolling(step), loopfuse.pack(fresh(state), layers=True), data)
    assert rolled_runs(report) == [range(0, 4)], report
    assert analyzed == [(0, 0)]


@pytest.mark.slow
def test_more_than_16_packed_layers_around_a_stem_roll_in_place(tmp_path):
    """jnp.concatenate builds a buffer of 18 layers as a tree of concatenates: the left-out layers'
    new rows are still written over the loops' result, and no buffer is copied."""
    step, state, tokens = layered.gpt_variant("stem_and_last", **dict(TINY, layers=18), opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, tokens, range(1, 17), memory_budget=0.0,
                xla_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    assert buffer_copies(tmp_path, loopfuse.pack(state, layers=True)) == []


@pytest.mark.slow     # default: the layer-wise learning rates below, stacked constants too, and lit roll-layers-labels
def test_a_per_layer_residual_scale_is_stacked():
    step, state, tokens = layered.gpt_variant("depth_scaled", **TINY, opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, tokens, range(0, 4))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["tuple", "nested", "dict_h", "numbered_keys", "named"])
def test_blocks_held_in_other_containers_roll(variant):
    step, state, tokens = layered.gpt_variant(variant, **TINY, opt=optax.adamw(3e-4, eps=EPS))
    expected = {"nested": range(0, 2), "numbered_keys": range(1, 5)}.get(variant, range(0, 4))
    check_rolls(step, state, tokens, expected, packed=False, passes="roll-layers{force=true}")


@pytest.mark.slow
def test_named_layers_packed_in_key_order_roll_in_place():
    """pack(layers=True) stacks a dict of named layers in its keys' order: a step iterating the dict
    reads them so and rolls them in place; one reading them in another order does not roll the packed
    state (stacking inside the call would cost more than it saves), says so, and keeps jax.jit's results."""
    step, state, tokens = layered.gpt_variant("named_iterated", **TINY, opt=optax.adamw(3e-4, eps=EPS))
    packed = loopfuse.pack(fresh(state), layers=True)
    call = rolling(step)
    text = call.compiled(packed, tokens).reports["roll-layers"]
    assert text.startswith("rolled [0]['blocks'][*]") and "36 stacked leaves updated inside the backward loop" in text
    jit_temp = jax.jit(step, donate_argnums=0).lower(state, tokens).compile().memory_analysis().temp_size_in_bytes
    assert call.memory_stats(packed, tokens).temp < 0.6 * jit_temp
    leaves_close(run(call, packed, tokens, 2)[0].unpack(), run(jax.jit(step), fresh(state), tokens, 2)[0])
    step, state, tokens = layered.gpt_variant("named", **TINY, opt=optax.adamw(3e-4, eps=EPS))
    call = rolling(step)
    text = call.compiled(loopfuse.pack(fresh(state), layers=True), tokens).reports["roll-layers"]
    first, last = text.splitlines()
    assert first.startswith("did not roll") and first.endswith("the packed state holds them in another order than the "
                                                               "step reads them (loopfuse.pack stacks layers held under "
                                                               "names in their keys' order)"), text
    assert last == NOT_ROLLED_STACKED, text
    leaves_close(run(call, loopfuse.pack(fresh(state), layers=True), tokens, 2)[0].unpack(),
                 run(jax.jit(step), fresh(state), tokens, 2)[0])
    # with micro-batches, where no run by keys is left once the layers are ordered by first use (this
    # failed with an IndexError in roll-layers)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, micro_batches=2)
    leaves_close(run(call, loopfuse.pack(fresh(state), layers=True), tokens, 2)[0].unpack(),
                 run(jax.jit(step), fresh(state), tokens, 2)[0])


@pytest.mark.slow
def test_an_nnx_gpt_rolls_as_a_pytree():
    step, state, tokens = transformer.nnx_gpt(**TINY, opt=optax.adamw(3e-4, eps=EPS))
    check_rolls(step, state, tokens, range(0, 4), packed=False, passes="roll-layers{force=true}")


def fuzz_case(seed: int):
    """(rolled runs, whether the model rolls what it should) of fuzz model `seed`, after checking it
    against jax.jit within the tolerance and that no run holds a layer unlike the others."""
    m = layer_fuzz.model(seed)
    cut = f"micro-batch{{slices={m.slices}}}," if m.slices > 1 else ""
    call = loopfuse.compile_step(m.step, passes=f"{cut}roll-layers{{memory-budget={m.budget} force=true}}",
                                 keep_aux=("loss",))
    s = loopfuse.pack(fresh(m.state), layers=True) if m.packed else fresh(m.state)
    report = call.compiled(s, m.batch).reports["roll-layers"]
    got, _ = run(call, s, m.batch, 2)
    leaves_close(got.unpack() if m.packed else got, run(jax.jit(m.step), fresh(m.state), m.batch, 2)[0])
    rolled = rolled_runs(report)
    assert not any(m.unlike_rolled(r) for r in rolled), (m.about, report)
    return m, any(layer_fuzz.covers(r, m) for r in rolled)


@pytest.mark.parametrize("seed", FUZZ_DEFAULT)
def test_generated_layered_models_roll_within_the_tolerance(seed):
    m, rolls = fuzz_case(seed)
    assert rolls or not m.alike, m.about


def test_inlining_leaves_the_calls_cond_to_select_puts_back():
    """Fuzz seed 259: a cond of cheap ops run as selects, and softplus blocks whose first run does not roll, so
    the calls to softplus' forms are inlined and the run tried again (`roll_layers.inline_forms`); nothing rolls,
    and cond-to-select puts its case back, reading the calls its branches held. Those are left as they are
    (`Selects.held`): inlined, the process crashed (SIGSEGV) on that undo. Within the tolerance of jax.jit."""
    m, rolls = fuzz_case(259)
    assert m.alike and not rolls and "cond" in m.about


@pytest.mark.slow
@pytest.mark.parametrize("quarter", range(4))
def test_most_generated_models_worth_rolling_roll(quarter):
    """Over a quarter of the slow seeds each (the workers share them): every model within the tolerance, no
    unlike layer in a rolled run, and at least 90% of the models with two or more alike layers roll them,
    with the whole batch and with micro-batches (over all four: 292 of 294 today, and 112 of 114; 111 with jax
    0.12; the default run has 3 more)."""
    worth, rolled = [0, 0], [0, 0]          # [whole batch, micro-batches]
    for seed in FUZZ_SLOW[quarter::4]:
        m, rolls = fuzz_case(seed)
        cut = m.slices > 1
        worth[cut] += bool(m.alike)
        rolled[cut] += bool(m.alike) and rolls
    assert rolled[0] >= 0.9 * worth[0] and rolled[1] >= 0.9 * worth[1], (rolled, worth)


def test_fit_carries_the_layers_stacked_and_gives_the_pytree_back(tmp_path, monkeypatch):
    """A pytree state through `fit` with a budget: the driver packs it with its layers stacked once
    (the rolled loops then update the layers in place), checkpoints it in the caller's layout, and
    gives the pytree back; within the tolerance of jax.jit's four steps, and a resumed run bitwise
    the uninterrupted one."""
    packs, pack = [], chunks.packed.pack
    monkeypatch.setattr(chunks.packed, "pack", lambda state, **kw: packs.append(kw) or pack(state, **kw))
    step, state, tokens = layered.rms_mlp(4, 8, 4, opt=optax.adamw(3e-4, eps=EPS))
    call = rolling(step)
    result = loopfuse.fit(call, fresh(state), tokens, 4, chunk=2, progress=False, checkpoint_dir=tmp_path / "a")
    assert packs == [{"layers": True}]
    assert jax.tree_util.tree_structure(result.state) == jax.tree_util.tree_structure(state)
    leaves_close(result.state, run(jax.jit(step), fresh(state), tokens, 4)[0])
    plain = loopfuse.fit(loopfuse.compile_step(step, keep_aux=("loss",)), fresh(state), tokens, 2, chunk=2,
                         progress=False, checkpoint_dir=tmp_path / "b")     # saved by a run that did not roll
    resumed = loopfuse.fit(call, fresh(state), tokens, 4, chunk=2, progress=False, checkpoint_dir=tmp_path / "b")
    assert resumed.resumed_from == 2 and plain.steps == 2
    leaves_close(resumed.state, result.state)


@pytest.mark.slow     # ~5 s: the suite's time
def test_fit_under_a_memory_limit_carries_the_layers_stacked(monkeypatch):
    """A limit that the step fits only rolled, and only with its layers stacked (inside one call the stack is a
    copy, which the pass declines: not worth it): `fit` carries the stacked state as with a `memory_budget`,
    and its plan rolls in one slice. Before, `fit` carried the pytree under a limit, and failed with a
    MemoryLimitError: no plan on the pytree fits."""
    packs, pack = [], chunks.packed.pack
    monkeypatch.setattr(chunks.packed, "pack", lambda state, **kw: packs.append(kw) or pack(state, **kw))
    step, state, data = layered.rms_mlp(4, 64, 64, opt=optax.adamw(1e-3, eps=EPS))
    unrolled = loopfuse.compile_step(step).loop(2).memory_stats(fresh(state), data).peak
    stacked = rolling(step).loop(2).memory_stats(pack(fresh(state), layers=True), data).peak
    limited = loopfuse.compile_step(step, keep_aux=("loss",), memory_limit=(unrolled + stacked) // 2)
    result = loopfuse.fit(limited, fresh(state), data, 4, chunk=2, progress=False)
    assert packs == [{"layers": True}]
    assert limited.loop(2).compiled(pack(fresh(state), layers=True), data).memory_plan.chosen.slices == 1
    leaves_close(result.state, run(jax.jit(step), fresh(state), data, 4)[0])


@pytest.mark.slow     # micro-batches through rolled loops by default: the micro_batches=4 tests below, fuzz seeds 43, 151
def test_one_slice_at_a_time_runs_through_the_rolled_loops():
    """micro_batches with a budget: roll-layers rolls the layers inside the micro-batch loop's body (one
    slice's loss and gradient), the stacks built once before it; the slices' sums of the layers' gradients
    carried stacked by the micro-batch loop (one carry per leaf, not per layer), which the backward loop adds
    to in place; within the tolerance of jax.jit."""
    step, state, tokens = transformer.gpt(**dict(TINY, batch=4), opt=optax.adamw(3e-4, eps=EPS))
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, micro_batches=2)
    reports = call.compiled(fresh(state), tokens).reports
    assert rolled_runs(reports["roll-layers"]) == [range(0, 4)], reports["roll-layers"]
    assert "2 slices" in reports["micro-batch"], reports["micro-batch"]
    module = parse_module(call.lower(fresh(state), tokens)["final"])
    main = next(op for op in module.body.operations if op.sym_name.value == "main")
    loop = next(op for op in main.regions[0].blocks[0].operations if "loopfuse.micro_batch" in op.attributes)
    inside = []
    loop.operation.walk(lambda op: inside.append(op) or ir.WalkResult.ADVANCE)
    stacks = [op for op in inside if op.name == "stablehlo.concatenate" and ir.IntegerAttr(op.attributes["dimension"]).value == 0
              and ir.RankedTensorType(op.results[0].type).shape[0] == TINY["layers"]]
    assert any(op.name == "stablehlo.while" for op in inside) and not stacks      # stacked before it, once
    assert "in place in stacks the micro-batch loop carries" in reports["roll-layers"], reports["roll-layers"]
    carried = [ir.RankedTensorType(v.type).shape for v in loop.operands]
    per_leaf = len(jax.tree_util.tree_leaves(state[0]["blocks"][0]))
    assert sum(shape[:1] == [TINY["layers"]] for shape in carried) == per_leaf, carried
    leaves_close(run(call, fresh(state), tokens, 2)[0], run(jax.jit(step), fresh(state), tokens, 2)[0])


def _gated(layers: int, odd: int | None = None):
    """x0 = x * v; x_{l+1} = x_l + tanh(x_l * sigmoid(g_l)) (cos of it at layer `odd`); loss sum(x_L); SGD.
    Nothing but a sigmoid reads g_l, and micro-batch computes it before its loop (it does not read the batch)."""
    def loss(p, x):
        x = x * p["v"]
        for l, g in enumerate(p["g"]):
            h = jax.numpy.tanh(x * jax.nn.sigmoid(g))
            x = x + (jax.numpy.cos(h) if l == odd else h)
        return jax.numpy.sum(x)

    def step(p, x):
        value, grads = jax.value_and_grad(loss)(p, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, grads), {"loss": value}
    state = {"v": jax.numpy.full((2,), 0.7), "g": [jax.numpy.full((2,), 0.5 * (l + 1)) for l in range(layers)]}
    return step, state, jax.numpy.linspace(-1.0, 1.0, 8).reshape(4, 2)


@pytest.mark.parametrize("packed", [False, True])
def test_layers_whose_leaves_micro_batch_reads_before_its_loop_roll_inside_it(packed):
    """micro-batch computes a layer's sigmoid(g_l) once, before its loop; roll-layers sinks it back into the
    body (`sink_leaf_ops`), so the layers roll there, within the tolerance of jax.jit, given leaf by leaf
    or packed."""
    step, state, x = _gated(3)
    call = loopfuse.compile_step(step, keep_aux=("loss",), passes="micro-batch{slices=2},roll-layers{force=true}")
    s = loopfuse.pack(fresh(state), layers=True) if packed else fresh(state)
    assert rolled_runs(call.compiled(s, x).reports["roll-layers"]) == [range(0, 3)]
    got = run(call, s, x, 2)[0]
    leaves_close(got.unpack() if packed else got, run(jax.jit(step), fresh(state), x, 2)[0])


def test_where_nothing_rolls_the_micro_batch_body_is_put_back():
    """The sunk ops go back where micro-batch put them when no run rolls: the program is micro-batch's."""
    step, state, x = _gated(3, odd=1)

    def program(passes):
        call = loopfuse.compile_step(step, keep_aux=("loss",), passes=passes)
        return call.lower(fresh(state), x)["final"].split("\n", 1)[1], call.compiled(fresh(state), x).reports

    rolled, reports = program("micro-batch{slices=2},roll-layers{force=true}")
    assert rolled_runs(reports["roll-layers"]) == [] and "did not roll" in reports["roll-layers"]
    assert rolled == program("micro-batch{slices=2}")[0]


@pytest.mark.parametrize("clipped", [False, True])
def test_a_packed_states_update_after_the_micro_batch_loop_writes_its_rows_in_place(tmp_path, clipped):
    """With micro-batches the update runs once, after the micro-batch loop: roll-layers rolls it into one loop
    over the packed buffers' rows, which writes each layer's new rows in place. Unrolled, it restacked each
    buffer with a concatenate, which XLA:CPU compiles to a copy of the donated buffer (the tied model at the
    bench's size: 64 MiB of its 160). Behind a global-norm clip too (each layer's share of the norm stays
    as it is, before the loop). Within the tolerance of jax.jit. Given leaf by leaf, the update is left as
    it is (each leaf is written in place already)."""
    opt = optax.adam(1e-2, eps=EPS)
    opt = optax.chain(optax.clip_by_global_norm(1.0), opt) if clipped else opt
    step, state, batch = layered.tied_mlp(layers=8, width=64, batch=64, opt=opt)
    packed = loopfuse.pack(fresh(state), layers=True)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, micro_batches=4,
                                 xla_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    report = call.compiled(packed, batch).reports["roll-layers"]
    assert re.search(r"^rolled the update of \[0\]\['layers'\], \[1\](\[1\])?\[0\].mu\['layers'\], "
                     r"\[1\](\[1\])?\[0\].nu\['layers'\] \[0:8\]: 8 layers of \d+ ops each, one loop writing the rows of "
                     r"3 stacked leaves in place$", report, re.M), report
    assert buffer_copies(tmp_path, packed, "layers") == []
    leaves_close(run(call, packed, batch, 2)[0].unpack(), run(jax.jit(step), fresh(state), batch, 2)[0])
    report = roll_report(loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, micro_batches=4),
                         fresh(state), batch)
    assert "the update of" not in report, report


def test_a_packed_state_rolls_over_its_rows_inside_a_micro_batch_loop():
    """A micro-batch loop's body reads a packed state's pieces from ``@main``: roll-layers finds them there as
    rows of their buffers, so rolling them stacks nothing. The tied model (its activations smaller than its
    stacked leaves) rolls packed with micro-batches, below the temporaries of its unrolled micro-batch program,
    within the tolerance of jax.jit; given leaf by leaf it does not (stacking would cost more than it saves)."""
    step, state, batch = layered.tied_mlp(layers=8, width=64, batch=64, opt=optax.adam(1e-2, eps=EPS))
    packed = loopfuse.pack(fresh(state), layers=True)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, micro_batches=4)
    assert rolled_runs(call.compiled(packed, batch).reports["roll-layers"]) == [range(0, 8)]
    assert rolled_runs(roll_report(call, fresh(state), batch)) == []
    unrolled = loopfuse.compile_step(step, keep_aux=("loss",), micro_batches=4)
    assert call.memory_stats(packed, batch).temp < 0.95 * unrolled.memory_stats(packed, batch).temp
    leaves_close(run(call, packed, batch, 2)[0].unpack(), run(jax.jit(step), fresh(state), batch, 2)[0])


@pytest.mark.slow
def test_gradient_accumulation_rolls_its_update_in_place():
    """optax.MultiSteps updates the state in a ``lax.cond`` every k steps. Its branches, elementwise ops, run
    as selects (`cond_to_select`), so the update rolls into the backward loop over the stacked rows: a third of
    jax.jit's temporaries (0.33x), where the cond kept the update after the loops and XLA copied every stacked
    buffer it read (0.78x; six blocks of 128: 0.52x, was 1.84x). Two steps take both branches (one accumulates,
    one updates); `fit` carries the stacked layout."""
    opt = optax.MultiSteps(optax.adamw(1e-3, eps=EPS), every_k_schedule=2)
    step, state, data = layered.rms_mlp(4, 32, 64, opt=opt)
    report = check_rolls(step, state, data, range(0, 4), call=(call := rolling(step)))
    assert "stacked leaves updated inside the backward loop" in report and "(cond-to-select)" in report, report
    assert packed_temp_ratio(step, state, data, call) < 0.5
    assert isinstance(chunks.carried(call.loop(2), fresh(state), data)[0], loopfuse.PackedState)


@pytest.mark.slow
def test_an_update_after_the_loops_reads_the_leaves_there_and_rolls_over_the_rows():
    """A global-norm clip keeps the update after the backward loop. Its shares that read no gradient (Adam's
    ``b1 * mu``, ``b2 * nu``, the weight decay's ``wd * p``) are left where the step computes them, not saved
    per layer by the forward loop (three stacked copies of the state, live through both loops), and the
    update rolls as a loop of its own over the packed rows, in place, as after a micro-batch loop: 0.65x
    jax.jit's temporaries on this MLP, whose parameters outweigh its activations (1.37x before; 4 blocks of
    64, batch 128: 0.64x, was 1.28x, 1.68x with the update run alone)."""
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, eps=EPS))
    step, state, data = layered.rms_mlp(4, 32, 64, opt=opt)
    report = check_rolls(step, state, data, range(0, 4), call=(call := rolling(step)))
    assert "the optimizer update runs after the backward loop" in report and "rolled the update of" in report, report
    assert packed_temp_ratio(step, state, data, call) < 0.8


@pytest.mark.slow
def test_layer_wise_learning_rates_roll_the_moments_kept_per_label():
    """``optax.multi_transform`` with a label per layer (layer-wise rate decay) keeps layer 3's moments under
    ``['l3']`` and again under ``['layers'][3]``, the other layers masked out: the paths propose the labels'
    pieces of the list as one family (`layer_runs._pieces`), so the moments roll with the parameters, each
    layer's rate a stacked constant, and are updated in place inside the backward loop: 0.34x jax.jit's
    temporaries packed, where the parameters alone rolled and the moments, read per layer, held 1.12x (six
    blocks of 128: 0.56x, was 1.88x). A label per two layers too: the group's rate and bias corrections are
    one broadcast per leaf shape that both layers read, stacked as scalars and broadcast in the loop (0.34x;
    stacked at the weights' shape, 0.86x)."""
    step, state, data = layered.rms_mlp(4, 32, 64, opt=layered.layer_wise_rates(4, eps=EPS))
    report = check_rolls(step, state, data, range(0, 4), call=(call := rolling(step)))
    assert report.startswith("rolled [0]['layers'], [1].inner_states['l*'].inner_state[0].mu['layers'], "
                             "[1].inner_states['l*'].inner_state[0].nu['layers'] [0:4]"), report
    assert "12 stacked leaves updated inside the backward loop" in report, report
    assert packed_temp_ratio(step, state, data, call) < 0.5
    step, state, data = layered.rms_mlp(4, 32, 64, opt=layered.layer_wise_rates(4, eps=EPS, per=2))
    report = check_rolls(step, state, data, range(0, 4), call=(call := rolling(step)))
    assert report.startswith("rolled [0]['layers'], [1].inner_states['l*'].inner_state[0].mu['layers'], "), report
    assert "12 stacked leaves updated inside the backward loop" in report, report
    assert packed_temp_ratio(step, state, data, call) < 0.5


@pytest.mark.slow
def test_frozen_first_layers_leave_the_trained_ones_to_roll_with_their_moments():
    """Fine-tuning the last layers (`layered.frozen_first`: ``optax.set_to_zero`` on the first): the optimizer
    keeps moments for the trained layers only, a run of its own over layers 1-3, which joins the parameters'
    run over those layers (`layer_runs.sub_partner`): they roll with their moments, updated in place, and the
    frozen layer is left as it is. 0.50x jax.jit's temporaries packed, where the parameters' layers 1-3 rolled
    without their moments and held 1.15x. LoRA too (`layered.lora_mlp`): the base weights frozen, the adapters'
    moments, a run over every layer with fewer leaves each, roll with the layers."""
    step, state, data = layered.rms_mlp(4, 32, 64, opt=layered.frozen_first(1, optax.adamw(1e-3, eps=EPS)))
    report = check_rolls(step, state, data, range(1, 4), call=(call := rolling(step)))
    assert report.startswith("rolled [0]['layers'], [1].inner_states['train'].inner_state[0].mu['layers'], "
                             "[1].inner_states['train'].inner_state[0].nu['layers'] [1:4]"), report
    assert report.endswith("layer 0 left as it is: its ops differ from the others'"), report
    assert packed_temp_ratio(step, state, data, call) < 0.75
    step, state, data = layered.lora_mlp(4, 16, 32, eps=EPS)
    report = check_rolls(step, state, data, range(0, 4))
    assert report.startswith("rolled [0]['layers'], [1].inner_states['train'].inner_state[0].mu['layers'], "), report


@pytest.mark.parametrize("shape, rolls", [((4, 64, 64, 2), False), pytest.param((4, 32, 64, 1), True, marks=pytest.mark.slow)])
def test_layers_frozen_with_stop_gradient_roll_only_where_that_holds_less(shape, rolls):
    """The first blocks read through ``lax.stop_gradient`` (`layered.rms_mlp(frozen=)`): every block computes its
    input's gradient, the others their weights' too, after the loops, from each layer's values the loops export
    stacked over every layer (`Plan._exports_kept`), where the unrolled step keeps them one layer at a time.
    Counted, the pytree step of 4 blocks of 64 (2 frozen) is left as traced, compiled as the step without a
    budget (it rolled and held 2.0x those temporaries, 1.56x jax.jit's; declined without the copy-free carry it
    held 1.28x); 4 blocks of 32 (1 frozen), where rolling saves more than the exports cost, still roll, below
    the step without a budget."""
    step, state, data = layered.rms_mlp(*shape[:3], frozen=shape[3], opt=optax.adamw(1e-3, eps=EPS))
    plain = loopfuse.compile_step(step, keep_aux=("loss",)).compiled(fresh(state), data).memory.temp
    call = rolling(step)
    compiled = call.compiled(fresh(state), data)
    assert compiled.reports["roll-layers"].startswith("rolled ") == rolls, compiled.reports["roll-layers"]
    assert compiled.memory.temp <= plain if not rolls else compiled.memory.temp < plain
    leaves_close(run(call, fresh(state), data, 2)[0], run(jax.jit(step), fresh(state), data, 2)[0])


def test_a_packed_state_that_does_not_roll_is_not_told_to_pack():
    """A U-Net's skips (each down block's output read by an up block): on a state packed with its layers stacked,
    the down blocks do not roll, since what rolling would stack inside the call is values that differ by layer
    (slices of the packed buffers that are not rows of one), not the state's leaves; the report says so, and no
    longer that `loopfuse.pack(state, layers=True)` would keep them stacked (the state is packed so already). As
    nothing rolls, it says that the stacked layout then costs a copy per call (1.99x jax.jit's temporaries at
    width 64, batch 64); a pytree is not told so."""
    rng = np.random.default_rng(0)
    d = 16
    params = {"inp": rng.normal(size=(8, d)).astype(np.float32), "mid": rng.normal(size=(d, d)).astype(np.float32),
              "down": [{"w": rng.normal(size=(d, d)).astype(np.float32), "b": np.zeros(d, np.float32)} for _ in range(3)],
              "up": [{"w": rng.normal(size=(2 * d, d)).astype(np.float32), "b": np.zeros(d, np.float32)} for _ in range(3)]}
    data = rng.normal(size=(16, 8)).astype(np.float32)

    def loss(p, x):
        x, skips = x @ p["inp"], []
        for b in p["down"]:
            x = jax.nn.gelu(x @ b["w"] + b["b"]) + x
            skips.append(x)
        x = x @ p["mid"]
        for b, skip in zip(p["up"], reversed(skips)):
            x = jax.nn.gelu(jnp.concatenate([x, skip], -1) @ b["w"] + b["b"]) + x
        return jnp.mean(x ** 2)
    opt = optax.adamw(1e-3)
    step = transformer.optax_step(loss, opt)
    packed = loopfuse.pack((params, opt.init(params)), layers=True)
    report = roll_report(rolling(step), packed, data)
    down = next(line for line in report.splitlines() if "['down']" in line)
    assert down.startswith("did not roll") and "stacking the values that differ by layer inside each call" in down, report
    assert "keeps them stacked between calls" not in report and report.splitlines()[-1] == NOT_ROLLED_STACKED, report
    assert NOT_ROLLED_STACKED not in roll_report(rolling(step), (params, opt.init(params)), data)     # a pytree


@pytest.mark.slow      # ~10 s on 2 cores (the default suite's time)
def test_fit_keeps_the_pytree_where_the_stacked_program_would_hold_more():
    """`optax.apply_if_finite` checks every gradient before its inner update lands, so the backward loop keeps
    each layer's new moments, stacked, until the check: the stacked program holds more than the step on the
    pytree (1.9x jax.jit's temporaries here, 1.75x on six blocks of 128). Where a rolled run's update runs
    after the loops, `fit` compares the two compiled programs and carries the pytree; the clipped update,
    which rolls over the packed rows in place, keeps the stacked layout."""
    opt = optax.apply_if_finite(optax.adamw(1e-3, eps=EPS), 3)
    step, state, data = layered.rms_mlp(4, 32, 16, opt=opt)
    loop = rolling(step).loop(2)
    stacked = loop.compiled(loopfuse.pack(fresh(state), layers=True), data)
    assert "the optimizer update runs after the backward loop" in stacked.reports["roll-layers"]
    assert loop.compiled(fresh(state), data).memory.temp < stacked.memory.temp
    assert not isinstance(chunks.carried(loop, fresh(state), data)[0], loopfuse.PackedState)
    clipped = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, eps=EPS))
    step, state, data = layered.rms_mlp(4, 32, 64, opt=clipped)
    loop = rolling(step).loop(2)
    assert isinstance(chunks.carried(loop, fresh(state), data)[0], loopfuse.PackedState)
