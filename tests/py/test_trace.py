"""What the trace keeps of the values it sees, compared with jax.jit of the same function:
weak types, typed PRNG keys in aux, and the aux paths `keep_aux` names."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopfuse
from loopfuse.errors import AuxPathError, LoopfuseError


def avals(tree):
    """(dtype, weak type, shape) per leaf; typed keys compare by their key dtype."""
    return jax.tree_util.tree_map(lambda x: (str(x.dtype), x.aval.weak_type, x.shape), tree)


def assert_same(a, b):
    assert avals(a) == avals(b)
    raw = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x  # noqa: E731
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(raw(x)), np.asarray(raw(y)))


def ema_step(state, batch):
    """A bf16 EMA whose rate lives in the state: a weak-typed rate keeps the EMA bf16."""
    ema = state["ema"] * (1 - state["lr"]) + state["lr"] * batch
    return {"ema": ema, "lr": state["lr"], "decay": state["decay"] * 0.5}, {"scaled_lr": state["lr"] * 2}


def ema_state():
    return {"ema": jnp.ones(3, jnp.bfloat16), "lr": jnp.asarray(0.1), "decay": 0.5}


BF16_BATCH = jnp.arange(3, dtype=jnp.bfloat16)


def test_weak_types_are_kept_like_jax_jit():
    ref = jax.jit(ema_step)(ema_state(), BF16_BATCH)
    step = loopfuse.compile_step(ema_step)
    out = step(ema_state(), BF16_BATCH)
    assert_same(out, ref)
    out = step(out[0], BF16_BATCH)  # the returned weak leaves hit the same cache entry
    assert_same(out, jax.jit(ema_step)(*jax.jit(ema_step)(ema_state(), BF16_BATCH)[:1], BF16_BATCH))
    assert step.compile_count == 1


def test_weak_types_in_a_loop():
    ref_state = ema_state()
    for _ in range(3):
        ref_state, ref_aux = jax.jit(ema_step)(ref_state, BF16_BATCH)
    state, aux = loopfuse.compile_step(ema_step).loop(3)(ema_state(), BF16_BATCH)
    assert_same(state, ref_state)
    assert aux["scaled_lr"].shape == (3,) and aux["scaled_lr"].aval.weak_type == ref_aux["scaled_lr"].aval.weak_type


def test_weak_and_strong_scalars_are_separate_signatures():
    """jax.jit traces a Python float (weak) and a float32 scalar (strong) apart; so does the cache."""
    def scale(state, batch):
        return state, {"y": state * batch}

    step = loopfuse.compile_step(scale, donate=False)
    x = jnp.ones(2, jnp.bfloat16)
    for b in (2.0, np.float32(2)):
        assert_same(step(x, b), jax.jit(scale)(x, b))
    assert step.compile_count == 2


def key_step(state, batch):
    key, sub = jax.random.split(state["key"])
    return {"key": key, "w": state["w"] + jax.random.normal(sub, (2,))}, {"sub": sub, "pair": jax.random.split(sub)}


def key_state():
    return {"key": jax.random.key(0), "w": jnp.zeros(2)}


def test_typed_keys_in_aux_come_back_as_keys():
    ref = jax.jit(key_step)(key_state(), None)
    out = loopfuse.compile_step(key_step)(key_state(), None)
    assert_same(out, ref)


def test_typed_key_history_of_a_loop():
    ref_state, subs, pairs = key_state(), [], []
    for _ in range(3):
        ref_state, ref_aux = jax.jit(key_step)(ref_state, None)
        subs.append(ref_aux["sub"])
        pairs.append(ref_aux["pair"])
    state, aux = loopfuse.compile_step(key_step).loop(3)(key_state(), None)
    assert_same(state, ref_state)
    assert_same(aux, {"sub": jnp.stack(subs), "pair": jnp.stack(pairs)})


def test_a_dropped_key_aux_stays_none():
    state, aux = loopfuse.compile_step(key_step, keep_aux=("pair",))(key_state(), None)
    assert aux["sub"] is None and jnp.issubdtype(aux["pair"].dtype, jax.dtypes.prng_key)


def test_keep_aux_typo_names_the_path_and_keeps_the_state():
    step = loopfuse.compile_step(ema_step, keep_aux=("scaled_lr", "lost"))
    state = ema_state()
    with pytest.raises(AuxPathError, match=r"keep_aux names 'lost', which is no aux leaf.*\['scaled_lr'\]") as e:
        step(state, BF16_BATCH)
    assert isinstance(e.value, LoopfuseError) and isinstance(e.value, ValueError)
    assert not state["ema"].is_deleted()
    with pytest.raises(AuxPathError, match="'lost'"):
        step.loop(2)(state, BF16_BATCH)


def test_keep_aux_prefixes_select_subtrees():
    def step(state, batch):
        return state, {"m": {"a": state, "b": state + 1}, "loss": state.sum()}

    compiled = loopfuse.compile_step(step, donate=False, keep_aux=("m.b",))
    _, aux = compiled(jnp.ones(2), None)
    assert aux["m"]["a"] is None and aux["loss"] is None
    np.testing.assert_array_equal(aux["m"]["b"], 2 * np.ones(2))
    with pytest.raises(AuxPathError, match=r"'m\.c'.*\['loss', 'm\.a', 'm\.b'\]"):
        loopfuse.compile_step(step, keep_aux=("m.c",))(jnp.ones(2), None)


def nested_dead_code(state, batch):
    """A nested jit with an output nobody uses (jnp, optax and diffrax functions have them), and a
    batch leaf the step never reads."""
    kept, _ = jax.jit(lambda x: (x * 2.0, jnp.cos(x)))(state + batch["x"])
    return kept, {"loss": jnp.sum(kept)}


def test_the_trace_is_pruned_as_jax_jit_prunes_and_keeps_every_argument():
    """jax.jit removes dead code, inside nested jits too, before lowering; keep_unused=True (which the
    trace needs: every leaf has its argument) skips that. The trace prunes like jax.jit, else XLA
    may compile a loop of such a step to other last bits (a diffrax L-BFGS fit with jaxlib 0.12)."""
    state, batch = jnp.ones(3), {"x": jnp.ones(3), "ignored": jnp.zeros(2)}
    assert "stablehlo.cosine" in jax.jit(nested_dead_code, keep_unused=True).lower(state, batch).as_text()
    assert "stablehlo.cosine" not in jax.jit(nested_dead_code).lower(state, batch).as_text()
    step = loopfuse.compile_step(nested_dead_code)
    traced = step.lower(state, batch)["00-traced"]
    assert "stablehlo.cosine" not in traced
    main = next(line for line in traced.splitlines() if "func.func public @main" in line)
    assert main.count("%arg") == 3       # the state, x and the ignored leaf, in place
    want = jax.jit(nested_dead_code)(state, batch)
    assert_same(step(state, batch), want)
