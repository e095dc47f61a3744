"""A state with leaves that are not arrays (an equinox model as equinox teaches it: ``(model, opt_state)``, whose
`eqx.nn.MLP` keeps its activation function as a leaf): those leaves are the state's structure, as
`equinox.filter_jit` holds them; every entry point takes the model and gives it back; results bitwise
`eqx.filter_jit`'s and jax.jit's."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.errors import StateMismatchError
from problems import fori_solve

OPT = optax.adam(1e-2)
X = jax.random.normal(jax.random.key(1), (16, 2))
Y = jnp.sin(X[:, :1])


def model(activation=jnp.tanh):
    return eqx.nn.MLP(2, 1, 8, 2, activation=activation, key=jax.random.key(0))


def loss(m, batch):
    x, y = batch
    return jnp.mean((jax.vmap(m)(x) - y) ** 2)


def step(state, batch):
    m, opt_state = state
    value, grads = eqx.filter_value_and_grad(loss)(m, batch)
    updates, opt_state = OPT.update(grads, opt_state, eqx.filter(m, eqx.is_array))
    return (eqx.apply_updates(m, updates), opt_state), {"loss": value}


def start(m):
    return m, OPT.init(eqx.filter(m, eqx.is_array))


def fresh(tree):
    return jax.tree_util.tree_map(lambda a: jnp.copy(a) if eqx.is_array(a) else a, tree)


def reference(state, steps: int):
    run = eqx.filter_jit(step)
    for _ in range(steps):
        state, _ = run(state, (X, Y))
    return state


def same_arrays(a, b) -> bool:
    left, right = jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array)), jax.tree_util.tree_leaves(eqx.filter(b, eqx.is_array))
    return len(left) == len(right) and all(np.array_equal(x, y) for x, y in zip(left, right))


def test_a_model_with_function_leaves_steps_as_filter_jit_does():
    compiled = loopfuse.compile_step(step)
    state = fresh(start(model()))
    for _ in range(3):
        state, aux = compiled(state, (X, Y))
    assert isinstance(state[0], eqx.nn.MLP) and state[0].activation is jnp.tanh
    assert same_arrays(state, reference(start(model()), 3))
    assert compiled.compile_count == 1
    other, _ = compiled(fresh(start(model(jax.nn.relu))), (X, Y))     # another static leaf: its own program
    assert other[0].activation is jax.nn.relu and compiled.compile_count == 2
    assert same_arrays(other, reference(start(model(jax.nn.relu)), 1))
    looped, _ = compiled.loop(3)(fresh(start(model())), (X, Y))
    assert looped[0].activation is jnp.tanh and same_arrays(looped, state)
    assert "stablehlo" in compiled.lower(start(model()), (X, Y))["final"]


def test_fit_runs_and_checkpoints_a_model_with_function_leaves(tmp_path):
    compiled = loopfuse.compile_step(step)
    first = loopfuse.fit(compiled, fresh(start(model())), (X, Y), 4, chunk=2, progress=False,
                         checkpoint_dir=tmp_path, checkpoint_every=2)
    assert isinstance(first.state[0], eqx.nn.MLP) and first.state[0].activation is jnp.tanh
    assert same_arrays(first.state, reference(start(model()), 4))
    resumed = loopfuse.fit(compiled, fresh(start(model())), (X, Y), 6, chunk=2, progress=False,
                           checkpoint_dir=tmp_path, checkpoint_every=2)
    assert resumed.resumed_from == 4 and resumed.state[0].activation is jnp.tanh
    assert same_arrays(resumed.state, reference(start(model()), 6))


def test_minimize_takes_the_model_and_gives_it_back():
    params, static = eqx.partition(model(), eqx.is_array)

    # the Adam steps as equinox teaches them (over the partitioned arrays), the loss history an output
    expected, history = fori_solve(lambda p, data: loss(eqx.combine(p, static), data), OPT, 20)(params, (X, Y))
    adam = loopfuse.minimize(loss, model(), (X, Y), OPT, steps=20)
    assert isinstance(adam.params, eqx.nn.MLP) and adam.params.activation is jnp.tanh
    assert same_arrays(adam.params, expected) and np.array_equal(adam.loss_history, history)
    lbfgs = loopfuse.minimize(loss, adam, (X, Y), optax.lbfgs(), steps=10, until=loopfuse.gtol(1e-9))
    assert lbfgs.params.activation is jnp.tanh and lbfgs.loss_history[-1] < adam.loss_history[-1]


class _Dropped(eqx.Module):
    """A linear layer after `eqx.nn.Dropout(0.1)`, whose rate and ``inference`` flag are a float and a bool leaf."""
    lin: eqx.nn.Linear
    drop: eqx.nn.Dropout

    def __call__(self, x, key):
        return self.lin(self.drop(x, key=key))


def test_an_equinox_modules_python_numbers_are_held_as_filter_jit_holds_them():
    def dropped_step(state, batch):
        m, opt_state, key = state
        key, sub = jax.random.split(key)
        keys = jax.random.split(sub, batch[0].shape[0])
        value, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(batch[0], keys) - batch[1]) ** 2))(m)
        updates, opt_state = OPT.update(grads, opt_state, eqx.filter(m, eqx.is_array))
        return (eqx.apply_updates(m, updates), opt_state, key), {"loss": value}
    m = _Dropped(eqx.nn.Linear(2, 1, key=jax.random.key(0)), eqx.nn.Dropout(0.1))
    state = (m, OPT.init(eqx.filter(m, eqx.is_array)), jax.random.key(2))
    compiled, expected = loopfuse.compile_step(dropped_step), state
    got = fresh(state)
    for _ in range(3):   # traced as jax.jit traces a bool, `if inference:` in Dropout would be a TracerBoolConversionError
        got, _ = compiled(got, (X, Y))
        expected, _ = eqx.filter_jit(dropped_step)(expected, (X, Y))
    assert type(got[0].drop.p) is float and got[0].drop.inference is False
    leaves = [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
              for x in jax.tree_util.tree_leaves(eqx.filter((got, expected), eqx.is_array))]
    assert all(np.array_equal(a, b) for a, b in zip(leaves[:len(leaves) // 2], leaves[len(leaves) // 2:]))
    assert compiled.compile_count == 1


def test_a_step_that_swaps_a_static_leaf_or_an_unhashable_one_is_named_and_loses_nothing():
    def swaps(state, batch):
        new, aux = step(state, batch)
        return (eqx.tree_at(lambda m: m.activation, new[0], jax.nn.relu), new[1]), aux
    state = fresh(start(model()))
    with pytest.raises(StateMismatchError, match=r"new state leaf \[0\]\.activation is .* where the step was given "
                                                  r"<PjitFunction of <function tanh .* must return it as given"):
        loopfuse.compile_step(swaps)(state, (X, Y))
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(eqx.filter(state, eqx.is_array)))
    with pytest.raises(StateMismatchError, match=r"state leaf \['tags'\] is a set, neither an array nor hashable"):
        loopfuse.compile_step(lambda s, b: (s, {}))({"w": jnp.ones(2), "tags": {"a"}}, ())


@pytest.mark.slow
def test_ensembles_stops_and_verify_hold_the_model_too():
    stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a * 1.1]) if eqx.is_array(a) else a, start(model()))
    members = loopfuse.fit(loopfuse.compile_step(step), fresh(stacked), (X, Y), 4, chunk=2, progress=False, ensemble=True,
                           until=lambda s, aux: s[0].activation(aux["loss"]) < 0.0)   # the predicate sees the model
    assert members.state[0].activation is jnp.tanh and list(members.steps) == [4, 4]
    first = jax.tree_util.tree_map(lambda a: a[0] if eqx.is_array(a) else a, members.state)
    for got, want in zip(jax.tree_util.tree_leaves(eqx.filter(first, eqx.is_array)),
                         jax.tree_util.tree_leaves(eqx.filter(reference(start(model()), 4), eqx.is_array))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)     # vmapped: its own last bits (README)
    solved = loopfuse.minimize(loss, stacked[0], (X, Y), OPT, steps=5, ensemble=True)
    assert solved.params.activation is jnp.tanh and solved.loss_history.shape == (2, 5)
    stopped = loopfuse.compile_step(step, verify=True).loop(3, until=lambda s, aux: s[0].activation(aux["loss"]) > 0.0)
    state, _, ran, _ = stopped(fresh(start(model())), (X, Y))
    assert int(ran) == 1 and state[0].activation is jnp.tanh and same_arrays(state, reference(start(model()), 1))
    fits = loopfuse.largest_batch(step, start(model()), lambda n: (X[:n], Y[:n]), "64MiB", max_batch=16)
    assert fits.batch_size == 16 and fits.capped
