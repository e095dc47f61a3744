"""Arrays a step closes over. jax 0.11+ lowers one over ``jax_embedded_constants_max_bytes`` (1 KiB) as a
leading ``@main`` argument that jax.jit's callers pass (`trace._constants_embedded`); loopfuse's programs take
the state and batch only, so it becomes a constant again behind an optimization barrier. Every program here
closes over arrays above that size; its results are jax.jit's, bitwise (with jax 0.10 the same programs embed
their constants in both)."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import loopfuse
from problems import SMALL_LOOP_KERNELS, assert_trees_equal, fresh

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(300, 4)), jnp.float32)            # 4.7 KiB each
Y = RNG.normal(size=(300,)).astype(np.float32)                     # numpy, closed over
MASK = jnp.asarray(RNG.normal(size=(300,)) > 0)                    # bool
HALF = jnp.asarray(RNG.normal(size=(300, 4)), jnp.bfloat16)
KEYS = jax.random.split(jax.random.key(1), 300)                    # typed keys
OPT = optax.adam(1e-2)


def loss(p):
    err = jnp.where(MASK, X @ p - Y, 0.0) + jnp.mean(HALF.astype(jnp.float32) @ p)
    return jnp.mean(err ** 2) + 1e-3 * jnp.mean(X)         # jnp.mean(X): a reduction XLA could fold at compile time


def step(state, batch):
    p, opt_state = state
    value, grads = jax.value_and_grad(loss)(p)
    noise = 1e-3 * jax.random.normal(KEYS[7], p.shape)
    updates, opt_state = OPT.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates) + noise * batch, opt_state), {"loss": value}


def state():
    p = jnp.arange(4.0, dtype=jnp.float32) / 4
    return p, OPT.init(p)


def test_a_step_and_its_loop_are_jax_jits_bitwise():
    reference = jax.jit(step)
    s, expected = state(), []
    for _ in range(3):
        s, aux = reference(s, jnp.float32(1.0))
        expected.append(aux["loss"])
    one = loopfuse.compile_step(step)
    got, aux = one(state(), jnp.float32(1.0))
    assert_trees_equal((got, aux), jax.jit(step)(state(), jnp.float32(1.0)))
    got, aux = one.loop(3)(state(), jnp.float32(1.0))
    scan = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: step(c, b), s, None, length=3))(state(), jnp.float32(1.0))
    assert_trees_equal((got, aux["loss"]), (scan[0], scan[1]["loss"]))
    if not SMALL_LOOP_KERNELS:         # 0.12.1 compiles this loop to one kernel: jax's scan's bits (README)
        assert_trees_equal(got, s)


def test_minimize_and_its_init_folded_in_are_the_jitted_loops_bitwise():
    """The default backend starts its loop from the params inside one program (fold-init): its init's own
    module gets the constants too (an initial state computed from a closed-over array)."""
    def init(p, batch):
        return p + X[:4, 0], OPT.init(p)
    program = loopfuse.compile_step(step).loop(5, init=init)
    got, aux = program(jnp.zeros(4), jnp.float32(1.0))
    ref = jax.jit(lambda p, b: jax.lax.scan(lambda c, _: step(c, b), init(p, b), None, length=5))(jnp.zeros(4),
                                                                                                  jnp.float32(1.0))
    assert_trees_equal((got, aux["loss"]), (ref[0], ref[1]["loss"]))

    sol = loopfuse.minimize(loss, jnp.zeros(4), optimizer=OPT, steps=20)

    def by_hand(p):
        def body(i, carry):
            p, o, h = carry
            value, g = jax.value_and_grad(loss)(p)
            u, o = OPT.update(g, o, p)
            return optax.apply_updates(p, u), o, h.at[i].set(value)
        return jax.lax.fori_loop(0, 20, body, (p, OPT.init(p), jnp.zeros(20)))
    p, _, history = jax.jit(by_hand)(jnp.zeros(4))
    assert_trees_equal((sol.params, sol.loss_history), (p, history))


@pytest.mark.parametrize("value", [np.arange(600, dtype=np.float32).reshape(300, 2) / 7,
                                   np.arange(600).astype(ml_dtypes.bfloat16).reshape(300, 2),
                                   (np.arange(600) % 3 == 0).reshape(300, 2),
                                   np.arange(600, dtype=np.int8).reshape(300, 2),
                                   np.zeros((0, 2), np.float32)],
                         ids=["float32", "bfloat16", "bool", "int8", "empty"])
def test_each_element_type_is_the_value_closed_over(value):
    table = jnp.asarray(np.concatenate([value] * 2, axis=1) if value.size else value)

    def f(s, b):
        return s + jnp.sum(table.astype(jnp.float32)) * b, {"first": table[:1]}
    assert_trees_equal(loopfuse.compile_step(f)(jnp.zeros(2), jnp.float32(1.0)),
                       jax.jit(f)(jnp.zeros(2), jnp.float32(1.0)))


def test_packed_and_rolled_programs_take_the_constants_too():
    """The opt-in passes see the same module: a packed state, and layers rolled around a closed-over table."""
    scale = jnp.asarray(RNG.normal(size=(4, 64)), jnp.float32)      # 1 KiB + : an argument with jax 0.11+

    def f(state, x):
        def loss_(ws):
            h = x
            for w in ws:
                h = h + jnp.tanh(h @ w) * scale[0]
            return jnp.mean(h ** 2)
        value, g = jax.value_and_grad(loss_)(state)
        return [w - 0.1 * gw for w, gw in zip(state, g)], {"loss": value}
    ws = [jnp.asarray(RNG.normal(size=(64, 64)) / 8, jnp.float32) for _ in range(4)]
    x = jnp.asarray(RNG.normal(size=(8, 64)), jnp.float32)
    expected = jax.jit(f)(ws, x)
    packed = loopfuse.compile_step(f, donate=False)(loopfuse.pack(fresh(ws)), x)
    rolled = loopfuse.compile_step(f, memory_budget=0.0)
    stacked, aux = rolled(loopfuse.pack(fresh(ws), layers=True), x)
    assert "rolled" in rolled.compiled(loopfuse.pack(fresh(ws), layers=True), x).reports["roll-layers"]
    np.testing.assert_allclose(np.asarray(aux["loss"]), np.asarray(expected[1]["loss"]), rtol=1e-6)
    assert_trees_equal(packed[1], expected[1])
    for a, b in zip(stacked.unpack(), expected[0]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_after_an_ordered_effects_token(capfd):
    """jax puts an ordered effect's token argument first, the closed-over array's after it."""
    def f(s, b):
        jax.debug.print("s={s}", s=s[0], ordered=True)
        return s + jnp.sum(X) * b, {}
    assert_trees_equal(loopfuse.compile_step(f).loop(2)(jnp.zeros(2), jnp.float32(1.0)),
                       jax.jit(lambda s, b: jax.lax.scan(lambda c, _: f(c, b), s, None, length=2))(jnp.zeros(2),
                                                                                               jnp.float32(1.0)))
    assert capfd.readouterr().out.count("s=") == 4            # two steps each


def test_a_closed_over_mutable_array_is_refused_by_name():
    """jax.jit's callers pass a closed-over ``jax.new_ref`` and get it back written; as a constant of loopfuse's
    program its writes would be lost (it raised jax's "Too many leaves for PyTreeDef"). One made inside runs."""
    ref = jax.new_ref(jnp.zeros(3))

    def writes(s, b):
        ref[...] = ref[...] + s
        return s * 2, {"seen": ref[...]}
    state = jnp.ones(3)
    with pytest.raises(TypeError, match=r"^writes closes over a mutable array \(jax.new_ref\)"):
        loopfuse.compile_step(writes)(state, 0.0)
    assert not state.is_deleted()

    def inside(s, b):
        own = jax.new_ref(s)
        own[...] = own[...] * 2
        return own[...], {}
    assert_trees_equal(loopfuse.compile_step(inside)(jnp.ones(3), 0.0), jax.jit(inside)(jnp.ones(3), 0.0))
