"""wrap-loop end to end: ``compile_step(fn).loop(K)`` in one call equals K separate calls.

The references are K calls of ``compile_step(fn)`` and K calls of plain ``jax.jit(fn)``; for a
`loopfuse.Dataset` the batch each step sees is recomputed here in plain Python/NumPy (not via
``Dataset.batch``), and a step function that returns the example indices it trained on makes the
per-step batch selection directly observable in the [K] aux history.
"""
import functools
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Dataset, compile_step
from problems import assert_trees_close, assert_trees_equal

K = 5
RTOL, ATOL = 1e-5, 1e-6

OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.1),
    "momentum": lambda: optax.sgd(0.1, momentum=0.9),
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=1e-2),
}


class Meta(NamedTuple):
    """Non-parameter state in a NamedTuple, with a nested tuple: a step counter and a constant."""

    steps: jax.Array
    extra: tuple


def init_params(seed: int = 0) -> dict:
    """A small MLP as nested dict / list / tuple: 4 -> 8 -> 8 -> 2."""
    k = jax.random.split(jax.random.key(seed), 3)
    return {
        "layers": [
            {"w": jax.random.normal(k[0], (4, 8)) * 0.5, "b": jnp.zeros(8)},
            {"w": jax.random.normal(k[1], (8, 8)) * 0.3, "b": jnp.full(8, 0.1, jnp.float32)},
        ],
        "head": (jax.random.normal(k[2], (8, 2)) * 0.3, jnp.zeros(2)),
    }


def mlp(params, x):
    h = x
    for layer in params["layers"]:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    w, b = params["head"]
    return h @ w + b


def make_step(opt):
    def step(state, batch):
        def loss_fn(p):
            return jnp.mean((mlp(p, batch["x"]) - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        meta = state["meta"]
        new_state = {"params": params, "opt": opt_state,
                     "meta": Meta(meta.steps + 1, (meta.extra[0], [meta.extra[1][0] * 1.0]))}
        aux = {"loss": loss}
        if "idx" in batch:  # which examples this step trained on
            aux["rows"] = batch["idx"]
        return new_state, aux

    return step


def make_state(opt, seed: int = 0) -> dict:
    """A fresh state each time (compiled steps donate, i.e. consume, the state they are given)."""
    params = init_params(seed)
    return {"params": params, "opt": opt.init(params),
            "meta": Meta(jnp.int32(0), (jnp.float32(2.0), [jnp.ones(3)]))}


def data(n: int = 16):
    x = jax.random.normal(jax.random.key(1), (n, 4))
    y = jnp.sin(x[:, :2]) + 0.1 * jax.random.normal(jax.random.key(2), (n, 2))
    return np.asarray(x), np.asarray(y)


def run_jit(step, state, batches):
    """Plain jax.jit, one call per step; returns the final state and the per-step losses."""
    jitted = jax.jit(step)
    losses = []
    for b in batches:
        state, aux = jitted(state, b)
        losses.append(float(aux["loss"]))
    return state, np.array(losses)


# ---- fixed batch -------------------------------------------------------------------------------
# momentum and AdamW slow: the shuffled Dataset test runs momentum by default; AdamW is Adam and a decay
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n in ("momentum", "adamw") else ())
                                  for n in sorted(OPTIMIZERS)])
def test_loop_equals_separate_calls(name):
    opt = OPTIMIZERS[name]()
    step = make_step(opt)
    x, y = data()
    batch = {"x": x, "y": y}

    loop = compile_step(step).loop(K)
    loop_state, loop_aux = loop(make_state(opt), batch)
    assert loop_aux["loss"].shape == (K,)

    single = compile_step(step)
    state, losses = make_state(opt), []
    for _ in range(K):
        state, aux = single(state, batch)
        assert aux["loss"].shape == ()
        losses.append(float(aux["loss"]))
    assert single.compile_count == 1

    jit_state, jit_losses = run_jit(step, make_state(opt), [batch] * K)

    assert_trees_close(loop_state, state)
    assert_trees_close(loop_state, jit_state)
    np.testing.assert_allclose(np.asarray(loop_aux["loss"]), losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(loop_aux["loss"]), jit_losses, rtol=RTOL, atol=ATOL)
    assert int(loop_state["meta"].steps) == K
    assert losses[-1] < losses[0]  # it does train

    # The returned state feeds the next call with no retrace/recompile; a second loop call is steps K..2K-1.
    loop_state2, loop_aux2 = loop(loop_state, batch)
    for _ in range(K):
        state, aux = single(state, batch)
    assert loop.compile_count == 1 and single.compile_count == 1
    assert_trees_close(loop_state2, state)
    assert int(loop_state2["meta"].steps) == 2 * K


def test_loop_ir_has_one_while_and_compiles_once():
    opt = OPTIMIZERS["adam"]()
    step = make_step(opt)
    x, y = data()
    batch = {"x": x, "y": y}
    loop = compile_step(step).loop(K)

    state = make_state(opt)
    for _ in range(3):
        state, aux = loop(state, batch)
    assert loop.compile_count == 1
    assert int(state["meta"].steps) == 3 * K
    # A new pytree of the same shapes hits the cache too.
    loop(make_state(opt, seed=1), batch)
    assert loop.compile_count == 1

    final = loop.lower(make_state(opt), batch)["final"]
    assert len(re.findall(r"\bstablehlo\.while\b", final)) == 1
    assert "func.func private @loopfuse_step" in final
    main = re.search(r"func\.func (?:public )?@main\((.*)$", final, re.M).group(1)
    assert f"tensor<{K}xf32>" in main.split("->", 1)[1]  # the loss history
    assert "stablehlo.dynamic_update_slice" in final


# ---- Dataset -------------------------------------------------------------------------------------
N, BS = 24, 8          # 3 batches per epoch
KD = 7                 # > batches per epoch: the loop wraps into the next epochs


def dataset_arrays():
    x, y = data(N)
    return {"x": x, "y": y, "idx": np.arange(N, dtype=np.int32)}


def expected_rows_no_key(num_steps: int) -> list:
    """Step i reads batch (i mod batches-per-epoch) in file order; the partial tail is dropped."""
    nb = N // BS
    return [np.arange((i % nb) * BS, (i % nb + 1) * BS) for i in range(num_steps)]


def expected_rows_shuffled(key, num_steps: int) -> list:
    nb = N // BS
    orders = [np.asarray(jax.random.permutation(jax.random.fold_in(key, e), N)) for e in range(-(-num_steps // nb))]
    return [orders[i // nb][(i % nb) * BS:(i % nb + 1) * BS] for i in range(num_steps)]


def reference_batches(arrays, rows) -> list:
    return [{k: v[r] for k, v in arrays.items()} for r in rows]


@functools.lru_cache(maxsize=None)
def no_key_reference(name: str, num_steps: int):
    """Plain jax.jit on the batches a key-less Dataset serves: (final state, losses)."""
    opt = OPTIMIZERS[name]()
    rows = expected_rows_no_key(num_steps)
    return run_jit(make_step(opt), make_state(opt), reference_batches(dataset_arrays(), rows))


# Every optimizer runs on the fixed batch above (with -m slow); the Dataset paths do not depend on the
# optimizer, so (to keep the suite fast) each Dataset mode runs with two of them, the first one also
# against K separate compile_step calls, the second with -m slow.
@pytest.mark.parametrize("name", ["adam", pytest.param("sgd", marks=pytest.mark.slow)])
def test_dataset_no_key_wraps_epochs(name):
    opt = OPTIMIZERS[name]()
    step = make_step(opt)
    arrays = dataset_arrays()
    ds = Dataset({k: jnp.asarray(v) for k, v in arrays.items()}, batch_size=BS)
    assert ds.batches_per_epoch == 3 and KD > ds.batches_per_epoch

    loop = compile_step(step).loop(KD)
    state1, aux1 = loop(make_state(opt), ds)                 # steps 0..KD-1
    state1_host = jax.tree_util.tree_map(np.asarray, state1)  # state1 is donated to the next call
    state2, aux2 = loop(state1, ds, start=KD)               # steps KD..2KD-1
    assert loop.compile_count == 1

    rows = expected_rows_no_key(2 * KD)
    np.testing.assert_array_equal(np.asarray(aux1["rows"]), np.stack(rows[:KD]))
    np.testing.assert_array_equal(np.asarray(aux2["rows"]), np.stack(rows[KD:]))

    ref_state, ref_losses = no_key_reference(name, 2 * KD)
    history = np.concatenate([np.asarray(aux1["loss"]), np.asarray(aux2["loss"])])
    np.testing.assert_allclose(history, ref_losses, rtol=RTOL, atol=ATOL)
    assert_trees_close(state2, ref_state)
    if name != "adam":
        return

    # K separate compiled calls with start=i see the same batches.
    single = compile_step(step)
    state, losses = make_state(opt), []
    for i in range(KD):
        state, aux = single(state, ds, start=i)
        np.testing.assert_array_equal(np.asarray(aux["rows"]), rows[i])
        losses.append(float(aux["loss"]))
    assert single.compile_count == 1
    np.testing.assert_allclose(np.asarray(aux1["loss"]), losses, rtol=RTOL, atol=ATOL)
    assert_trees_close(state1_host, state)


@pytest.mark.parametrize("name", ["momentum", pytest.param("adamw", marks=pytest.mark.slow)])
def test_dataset_shuffled_with_key(name):
    opt = OPTIMIZERS[name]()
    step = make_step(opt)
    arrays = dataset_arrays()
    key = jax.random.key(0)
    ds = Dataset({k: jnp.asarray(v) for k, v in arrays.items()}, batch_size=BS, key=key)

    loop = compile_step(step).loop(KD)
    state_loop, aux = loop(make_state(opt), ds)
    got = np.asarray(aux["rows"])
    assert got.shape == (KD, BS)

    # Every full epoch visits every example exactly once, in a shuffled order that changes per epoch.
    nb = N // BS
    epochs = [got[e * nb:(e + 1) * nb].reshape(-1) for e in range(KD // nb)]
    for e in epochs:
        np.testing.assert_array_equal(np.sort(e), np.arange(N))
    assert not np.array_equal(epochs[0], np.arange(N))
    assert not np.array_equal(epochs[0], epochs[1])

    rows = expected_rows_shuffled(key, KD)
    np.testing.assert_array_equal(got, np.stack(rows))
    ref_state, ref_losses = run_jit(step, make_state(opt), reference_batches(arrays, rows))
    np.testing.assert_allclose(np.asarray(aux["loss"]), ref_losses, rtol=RTOL, atol=ATOL)
    assert_trees_close(state_loop, ref_state)
    if name != "momentum":
        return

    single = compile_step(step)
    state = make_state(opt)
    for i in range(KD):
        state, a = single(state, ds, start=i)
        np.testing.assert_array_equal(np.asarray(a["rows"]), rows[i])
    assert_trees_close(state_loop, state)
    assert single.compile_count == 1 and loop.compile_count == 1


def test_loop_keep_aux_history_only_for_kept():
    """keep_aux drops the unkept aux before the loop is built: only the loss gets a history."""
    opt = OPTIMIZERS["adam"]()
    ds = Dataset({k: jnp.asarray(v) for k, v in dataset_arrays().items()}, batch_size=BS)
    loop = compile_step(make_step(opt), keep_aux=("loss",)).loop(2 * KD)
    state, aux = loop(make_state(opt), ds)
    assert aux["loss"].shape == (2 * KD,)
    assert aux["rows"] is None
    ref_state, ref_losses = no_key_reference("adam", 2 * KD)
    np.testing.assert_allclose(np.asarray(aux["loss"]), ref_losses, rtol=RTOL, atol=ATOL)
    assert_trees_close(state, ref_state)


def test_loop_rejects_bad_steps():
    with pytest.raises(ValueError, match="positive int"):
        compile_step(make_step(optax.sgd(0.1))).loop(0)
    assert issubclass(loopfuse.StateMismatchError, ValueError)


def _decay(state, target):
    """w moves toward `target` at rate c; c (given weakly typed) decays strongly typed."""
    w, c = state
    return (w - c * (w - target), c * jnp.float32(0.9)), {"loss": jnp.sum((w - target) ** 2)}


def test_a_weakly_typed_state_leaf_is_carried_as_lax_scan_carries_it():
    """A weak leaf whose new value is strong is traced strong, as lax.scan promotes its carry: the loop
    equals the jitted scan, and the strongly typed state it returns runs the same executable."""
    w, target = jnp.arange(3.0), jnp.ones(3)
    loop = compile_step(_decay).loop(4)
    scan = jax.jit(lambda s, t: jax.lax.scan(lambda c, _: _decay(c, t), s, None, length=4))
    state, aux = loop((jnp.copy(w), jnp.asarray(0.5)), target)
    assert_trees_equal((state, aux), scan((w, jnp.asarray(0.5)), target))
    assert not state[1].weak_type
    assert_trees_equal(loop(state, target), scan(scan((w, jnp.asarray(0.5)), target)[0], target))
    assert loop.compile_count == 1


def _weak_flags(tree):
    return [x.aval.weak_type for x in jax.tree_util.tree_leaves(tree)]


def test_a_weak_state_is_promoted_from_one_trace():
    """Adam over weakly typed params (jnp.full): the step returns the params and second moments strongly
    typed, and the first moments weakly typed but computed from them. The loop traces the step once (the
    trace shows that weak types decide no dtype there), carries all of them strongly typed, runs one
    executable for every call (the state it returns included) and computes the jitted scan's bits."""
    opt, traced = optax.adam(1e-2), []

    def step(state, target):
        traced.append(1)
        params, opt_state = state
        loss, grads = jax.value_and_grad(lambda p: sum(jnp.sum((p[k] - target[k]) ** 2) for k in p))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss}

    def weak_state():
        params = {"a": jnp.full((3,), 0.5), "b": jnp.full((2, 2), 0.5)}
        return params, opt.init(params)
    target = {"a": jnp.arange(3.0), "b": jnp.ones((2, 2))}
    assert sum(_weak_flags(weak_state())) == 6
    loop = compile_step(step).loop(3)
    out = loop(weak_state(), target)
    assert len(traced) == 1 and not any(_weak_flags(out))
    scan = jax.jit(lambda s, t: jax.lax.scan(lambda c, _: step(c, t), s, None, length=3))
    want = scan(weak_state(), target)
    assert_trees_equal(out, want)
    assert_trees_equal(loop(out[0], target), scan(want[0], target))
    assert loop.compile_count == 1


def test_a_weak_aux_leaf_of_a_promoted_leaf_is_typed_as_the_promoted_step_types_it():
    """The aux returns the weak leaf the loop promotes: the step traced on the weak state would return it
    weakly typed, the promoted step (the program every call runs) strongly typed; so the loop traces the
    step again to type it, and returns it as jax.jit of the step on the promoted state does."""
    def step(state, target):
        new, aux = _decay(state, target)
        return new, {**aux, "c": state[1]}

    loop = compile_step(step).loop(4)
    out = loop((jnp.arange(3.0), jnp.asarray(0.5)), jnp.ones(3))
    promoted = jax.jit(step)((jnp.arange(3.0), jnp.float32(0.5)), jnp.ones(3))
    assert _weak_flags(out[1]) == _weak_flags(promoted[1]) == [False, False]
    assert_trees_equal(out, jax.jit(lambda s, t: jax.lax.scan(lambda c, _: step(c, t), s, None, length=4))(
        (jnp.arange(3.0), jnp.asarray(0.5)), jnp.ones(3)))
    assert _weak_flags(loop(out[0], jnp.ones(3))[1]) == [False, False] and loop.compile_count == 1


def test_a_leaf_whose_dtype_the_promotion_would_change_keeps_its_weak_type():
    """bf16 w times a weak f32 c stays bf16; promoted, it would become f32 (lax.scan refuses that
    loop): the leaf stays weakly typed in every step, as the step traced alone."""
    def step(state, _):
        w, c = state
        return (w * c, c * jnp.float32(1.0)), {"w": w}

    state, aux = compile_step(step).loop(2)((jnp.ones(2, jnp.bfloat16), jnp.asarray(0.5)), ())
    assert state[0].dtype == jnp.bfloat16 and state[0].tolist() == [0.25, 0.25]
    assert aux["w"].tolist() == [[1.0, 1.0], [0.5, 0.5]]


def _blocked_step(state, data):
    """A step whose tensors are all small: a [3] weight, a scalar rate, a [4] batch index into data."""
    w, c = state
    row = jax.lax.dynamic_index_in_dim(data, c.astype(jnp.int32) % 4, keepdims=False)
    new = (w - 0.1 * (w - row), c + 1.0)
    return new, {"loss": jnp.sum((w - row) ** 2), "w": w, "n": c.astype(jnp.int32)}


def _blocked_state():
    return jnp.arange(3.0), jnp.float32(0.0)


def test_a_long_loop_of_a_small_step_writes_its_histories_in_blocks():
    """On a CPU, a loop of more steps than a history of 512 bytes holds, of a step whose tensors are all
    smaller, writes its histories in blocks (a loop over blocks around a loop over a block's steps), so
    XLA:CPU runs its body sequentially: rows of the widest history per block ([3] float32: 42). It
    computes bitwise what the jitted scan does, a last block shorter than the others included."""
    data = jnp.arange(12.0).reshape(4, 3)
    loop = compile_step(_blocked_step).loop(100)
    executable = loop.compiled(_blocked_state(), data)
    assert executable.passes[1] == loopfuse.passes.WrapLoop(steps=100, rows=42)
    assert str(executable.module).count("stablehlo.while") == 2
    scan = jax.jit(lambda s, d: jax.lax.scan(lambda c, _: _blocked_step(c, d), s, None, length=100))
    assert_trees_equal(loop(_blocked_state(), data), scan(_blocked_state(), data))
    small = compile_step(_blocked_step).loop(40)       # its histories fit: one loop
    assert str(small.compiled(_blocked_state(), data).module).count("stablehlo.while") == 1
    large = compile_step(lambda s, d: _blocked_step(s, jnp.tile(d, (40, 1)))).loop(100)   # a [160, 3] tensor
    assert str(large.compiled(_blocked_state(), data).module).count("stablehlo.while") == 1


def test_a_blocked_loop_stops_mid_block_as_a_plain_loop_does():
    """until stops at step 50 (in the second block of 42): steps run, the flag, the state and the
    histories are a loop's of 50 steps, the rows of the steps not run NaN (0 for an integer leaf); a
    call after the stop runs no step."""
    data = jnp.arange(12.0).reshape(4, 3)
    loop = compile_step(_blocked_step).loop(100, until=lambda s, aux: s[1] >= 50)
    state, aux, steps, stopped = loop(_blocked_state(), data)
    assert (int(steps), bool(stopped)) == (50, True)
    want_state, want_aux = jax.jit(lambda s, d: jax.lax.scan(lambda c, _: _blocked_step(c, d), s, None, length=50))(
        _blocked_state(), data)
    assert_trees_equal(state, want_state)
    assert_trees_equal(jax.tree_util.tree_map(lambda h: h[:50], aux), want_aux)
    assert np.isnan(np.asarray(aux["loss"])[50:]).all() and not np.asarray(aux["n"])[50:].any()
    again = loop.after(stopped, state, data)
    assert int(again[2]) == 0 and bool(again[3])


def test_a_blocked_loop_gives_a_dataset_the_global_step_index():
    """The step index a Dataset batch is chosen by runs on across blocks: start + i, i the step's
    index in the whole loop."""
    def step(w, batch):
        return w + jnp.sum(batch["x"]), {"x": batch["x"][:, 0]}
    ds = Dataset({"x": jnp.arange(32.0).reshape(16, 2)}, batch_size=2)
    loop = compile_step(step).loop(300)
    assert str(loop.compiled(jnp.float32(0), ds).module).count("stablehlo.while") == 2
    _, aux = loop(jnp.float32(0), ds, start=5)
    want = np.asarray([[2 * ((5 + i) % 8 * 2), 2 * ((5 + i) % 8 * 2 + 1)] for i in range(300)], np.float32)
    np.testing.assert_array_equal(np.asarray(aux["x"]), want)
