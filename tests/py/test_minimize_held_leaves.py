"""`minimize` trains the params' floating leaves; an integer, bool or typed-key leaf (a mask, a count, a flax nnx
model's RNG state) is held as it is, as `eqx.filter_value_and_grad` leaves it out: the loss sees it, the gradient
and the optimizer do not. Results bitwise a hand-written `jax.jit` loop over `eqx.partition`'s floating part."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse

OPT = optax.adam(0.1)
X = jax.random.normal(jax.random.key(1), (16, 3))
Y = jnp.sin(X[:, :1])


def params():
    return {"w": jnp.full((3, 1), 0.5), "mask": jnp.array([[True], [False], [True]]), "scale": 2,
            "key": jax.random.key(7)}


def loss(p, batch):
    x, y = batch
    noise = 1e-3 * jax.random.normal(p["key"], y.shape)
    return jnp.mean((x @ (p["w"] * p["mask"]) * p["scale"] + noise - y) ** 2)


def _step(optimizer):
    def step(carry, held, batch):
        t, s = carry
        value, grads = jax.value_and_grad(lambda t: loss(eqx.combine(t, held), batch))(t)
        updates, s = optimizer.update(grads, s, t)
        return (optax.apply_updates(t, updates), s), value
    return step


def by_hand(p, steps: int, optimizer=OPT, per_step: bool = False):
    """``(params, loss history)``: `steps` updates of the floating leaves in one jitted fori_loop (`per_step`: one
    jitted call per step, as CompiledStep runs them), the held leaves and the data its arguments."""
    trained, held = eqx.partition(p, eqx.is_inexact_array)
    step = _step(optimizer)
    carry = (trained, optimizer.init(trained))
    if per_step:
        values = []
        for _ in range(steps):
            carry, value = jax.jit(step)(carry, held, (X, Y))
            values.append(value)
        return eqx.combine(carry[0], held), np.array(values)

    @jax.jit
    def run(carry, held, batch):
        def body(i, c):
            carry, history = c
            carry, value = step(carry, held, batch)
            return carry, history.at[i].set(value)
        carry, history = jax.lax.fori_loop(0, steps, body, (carry, jnp.zeros(steps)))
        return eqx.combine(carry[0], held), history
    return run(carry, held, (X, Y))


def same(a, b) -> bool:
    raw = lambda t: [jax.random.key_data(x) if jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key) else x
                     for x in jax.tree_util.tree_leaves(t)]
    return all(jnp.asarray(x).dtype == jnp.asarray(y).dtype and np.array_equal(x, y) for x, y in zip(raw(a), raw(b)))


@pytest.mark.parametrize("backend", [loopfuse.CompiledLoop(), loopfuse.CompiledStep(), loopfuse.CompiledLoop(steps=4)],
                         ids=["loop", "step", "chunks"])
def test_leaves_that_are_not_floating_are_held_and_the_rest_trained_as_by_hand(backend):
    expected, history = by_hand(params(), 12, per_step=isinstance(backend, loopfuse.CompiledStep))
    sol = loopfuse.minimize(loss, params(), (X, Y), OPT, steps=12, backend=backend)
    assert same(sol.params, expected) and np.array_equal(sol.loss_history, history)
    assert sol.params["mask"].dtype == jnp.bool_ and sol.params["scale"] == 2
    assert np.array_equal(jax.random.key_data(sol.params["key"]), jax.random.key_data(jax.random.key(7)))


def test_line_search_until_and_the_eager_backend_see_the_floating_leaves_only():
    adam = loopfuse.minimize(loss, params(), (X, Y), OPT, steps=8)
    lbfgs = loopfuse.minimize(loss, adam, (X, Y), optax.lbfgs(), steps=30, until=loopfuse.gtol(1e-6))
    assert lbfgs.loss_history[-1] < adam.loss_history[-1] and lbfgs.params["mask"].dtype == jnp.bool_
    eager = loopfuse.minimize(loss, params(), (X, Y), OPT, steps=12, backend=loopfuse.GradOnly())
    assert eager.params["scale"] == 2 and eager.loss_history[-1] < eager.loss_history[0]


@pytest.mark.slow
def test_a_checkpointed_solve_resumes_with_its_held_leaves(tmp_path):
    expected, history = by_hand(params(), 10)
    first = loopfuse.minimize(loss, params(), (X, Y), OPT, steps=6, checkpoint_dir=tmp_path, checkpoint_every=3)
    other = {**params(), "w": jnp.zeros((3, 1))}     # resumed from step 6: where the params start is not read
    resumed = loopfuse.minimize(loss, other, (X, Y), OPT, steps=10, checkpoint_dir=tmp_path, checkpoint_every=3)
    assert first.steps == 6 and same(resumed.params, expected) and np.array_equal(resumed.loss_history, history)


def test_a_flax_nnx_model_with_its_rng_state_is_the_params():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(3, 1, rngs=rngs)
            self.drop = nnx.Dropout(0.2, rngs=rngs)      # keeps an RNG key and a uint32 count

        def __call__(self, x):
            return self.drop(self.lin(x))

    def nnx_loss(model, batch):
        x, y = batch
        return jnp.mean((model(x) - y) ** 2)
    model = Net(nnx.Rngs(0, dropout=1))
    held = [x for x in jax.tree_util.tree_leaves(model) if not eqx.is_inexact_array(x)]
    assert held, "the model keeps no RNG state: the test would not test anything"
    sol = loopfuse.minimize(nnx_loss, model, (X, Y), OPT, steps=20)
    assert isinstance(sol.params, Net) and sol.loss_history[-1] < sol.loss_history[0]
    trained, kept = eqx.partition(sol.params, eqx.is_inexact_array)
    assert same(kept, eqx.partition(Net(nnx.Rngs(0, dropout=1)), eqx.is_inexact_array)[1])


def test_params_with_no_floating_leaf_are_named():
    with pytest.raises(TypeError, match=r"floating \(or complex\) leaves, and these have none: .*int32"):
        loopfuse.minimize(lambda p: jnp.sum(p["n"]).astype(jnp.float32), {"n": jnp.arange(3)}, steps=2)


@pytest.mark.slow
def test_an_ensemble_holds_each_members_leaves():
    """Within the README's 1e-6 of `jax.vmap` of the hand-written solve (an Adam step inside jax's vmapped loop
    compiles to other last bits, with or without held leaves)."""
    members = {"w": jax.random.normal(jax.random.key(0), (3, 3, 1)), "mask": jnp.ones((3, 3, 1), bool).at[:, 1].set(False),
               "scale": jnp.array([1, 2, 3]), "key": jax.random.split(jax.random.key(7), 3)}
    expected, history = jax.vmap(lambda p: by_hand(p, 12))(members)
    sol = loopfuse.minimize(loss, members, (X, Y), OPT, steps=12, ensemble=True)
    assert list(sol.retcode) == ["max_steps"] * 3 and sol.params["mask"].dtype == jnp.bool_
    assert same(eqx.filter(sol.params, eqx.is_inexact_array, inverse=True), eqx.filter(members, eqx.is_inexact_array, inverse=True))
    np.testing.assert_allclose(sol.params["w"], expected["w"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sol.loss_history, history, rtol=1e-6)
