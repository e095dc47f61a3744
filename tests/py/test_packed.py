"""`loopfuse.pack`: a state kept packed between calls. Packing and unpacking move elements and nothing
else; a `Step` called with a `PackedState` computes bitwise what `jax.jit` of the same packed program
computes, passes only the buffers, and returns a packed state; against the unpacked program XLA's
fusion of the slices and concatenates changes last bits of two programs (measured tolerances below),
as it does for the pack-state pass."""
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import loopfuse
from loopfuse.state import packed
from corpus import PROGRAMS, marked
from problems import assert_trees_close, assert_trees_equal, batch, fresh, init_state, train_step
from test_pack_state import CLIP, FLATTEN_RTOL, OPTIMIZERS, PARAMS

K = 3
# XLA compiles these packed loops to other last bits than the unpacked ones: (rtol, atol) (measured:
# clipped Adam 7.8e-8 relative with jax 0.10.2, with 0.12 1.7e-5 relative, 3.7e-9 absolute, on a
# gradient of 2e-4; the RNN 2.5e-6 relative with 0.10.2, 4.5e-7 with 0.12; the sort/top-k fit's Adam
# update 1.4e-7 relative with 0.12, as in test_pack_state); every other case here, the other 13 corpus
# programs included, is bitwise with both.
TOLERANCE = {"clip": (1e-5, 1e-8), "rnn": (1e-5, 0.0), "sort_top_k": (1e-6, 0.0)}


def _cases():
    cases = {name: lambda o=o: (train_step(o()), init_state(o(), PARAMS), batch(), "steps")
             for name, o in [("adam", OPTIMIZERS["adam"]), ("sgd_momentum", OPTIMIZERS["sgd_momentum"]),
                             ("schedule", OPTIMIZERS["schedule"]), ("clip", CLIP)]}
    for name in PROGRAMS:
        cases[name] = lambda name=name: (lambda p: (p.fn, p.state, p.batch, p.loop_reference))(PROGRAMS[name]())
    return cases


CASES = _cases()
# Slow: the corpus programs not in `corpus.DEFAULT`; Adam (its packed state is within the schedule's and
# clipped Adam's) and momentum (the parameters' buffer and the trace's: Adam's without nu and the count).
NAMES = marked(CASES, slow=("adam", "sgd_momentum"))


def _reference(kind, fn, state, data):
    """K jax.jit steps of `fn` (aux stacked), or jax.jit of their hand-written lax.scan."""
    if kind == "scan":
        return jax.jit(lambda s, b: lax.scan(lambda c, _: fn(c, b), s, None, length=K))(state, data)
    step, auxes = jax.jit(fn), []
    for _ in range(K):
        state, aux = step(state, data)
        auxes.append(aux)
    return state, jax.tree_util.tree_map(lambda *rows: jnp.stack(rows), *auxes)


def test_pack_and_unpack_move_elements_only():
    state = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.full(3, 7.0, jnp.float32), "big": jnp.ones(5000),
             "h": jnp.ones(4, jnp.bfloat16), "g": jnp.zeros((2, 2), jnp.bfloat16), "count": jnp.int32(3),
             "lr": 0.5, "key": jax.random.key(0), "raw": np.float32([1.5, 2.5])}
    p = loopfuse.pack(state)
    assert [(x.dtype, x.shape) for x in p.buffers] == [(jnp.float32, (11,)), (jnp.bfloat16, (8,))]  # b raw w, g h
    assert len(p.kept) == 4        # big (> 4,096 elements), count (alone of its dtype), lr (weak), key
    params = {"layers": [{"w": jnp.ones((2, 2)), "b": jnp.ones(2)}, {"w": jnp.ones(3), "b": jnp.ones(1)}]}
    assert [x.shape for x in loopfuse.pack(params).buffers] == [(10,)]    # repeated siblings: one buffer
    assert [x.shape for x in loopfuse.pack({"params": params, "mu": params}).buffers] == [(10,), (10,)]
    # a mirrored subtree (the same structure under another parent, as optimizer moments) apart
    assert np.asarray(p.buffers[0]).tolist() == [7.0] * 3 + [1.5, 2.5] + list(range(6))
    out = p.unpack()
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(state)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(state)):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert not state["w"].is_deleted()
    with pytest.raises(TypeError, match="packed already"):
        loopfuse.pack(p)


class _Moments(NamedTuple):
    mu: dict
    nu: dict


def test_pack_layers_stacks_named_layers_in_key_order_and_no_fields_of_a_class():
    """A dict of alike named layers (no index anywhere) is stacked leaf by leaf in its keys' order, the
    order jax gives a step iterating it; a class's fields (an optimizer state's mu and nu) are no layers."""
    def layer(v):
        return {"w": jnp.full((2, 2), v, jnp.float32), "b": jnp.full(2, v, jnp.float32)}
    p = loopfuse.pack({"blocks": {"elm": layer(1.0), "ash": layer(2.0)}}, layers=True)
    assert [np.asarray(x).tolist() for x in p.buffers] == [[2.0, 2.0, 1.0, 1.0], [2.0] * 4 + [1.0] * 4]  # b, w
    moments = _Moments(layer(1.0), layer(2.0))
    assert [np.asarray(x).tolist() for x in loopfuse.pack(moments, layers=True).buffers] == \
        [np.asarray(x).tolist() for x in loopfuse.pack(moments).buffers] == [[1.0] * 6 + [2.0] * 6]   # not stacked


def test_weakly_typed_layer_leaves_stay_apart_with_a_warning_naming_them():
    """A bias made from a Python scalar without a dtype is weak: stacked, it would come back strongly typed, so
    it stays apart (its layers then roll stacked inside each call); pack says so and names the leaves."""
    def layers(make):
        return {"layers": [{"w": jnp.ones((4, 4)), "b": make()} for _ in range(3)]}

    with pytest.warns(UserWarning, match=r"3 layer leaves are weakly typed and stay unstacked \(\['layers'\]\[0\]\['b'\]"):
        weak = loopfuse.pack(layers(lambda: jnp.full((4,), 0.01)), layers=True)
    assert len(weak.kept) == 3 and all(x.weak_type for x in weak.kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strong = loopfuse.pack(layers(lambda: jnp.full((4,), 0.01, jnp.float32)), layers=True)
    assert not strong.kept and len(strong.buffers) == 2


def test_layers_stacked_by_index_from_keys_that_sort_otherwise_are_packed_again_in_place():
    """Twelve layers ``Block_0`` .. ``Block_11`` (linen's names for GPT-2's blocks): jax orders the leaves by
    key, ``Block_10`` before ``Block_2``, and `pack` stacks them by index. A call's new state is packed by the
    layout's offsets, not in leaf order (which put layer 10's rows where layer 2's are read: the second step
    ran on shuffled layers), so a packed loop is jax.jit's loop."""
    blocks = {f"Block_{l}": {"w": jnp.full((2, 2), l, jnp.float32)} for l in range(12)}
    p = loopfuse.pack({"params": blocks}, layers=True)
    assert np.asarray(p.buffers[0]).tolist() == [float(l) for l in range(12) for _ in range(4)]
    assert_trees_equal(p.layout.pack(p.unpack()).buffers, p.buffers)
    rng = np.random.default_rng(0)
    params = {f"Block_{l}": {"w": jnp.asarray(rng.normal(size=(4, 4)) / 2, jnp.float32)} for l in range(12)}

    def loss(p, x):
        for l in range(12):
            x = x + jnp.tanh(x @ p[f"Block_{l}"]["w"])
        return jnp.mean(x ** 2)
    opt = optax.sgd(0.1)

    def step(state, x):
        params, opt_state = state
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}
    x = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    state = (params, opt.init(params))
    got, _ = loopfuse.compile_step(step, keep_aux=("loss",)).loop(3)(loopfuse.pack(fresh(state), layers=True), x)
    want = fresh(state)
    for _ in range(3):
        want, _ = jax.jit(step)(want, x)
    assert_trees_equal(got.unpack(), want)


@pytest.mark.parametrize("name", NAMES)
def test_loop_on_packed_state_equals_jax_jit(name):
    """loop(K) on a packed state: bitwise jax.jit of the same packed program; the unpacked result
    bitwise (or within the measured tolerance) the unpacked program's."""
    fn, state, data, kind = CASES[name]()
    got_state, got_aux = loopfuse.compile_step(fn).loop(K)(loopfuse.pack(fresh(state)), data)
    assert isinstance(got_state, loopfuse.PackedState)
    p = loopfuse.pack(fresh(state))
    assert p.buffers        # something is packed (a one-leaf program's parameters with Adam's moments)
    assert_trees_equal((got_state, got_aux), _reference(kind, packed.on_packed(fn, p.layout), p, data))
    expected = _reference(kind, fn, fresh(state), data)
    if name in TOLERANCE:
        rtol, atol = TOLERANCE[name]
        assert_trees_close((got_state.unpack(), got_aux), expected, rtol=rtol, atol=atol)
    else:
        assert_trees_equal((got_state.unpack(), got_aux), expected)


@pytest.mark.parametrize("name", NAMES)
def test_flatten_on_a_packed_state_within_tolerance(name):
    """``pack-state{flatten=true}`` regroups a packed state's buffer per role and runs the alike
    updates once over each group: within its tolerance of the unpacked jax.jit reference (measured over
    the corpus: the transformer 2.7e-7 absolute on a small element, the RNN 1.2e-6 relative, batchnorm
    in last bits, the other programs bitwise)."""
    fn, state, data, kind = CASES[name]()
    loop = loopfuse.compile_step(fn, passes=["pack-state{flatten=true}"]).loop(K)
    got_state, got_aux = loop(loopfuse.pack(fresh(state)), data)
    assert_trees_close((got_state.unpack(), got_aux), _reference(kind, fn, fresh(state), data),
                       rtol=FLATTEN_RTOL, atol=1e-6)


@pytest.mark.parametrize("passes", [None, ["pack-state"], ["pack-state{flatten=true}"]], ids=["default", "pack", "flatten"])
def test_leaves_returned_unchanged(passes):
    """A step that returns packed leaves as they came (frozen parameters c and d, 1-D and 2-D),
    bitwise jax.jit's scan of it, with and without pack-state splitting the buffer (whose per-role
    regrouping moves c from [7:9] of the buffer to [3:5] of its group's)."""
    def fn(s, x):
        new = {"a": s["a"] - 0.1 * x, "b": s["b"] * 1.5, "c": s["c"], "d": s["d"]}
        return new, {"loss": jnp.sum(s["a"])}
    state = {"a": jnp.ones(3), "b": jnp.ones((2, 2)), "c": jnp.arange(2.0), "d": jnp.full((2, 3), 2.0, jnp.float32)}
    x = jnp.arange(3.0)
    got = loopfuse.compile_step(fn, passes=passes).loop(K)(loopfuse.pack(state), x)
    want = jax.jit(lambda s, b: lax.scan(lambda c, _: fn(c, b), s, None, length=K))(state, x)
    assert_trees_equal((got[0].unpack(), got[1]), want)


def test_a_call_passes_the_buffers_donated():
    fn, state, data, _ = CASES["adam"]()
    loop = loopfuse.compile_step(fn).loop(K)
    original = fresh(state)
    p = loopfuse.pack(original)
    assert len(jax.tree_util.tree_leaves(p)) == 4     # f32 buffers of the params, mu and nu; Adam's int32 count
    final = loop.lower(p, data)["final"]
    main = next(line for line in final.splitlines() if "func.func public @main" in line)
    assert main.count("%arg") == 4 + len(jax.tree_util.tree_leaves(data))
    assert main.count("tf.aliasing_output") == 4       # all donated into the outputs
    new, _ = loop(p, data)
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(p))
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(original))   # pack copied every leaf
    with pytest.raises(loopfuse.DonatedArrayError, match=r"state leaf \.buffers\[0\]"):
        loop(p, data)
    loop(new, data)    # the state loopfuse returned is packed like the one it took


def test_one_program_per_layout_counted_by_the_step():
    fn, state, data, _ = CASES["adam"]()
    loop = loopfuse.compile_step(fn).loop(K)
    p = loopfuse.pack(fresh(state))
    for _ in range(3):
        p, _ = loop(p, data)
    assert loop.compile_count == 1
    loop(loopfuse.pack(fresh(state)), data)         # another packing of the same state: same program
    assert loop.compile_count == 1
    loop(fresh(state), data)                        # unpacked: its own program
    assert loop.compile_count == 2


@pytest.mark.slow      # ~10 s on 2 cores (the default suite's time)
def test_until_sees_the_unpacked_state():
    """A stopping loop on a packed state: `verify` checks it against jax.jit steps of the packed
    program; it stops where the unpacked loop stops, within 1e-6 relative or 1e-8 absolute (XLA fuses
    the packed Adam step of this loop to other last bits: measured 1 ulp, 1.2e-9 on a gradient)."""
    fn, state, data, _ = CASES["adam"]()

    def until(s, aux):     # reads a params leaf by its path: it has moved by 0.025
        return jnp.abs(s[0]["layers"][0].w[0, 0] - PARAMS["layers"][0].w[0, 0]) > 0.025
    loop = loopfuse.compile_step(fn, verify=True).loop(10, until=until)
    got, aux, steps, stopped = loop(loopfuse.pack(fresh(state)), data)
    want, want_aux, want_steps, want_stopped = loop(fresh(state), data)
    assert 1 < int(steps) == int(want_steps) < 10 and bool(stopped) and bool(want_stopped)
    assert_trees_close((got.unpack(), aux), (want, want_aux), rtol=1e-6, atol=1e-8)


def test_fit_keeps_the_state_packed():
    """fit on a packed state runs the packed loops (chunks of 3, 3, 1 steps) and returns a packed
    state; unpacked, within 1e-5 relative or 1e-7 absolute of fit on the unpacked state (XLA fuses
    the packed one-step loop of this Adam MLP to other last bits: measured 1.7e-8 on a gradient)."""
    fn, state, data, _ = CASES["adam"]()
    step = loopfuse.compile_step(fn)
    result = loopfuse.fit(step, loopfuse.pack(fresh(state)), data, 7, chunk=3, progress=False)
    assert isinstance(result.state, loopfuse.PackedState) and result.steps == 7
    p, rows = loopfuse.pack(fresh(state)), []
    for k in (3, 3, 1):
        p, aux = step.loop(k)(p, data)
        rows.append(aux)
    assert_trees_equal((result.state, result.history),
                       (p, jax.tree_util.tree_map(lambda *r: np.concatenate(r), *rows)))
    expected = loopfuse.fit(step, fresh(state), data, 7, chunk=3, progress=False)
    assert_trees_close((result.state.unpack(), result.history), (expected.state, expected.history),
                       rtol=1e-5, atol=1e-7)


def test_a_step_that_changes_a_leaf_is_named_by_its_path():
    def fn(state, data):
        return {"a": state["a"].astype(jnp.float16), "b": state["b"]}, {"loss": jnp.sum(state["a"])}
    with pytest.raises(loopfuse.StateMismatchError, match=r"\['a'\] enters the step as float32\[3\]"):
        loopfuse.compile_step(fn)(loopfuse.pack({"a": jnp.ones(3), "b": jnp.ones(2)}), None)



def test_fit_checkpoints_a_packed_state_and_resumes_bitwise(tmp_path):
    """fit with checkpoints on a packed state: a run of 4 steps resumed to 8 ends bitwise where an
    uninterrupted run of 8 does; the restored state is a PackedState of the same layout."""
    pytest.importorskip("orbax.checkpoint")
    fn, state, data, _ = CASES["adam"]()
    step = loopfuse.compile_step(fn)

    def run(directory, n):
        return loopfuse.fit(step, loopfuse.pack(fresh(state)), data, n, chunk=2, progress=False,
                            checkpoint_dir=directory, checkpoint_every=2)
    whole, first = run(tmp_path / "whole", 8), run(tmp_path / "cut", 4)
    restored = run(tmp_path / "cut", 4)                  # nothing left to run: the restored state itself
    assert restored.resumed_from == 4 and isinstance(restored.state, loopfuse.PackedState)
    assert restored.state.layout == loopfuse.pack(state).layout
    assert_trees_equal(restored.state, first.state)
    resumed = run(tmp_path / "cut", 8)
    assert resumed.resumed_from == 4 and resumed.steps == 8
    assert_trees_equal((resumed.state, resumed.history), (whole.state, whole.history))


def test_a_packed_state_inside_the_state_is_refused_by_its_path():
    """A PackedState nested in the state would reach the step function as the object: a Step call
    and fit raise TypeError naming where it is, before running or donating anything."""
    def fn(state, x):
        return jax.tree_util.tree_map(lambda a: a - 0.1 * x, state), {"loss": jnp.sum(x)}
    state = {"model": loopfuse.pack({"a": jnp.ones(2), "b": jnp.zeros(2)}), "step": jnp.ones(2)}
    step = loopfuse.compile_step(fn)
    match = r"state\['model'\] is a PackedState inside the state pytree.*loopfuse\.pack\(state\)"
    for run in (lambda: step(state, jnp.ones(2)), lambda: step.loop(K)(state, jnp.ones(2)),
                lambda: loopfuse.fit(step, state, jnp.ones(2), 4, chunk=2, progress=False)):
        with pytest.raises(TypeError, match=match):
            run()
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert np.asarray(state["model"].buffers[0]).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert step.compile_count == 0


def test_a_checkpoint_of_another_packing_is_refused(tmp_path):
    """Resuming from a checkpoint of a state packed to the same buffers in another layout (a float32[3]
    and a float32[2] leaf swapped: one float32[5] buffer either way) is refused, naming the leaf."""
    pytest.importorskip("orbax.checkpoint")

    def fn(state, x):
        return jax.tree_util.tree_map(lambda a: a * x, state), {"loss": x}
    step, x = loopfuse.compile_step(fn), jnp.float32(0.5)
    loopfuse.fit(step, loopfuse.pack({"a": jnp.ones(3), "b": jnp.ones(2)}), x, 2, chunk=2, progress=False,
                 checkpoint_dir=tmp_path)
    other = loopfuse.pack({"a": jnp.ones(2), "b": jnp.ones(3)})
    with pytest.raises(loopfuse.StateMismatchError, match=r"\['a'\] \(.buffers\[0\] at 0\) is float32\[3\] there"):
        loopfuse.fit(step, other, x, 4, chunk=2, progress=False, checkpoint_dir=tmp_path)
