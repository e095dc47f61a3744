"""compile_step end to end: numerics against plain jax.jit, caching, stages, memory, errors."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.errors import DonatedArrayError, StateMismatchError
from problems import (adam_mlp_8x1024, assert_trees_close, assert_trees_equal, batch, fresh, init_state, jit_memory,
                      mlp_loss, mlp_params, train_step)

OPTIMIZERS = {
    "sgd": optax.sgd(0.1),
    "momentum": optax.sgd(0.1, momentum=0.9),
    "adam": optax.adam(1e-2),
    "adamw": optax.adamw(1e-2, weight_decay=1e-2),
}


@pytest.mark.parametrize("name", [n if n in ("sgd", "adam") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in OPTIMIZERS])     # by default a stateless and a stateful optimizer
def test_matches_jax_jit_for_optax_optimizers(name):
    opt = OPTIMIZERS[name]
    fn, b = train_step(opt), batch()
    ref_state, step_state = init_state(opt), fresh(init_state(opt))
    step = loopfuse.compile_step(fn)
    for _ in range(3):
        ref_state, ref_aux = jax.jit(fn)(ref_state, b)
        step_state, aux = step(step_state, b)
        assert_trees_close(step_state, ref_state)
        np.testing.assert_allclose(aux["loss"], ref_aux["loss"], rtol=1e-6)
    assert step.compile_count == 1
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(step_state))


def test_numpy_inputs_and_tuple_state():
    opt = optax.sgd(0.1)
    params = jax.tree_util.tree_map(np.asarray, mlp_params())
    state = (params, opt.init(params))
    new_state, aux = loopfuse.compile_step(train_step(opt))(state, batch())
    ref_state, _ = jax.jit(train_step(opt))(state, batch())
    assert_trees_close(new_state, ref_state)
    assert isinstance(new_state[0]["layers"][0].w, jax.Array)


def test_cache_by_signature_recompiles_only_on_new_shapes():
    opt = optax.sgd(0.1)
    step = loopfuse.compile_step(train_step(opt))
    state = init_state(opt)
    state, _ = step(state, batch(n=16))
    state, _ = step(state, batch(n=16, seed=5))
    assert step.compile_count == 1
    state, _ = step(state, batch(n=32))
    assert step.compile_count == 2
    state, _ = step(state, batch(n=16, seed=7))
    assert step.compile_count == 2


def test_static_kwargs_are_part_of_the_signature():
    def fn(p, b, *, scale):
        return p * scale, jnp.sum(p)
    step = loopfuse.compile_step(fn, donate=False)
    x = jnp.ones(3)
    np.testing.assert_allclose(step(x, x, scale=2.0)[0], 2 * np.ones(3))
    np.testing.assert_allclose(step(x, x, scale=3.0)[0], 3 * np.ones(3))
    assert step.compile_count == 2
    with pytest.raises(TypeError, match="hashable"):
        step(x, x, scale=[1])


def test_keep_aux_drops_gradients_and_their_work():
    opt = optax.sgd(0.1)
    fn, b, state = train_step(opt), batch(), init_state(opt)
    full = loopfuse.compile_step(fn, donate=False)
    lean = loopfuse.compile_step(fn, donate=False, keep_aux=("loss",))
    _, aux_full = full(state, b)
    new_state, aux = lean(state, b)
    assert aux["grads"]["layers"][0].w is None and aux["loss"] is not None
    assert aux_full["grads"]["layers"][0].w is not None
    np.testing.assert_allclose(aux["loss"], aux_full["loss"])
    final = lean.lower(state, b)["final"]
    traced = lean.lower(state, b)["00-traced"]
    assert final.count("loopfuse.result =") < traced.count("loopfuse.result =")
    assert lean.memory_stats(state, b).output < full.memory_stats(state, b).output


def test_lower_gives_every_stage():
    opt = optax.adam(1e-3)
    stages = loopfuse.compile_step(train_step(opt)).lower(init_state(opt), batch())
    names = list(stages)
    assert names[0] == "00-traced" and names[-1] == "final"
    assert names[1:-1] == ["01-after-drop-unused-outputs", "02-after-alias-state"]
    assert "tf.aliasing_output" in stages["final"] and "tf.aliasing_output" not in stages["00-traced"]


def test_compiling_leaves_the_traced_stage_as_traced():
    """The executable keeps its trace (what jax gave) apart from its final module (what XLA compiled)."""
    opt = optax.sgd(0.1)
    ex = loopfuse.compile_step(train_step(opt)).loop(3).compiled(init_state(opt), batch())
    assert "stablehlo.while" not in str(ex.traced.module) and "tf.aliasing_output" not in str(ex.traced.module)
    assert "func.func private @loopfuse_step" in str(ex.module) and "tf.aliasing_output" in str(ex.module)


def test_abstract_states_of_other_shapes_are_other_signatures():
    """jax.ShapeDtypeStruct leaves are keyed by their shape, dtype and weak type (they were all one
    signature: the second state got the first one's program and memory)."""
    step = loopfuse.compile_step(lambda s, b: (s * b, {}))
    small = step.memory_stats(jax.ShapeDtypeStruct((4,), jnp.float32), jnp.float32(2))
    large = step.memory_stats(jax.ShapeDtypeStruct((400,), jnp.float32), jnp.float32(2))
    assert (small.output, large.output, step.compile_count) == (16, 1600, 2)
    step.memory_stats(jax.ShapeDtypeStruct((4,), jnp.float32, weak_type=True), jnp.float32(2))
    assert step.compile_count == 3


def test_compile_step_takes_the_step_options_and_their_defaults():
    """compile_step's keywords are StepOptions' fields (documented there), with the same defaults;
    `Step.loop` sets the loop's."""
    import dataclasses
    import inspect
    params = dict(list(inspect.signature(loopfuse.compile_step).parameters.items())[1:])
    fields = {f.name: f.default for f in dataclasses.fields(loopfuse.StepOptions) if f.init}
    assert {name: p.default for name, p in params.items()} == {
        name: d for name, d in fields.items() if name not in ("until", "stop_on_nonfinite", "init")}
    assert all(f"{name}:" in loopfuse.StepOptions.__doc__ for name in fields)
    assert all(f"\n    {name}: " in loopfuse.compile_step.__doc__ for name in params)        # help(compile_step)
    with pytest.raises(TypeError, match="compile_step\\(\\) got an unexpected keyword argument 'until'"):
        loopfuse.compile_step(lambda s, b: (s, {}), until=lambda s, a: True)


def test_alias_state_peak_memory_of_adam_8x1024_mlp_is_below_0_6x_jax_jit():
    fn, state, b = adam_mlp_8x1024()
    ours = loopfuse.compile_step(fn).memory_stats(state, b)
    theirs = jit_memory(fn, state, b).peak
    state_bytes = 2 * 8 * 1024 * 1024 * 4 * 3 // 2  # params, mu, nu: 3 x 32 MiB
    assert ours.alias >= state_bytes - 1024  # every param and moment buffer is reused
    assert ours.peak <= 0.6 * theirs, (ours, theirs)
    no_donation = loopfuse.compile_step(fn, donate=False).memory_stats(state, b)
    assert no_donation.alias == 0 and no_donation.peak > ours.peak


def test_donation_updates_in_place_and_rejects_reuse():
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt))
    state = fresh(init_state(opt))
    new_state, _ = step(state, batch())
    assert state[0]["layers"][0].w.is_deleted()
    with pytest.raises(DonatedArrayError, match=r"\[0\]\['layers'\]\[0\]\.w.*donate=False"):
        step(state, batch())
    kept = fresh(init_state(opt))
    loopfuse.compile_step(train_step(opt), donate=False)(kept, batch())
    assert not kept[0]["layers"][0].w.is_deleted()


def test_same_buffer_in_two_leaves_is_donated_safely():
    w = jnp.ones(3)
    out, _ = loopfuse.compile_step(lambda s, b: (jax.tree_util.tree_map(lambda x: x + b, s), 0.0))({"a": w, "b": w}, 1.0)
    np.testing.assert_allclose(out["a"], 2 * np.ones(3))
    np.testing.assert_allclose(out["b"], 2 * np.ones(3))


def test_state_structure_change_names_the_leaf():
    def grows(p, b):
        return {**p, "extra": jnp.zeros(2)}, 0.0
    with pytest.raises(StateMismatchError, match="extra leaves.*extra"):
        loopfuse.compile_step(grows)({"w": jnp.ones(2)}, 0.0)

    def reshapes(p, b):
        return {"w": p["w"].reshape(1, 2)}, 0.0
    with pytest.raises(StateMismatchError, match=r"state leaf \['w'\] enters the step as float32\[2\] but leaves it as float32\[1, 2\]"):
        loopfuse.compile_step(reshapes)({"w": jnp.ones(2)}, 0.0)
    with pytest.raises(StateMismatchError, match=r"^the state enters the step as float32\[2\] but leaves it as"):
        loopfuse.compile_step(lambda p, b: (p.reshape(1, 2), 0.0))(jnp.ones(2), 0.0)     # a bare array as the state

    with pytest.raises(StateMismatchError, match=r"must return \(new_state, aux\)"):
        loopfuse.compile_step(lambda p, b: p)({"w": jnp.ones(2)}, 0.0)


def test_a_step_that_returns_another_kind_of_state_says_so_in_a_few_leaves():
    """checkify.checkify(step) returns (Error, (state, aux)): the message names the kinds and a few of the Error's
    leaves, cut short, not its every internal repr (it listed ErrorEffect and jaxlib Traceback objects)."""
    from jax.experimental import checkify

    def step(s, b):
        checkify.check(jnp.all(s > -100), "state too small {x}", x=s.sum())
        return s * 0.5, {"m": s.mean()}
    with pytest.raises(StateMismatchError, match=r"its new state is of type Error where the state given is of type") as e:
        loopfuse.compile_step(checkify.checkify(step))(jnp.arange(4.0), None)
    assert len(str(e.value)) < 1000 and "Traceback object" not in str(e.value)


@pytest.mark.parametrize("fn, key, entered, left", [
    (lambda k, b: (jax.random.key_data(k), {}), lambda: jax.random.key(0), "key<fry>[]", "uint32[2]"),
    (lambda k, b: (jax.random.wrap_key_data(k), {}), lambda: jax.random.PRNGKey(0), "uint32[2]", "key<fry>[]"),
    (lambda k, b: (jax.random.key(1, impl="rbg"), {}), lambda: jax.random.key(0), "key<fry>[]", "key<rbg>[]")],
    ids=["typed-to-raw", "raw-to-typed", "other-impl"])
def test_a_key_leaf_that_changes_kind_is_named(fn, key, entered, left):
    """A typed key crosses the executable as its raw data: a step that returned the data for the key (or the
    reverse) compiled and came back as the other kind, where jax.jit returns what the step does."""
    with pytest.raises(StateMismatchError, match=re.escape(f"the state enters the step as {entered} but leaves it "
                                                           f"as {left}")):
        loopfuse.compile_step(fn).loop(2)(key(), 0.0)


def test_failed_call_keeps_the_callers_state():
    opt = optax.sgd(0.1)
    step = loopfuse.compile_step(train_step(opt))
    state = fresh(init_state(opt))
    bad = {"x": np.ones((16, 5), np.float32), "y": np.ones((16, 1), np.float32)}  # wrong feature size
    with pytest.raises(TypeError):
        step(state, bad)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    new_state, _ = step(state, batch())  # still usable
    assert_trees_close(new_state, jax.jit(train_step(opt))(init_state(opt), batch())[0])


def test_inject_hyperparams_changes_learning_rate_without_recompiling():
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)
    fn = train_step(opt)
    step = loopfuse.compile_step(fn)
    state = fresh(init_state(opt))
    ref = init_state(opt)
    for lr in (1e-2, 1e-1, 0.0):
        state[1].hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
        ref[1].hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
        before = np.asarray(state[0]["layers"][0].w)
        state, _ = step(state, batch())
        ref, _ = jax.jit(fn)(ref, batch())
        assert_trees_close(state, ref)
        if lr == 0.0:
            np.testing.assert_array_equal(np.asarray(state[0]["layers"][0].w), before)
    assert step.compile_count == 1


def test_typed_prng_key_in_state_roundtrips():
    def fn(state, b):
        key, sub = jax.random.split(state["key"])
        return {"key": key, "w": state["w"] + jax.random.normal(sub, (2,))}, 0.0
    state = {"key": jax.random.key(0), "w": jnp.zeros(2)}
    ours, _ = loopfuse.compile_step(fn, donate=False)(state, None)
    ref, _ = jax.jit(fn)(state, None)
    np.testing.assert_array_equal(jax.random.key_data(ours["key"]), jax.random.key_data(ref["key"]))
    np.testing.assert_allclose(ours["w"], ref["w"])


@pytest.mark.slow     # the steps are jax.jit's (test_matches_jax_jit_for_optax_optimizers); fit's tests train
def test_mlp_loss_decreases_with_adam():
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt), keep_aux=("loss",))
    state, losses = init_state(opt), []
    for _ in range(50):
        state, aux = step(state, batch())
        losses.append(float(aux["loss"]))
    assert losses[-1] < 0.7 * losses[0]
    assert mlp_loss(state[0], batch()) == pytest.approx(losses[-1], rel=0.05)


def test_non_array_leaf_is_named():
    step = loopfuse.compile_step(lambda s, b: (s, 0.0))
    with pytest.raises(StateMismatchError, match=r"state leaf \['name'\] is ndarray array\(\['abc'\]"):
        step({"w": jnp.ones(2), "name": np.array(["abc"])}, None)
    assert step({"w": jnp.ones(2), "name": "abc"}, None)[0]["name"] == "abc"   # not an array: structure (test_static_leaves)
    with pytest.raises(StateMismatchError, match=r"batch leaf \['x'\] is object"):
        step({"w": jnp.ones(2)}, {"x": object()})
    with pytest.raises(StateMismatchError, match=r"^the batch is object"):      # the batch is that one leaf
        step({"w": jnp.ones(2)}, object())


def test_float64_host_state_is_canonicalized_and_shares_the_cache():
    step = loopfuse.compile_step(lambda s, b: (s * b, 0.0))
    x, _ = step(np.ones(3), np.float64(2))  # float64 numpy in, float32 (x64 off) out
    x, _ = step(x, jnp.float32(3.0))
    assert x.dtype == jnp.float32 and step.compile_count == 1
    np.testing.assert_allclose(x, 6 * np.ones(3))


def _add_batch(s, b):
    return jax.tree_util.tree_map(lambda x: x + b, s), 0.0


@pytest.mark.parametrize("make, error, match", [
    (lambda: loopfuse.compile_step(_add_batch, steps=True), TypeError, "steps must be a positive int, got bool True"),
    (lambda: loopfuse.compile_step(_add_batch, steps=0), ValueError, "steps must be a positive int, got 0"),
    (lambda: loopfuse.compile_step(_add_batch).loop(2**31), ValueError, r"steps must be below 2\*\*31.*int32"),
    (lambda: loopfuse.compile_step(_add_batch).loop(3.0), TypeError, "steps must be a positive int, got float"),
    (lambda: loopfuse.CompiledLoop(steps=2**31), ValueError, r"CompiledLoop\(steps=...\) must be below 2\*\*31"),
    (lambda: loopfuse.minimize(lambda p: jnp.sum(p**2), jnp.ones(2), steps=True), TypeError, "steps must be a positive"),
    (lambda: loopfuse.minimize(lambda p: jnp.sum(p**2), jnp.ones(2), steps=2**31), ValueError, "below 2\\*\\*31"),
], ids=["bool", "zero", "loop-2**31", "loop-float", "CompiledLoop-2**31", "minimize-bool", "minimize-2**31"])
def test_step_counts_are_validated_before_tracing(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_loop_options_are_the_steps_options_with_steps_replaced():
    import dataclasses
    step = loopfuse.compile_step(_add_batch, donate=False, passes=["simplify"])
    assert step.loop(3) is step.loop(3)
    assert step.loop(3).options == dataclasses.replace(step.options, steps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.options.steps = 2


def test_a_loop_started_from_its_init_is_the_init_then_the_loop_in_one_call():
    """`Step.loop(K, init=...)` takes x in the state's place and computes, bit for bit, the K steps from jax.jit
    of the init (verified by `verify` too); x is never donated, and what it refuses it names."""
    opt = optax.adam(1e-2)
    fn, x, b = train_step(opt), mlp_params((3, 4, 1)), batch(n=4, d_in=3)

    def init(params, batch):
        return jax.tree_util.tree_map(jnp.copy, (params, opt.init(params)))
    step = loopfuse.compile_step(fn, keep_aux=("loss",), verify=True)
    got = step.loop(5, init=init)(x, b)
    assert_trees_equal(got, step.loop(5)(jax.jit(init)(x, b), b))
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(x))
    assert_trees_equal(step.loop(5, init=init)(x, b), got)                     # x again: kept, same program
    assert step.compile_count == 0 and step.loop(5, init=init).compile_count == 1
    with pytest.raises(ValueError, match=r"init starts a loop .* not with until=.*stop_on_nonfinite=True"):
        step.loop(5, until=lambda s, a: a["loss"] < 0, stop_on_nonfinite=True, init=init)
    with pytest.raises(TypeError, match="init must be callable"):
        step.loop(5, init=1)
    with pytest.raises(ValueError, match=r"init starts a loop of 2 or more `steps` .* not with steps=1"):
        step.loop(1, init=init)
    with pytest.raises(TypeError, match="a loop started from its init takes a fixed batch, not a Dataset"):
        step.loop(5, init=init)(x, loopfuse.Dataset(b, batch_size=2))
    inlined = loopfuse.compile_step(fn, keep_aux=("loss",), passes="inline,symbol-dce")    # the init, public
    assert_trees_equal(inlined.loop(5, init=init)(x, b), got)                             # till fold-init, stays
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(x))


def test_what_a_loop_started_from_its_init_cannot_hold_is_an_init_fold_error():
    """Ordered effects (their tokens are state the init does not make), typed PRNG keys in the state, an init
    with effects of its own: each an InitFoldError naming it, raised before anything runs."""
    def keyed(s, b):
        w, key = s
        key, sub = jax.random.split(key)
        return (w + jax.random.normal(sub, w.shape), key), {"loss": jnp.sum(w)}

    def ordered(s, b):
        jax.debug.print("w {}", s, ordered=True)
        return s + b, {"loss": jnp.sum(s)}

    def printing(x, b):
        jax.debug.print("init {}", x)
        return x * 1.0
    x = jnp.ones(2)
    cases = [(keyed, lambda x, b: (x * 1.0, jax.random.key(0)), "typed PRNG keys"),
             (ordered, lambda x, b: x * 1.0, "ordered effects"), (ordered, printing, "ordered effects"),
             (lambda s, b: (s + b, {"loss": jnp.sum(s)}), printing, "an init with effects")]
    for fn, init, what in cases:
        with pytest.raises(loopfuse.InitFoldError, match=what):
            loopfuse.compile_step(fn, keep_aux=("loss",)).loop(2, init=init)(x, 1.0)


def test_start_is_reserved_and_cannot_swallow_a_static_argument():
    def scaled(s, b, *, start):
        return s * start, 0.0
    with pytest.raises(TypeError, match="'scaled' takes an argument named 'start'.*reserves.*rename it"):
        loopfuse.compile_step(scaled)
    out, _ = loopfuse.compile_step(lambda start, b: (start + b, 0.0))(jnp.ones(2), 1.0)  # state named start is fine
    np.testing.assert_allclose(out, 2 * np.ones(2))


def _shared_buffer_states():
    a = jnp.ones(3)
    yield (a, a)
    a = jnp.ones(3)
    yield (a, jax.device_put(np.asarray(a)))  # another Array object over the same buffer (CPU zero-copy)
    n = np.ones(3, np.float32)
    yield {"m": n, "n": n}


@pytest.mark.parametrize("devices", [None, jax.devices()[:1]], ids=["one-device", "mesh"])
def test_one_buffer_behind_two_state_leaves_is_donated_safely(devices):
    step = loopfuse.compile_step(_add_batch, devices=devices)
    for state in _shared_buffer_states():
        out, _ = step(state, 1.0)
        for leaf in jax.tree_util.tree_leaves(out):
            np.testing.assert_array_equal(leaf, 2 * np.ones(3))


def test_what_a_step_derives_is_built_once_and_kept_with_it():
    step = loopfuse.compile_step(lambda s, b: (s + b, {"s": s}))
    built: list = []
    make = lambda: built.append(1) or object()      # noqa: E731
    assert step.derived(("test",), make) is step.derived(("test",), make) and built == [1]
    assert step.loop(3) is step.loop(np.int64(3)) is not step.loop(3, stop_on_nonfinite=True)
    with pytest.raises(TypeError, match="stop_on_nonfinite must be a bool, got 1"):
        step.loop(3, stop_on_nonfinite=1)          # equal to True as a key: checked before it is looked up
    with pytest.raises(TypeError, match="steps must be a positive int, got bool True"):
        step.loop(True)


def test_a_loop_of_one_step_is_not_started_inside_its_program():
    """XLA inlines a one-trip loop, fusing the init's ops with the step's across fold-init's barrier: this step
    from this init was 1 ulp off the step from jax.jit's init with jax 0.10 (`loop(1, init=...)` is refused, in
    `test_a_loop_started_from_its_init_is_the_init_then_the_loop_in_one_call`); a loop of 2 or 3 keeps the init
    apart. `minimize(..., steps=1)` makes its initial state apart (it raised that ValueError)."""
    def step_fn(s, b):
        w, m, k = s
        k, sub = jax.random.split(k)
        g = 2 * (w - b) + 0.01 * jax.random.normal(sub, w.shape)
        m = 0.9 * m + g
        return (w - 0.1 * m, m, k), {"loss": jnp.sum((w - b) ** 2)}

    def init(x, b):
        return b * 2, x, jax.random.PRNGKey(0)
    b, x = jnp.array([0.5, -1.0, 2.0]), jnp.array([1.0, 2.0, 3.0])
    for k in (2, 3):
        assert_trees_equal(loopfuse.compile_step(step_fn).loop(k, init=init)(x, b),
                           loopfuse.compile_step(step_fn).loop(k)(jax.jit(init)(x, b), b))
    opt = optax.sgd(0.1)
    sol = loopfuse.minimize(lambda w, b: jnp.sum(jnp.sin(2 * w - b) ** 2), x, b, opt, steps=1)
    state = jax.jit(lambda p: (jnp.copy(p), opt.init(p)))(x)
    value, g = jax.jit(jax.value_and_grad(lambda w: jnp.sum(jnp.sin(2 * w - b) ** 2)))(state[0])
    assert_trees_equal((sol.params, sol.loss_history), (jax.jit(lambda p, g: p - 0.1 * g)(state[0], g), value[None]))


def test_a_leaf_that_is_no_array_is_named_by_its_path():
    """jax.jit's message named an output position of loopfuse's own traced function (``flat``, ``[1][1]``)."""
    def my_step(s, b):
        return s + 1, {"loss": jnp.sum(s), "x": "not an array"}
    state = jnp.ones(2)
    with pytest.raises(TypeError, match=r"^my_step returned a str as aux leaf \['x'\]: every leaf of \(new_state, "
                                        r"aux\) must be an array or a number"):
        loopfuse.compile_step(my_step).loop(3)(state, 0.0)
    with pytest.raises(TypeError, match=r"^<lambda> returned a str as new state leaf \['w'\]: "):
        loopfuse.compile_step(lambda s, b: ({"w": "w"}, {}))({"w": state}, 0.0)
    assert not state.is_deleted()


@pytest.mark.parametrize("option, value, match", [
    ("cache_dir", 5, "cache_dir must be a folder .* got int 5"),
    ("cache_dir", b"/tmp/x", "cache_dir must be a folder .* got bytes"),
    ("dump_ir", 3, "dump_ir must be a folder .* got int 3"),
    ("device", "cpu:0", r"device must be a jax device \(e.g. jax.devices\(\)\[0\].* got str 'cpu:0'")])
def test_an_option_of_the_wrong_type_is_named_by_compile_step(option, value, match):
    """They were accepted, then failed inside pathlib or as "'str' object has no attribute 'platform'" at the
    first call."""
    with pytest.raises(TypeError, match=match):
        loopfuse.compile_step(lambda s, b: (s, {}), **{option: value})
