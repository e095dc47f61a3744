"""fit(..., ensemble=True): N copies of a state trained in one call, each with its own stop.

Reference: ``jax.jit(jax.vmap(run))`` of one member's run written by hand (a ``lax.while_loop`` of the
step function, its aux history and its stop), over batches of the ensemble's tile size.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Ensemble, FitError, per_member
from problems import assert_trees_close, assert_trees_equal, batch, fresh, mlp_params, stack_trees, train_step, vmapped_in_tiles

RETCODES = {0: "max_steps", 1: "until", 2: "non_finite"}


def vmapped_fit(fn, state, data, steps, until=None, watch=False, keep=("loss",), own=False, tile=None):
    """(state, history {kept: [N, steps]}, steps [N], retcode [N]) of jax.jit(jax.vmap(run)) over tiles."""
    def run(s, b):
        def cond(c):
            return (c[0] < steps) & (c[-1] == 0)

        def body(c):
            i, s, h, _ = c
            new, aux = fn(s, b)
            flag = until(new, aux) if until is not None else False
            bad = jnp.any(jnp.stack([~jnp.isfinite(aux[k]).all() for k in keep])) if watch else False
            h = {k: h[k].at[i].set(aux[k]) for k in keep}
            return i + 1, new, h, jnp.where(bad, 2, jnp.where(flag, 1, 0))

        shapes = jax.eval_shape(fn, s, b)[1]
        h = {k: jnp.full((steps, *shapes[k].shape), jnp.nan, shapes[k].dtype) for k in keep}
        i, s, h, code = jax.lax.while_loop(cond, body, (0, s, h, 0))
        return s, h, i, code

    s, h, i, code = vmapped_in_tiles(run, state, data, own, tile)
    return s, h, i, np.array([RETCODES[int(c)] for c in code])


def stepped_fit(fn, state, data, steps, own=False, tile=None):
    """The host-driven reference of a run without stops: ``jax.jit(jax.vmap(fn))`` called once per step, over
    tiles of `tile` members: (state, {"loss": [N, steps]})."""
    n = jax.tree_util.tree_leaves(state)[0].shape[0]
    tile = tile or n
    go = jax.jit(jax.vmap(fn, in_axes=(0, 0 if own else None)))
    states, losses = [], []
    for a in range(0, n, tile):
        s, d = (jax.tree_util.tree_map(lambda x: x[a:a + tile], t) for t in (state, data if own else None))
        rows = []
        for _ in range(steps):
            s, aux = go(s, d if own else data)
            rows.append(np.asarray(aux["loss"]))
        states.append(s)
        losses.append(np.stack(rows, 1))
    return jax.tree_util.tree_map(lambda *x: np.concatenate(x), *states), {"loss": np.concatenate(losses)}


def members(n=8):
    """n MLPs of other initial weights, stacked (leaves [n, ...])."""
    return stack_trees([mlp_params(seed=s) for s in range(n)])


def sweep_state(opt, rates):
    """Params and inject_hyperparams state per member, member m with learning rate rates[m]."""
    params = members(len(rates))
    state = jax.vmap(opt.init)(params)
    state.hyperparams["learning_rate"] = jnp.asarray(rates, jnp.float32)
    return params, state


def assert_result_is(result, reference, keep=("loss",)):
    state, history, steps, retcode = reference
    np.testing.assert_array_equal(result.steps, steps)
    np.testing.assert_array_equal(result.retcode, retcode)
    assert_trees_equal(result.state, state)
    for k in keep:
        assert result.history[k].shape[:2] == (len(steps), steps.max())
        assert_trees_equal(result.history[k], history[k][:, :steps.max()])


SWEEP = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
RATES = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]        # the last ones diverge


# the default tile of this small MLP's step is one tile of 8 (test_ensemble_tiles)
@pytest.mark.parametrize("tile", [2, pytest.param(None, marks=pytest.mark.slow)], ids=["tiles-of-2", "default"])
def test_a_learning_rate_sweep_stops_each_member_on_its_own(tile):
    step = loopfuse.compile_step(train_step(SWEEP), keep_aux=("loss",))
    until = lambda state, aux: aux["loss"] < 0.3       # noqa: E731
    result = loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 120, chunk=32, progress=False, until=until,
                          stop_on_nonfinite=True, ensemble=Ensemble(tile=tile))
    reference = vmapped_fit(train_step(SWEEP), sweep_state(SWEEP, RATES), batch(), 120, until, watch=True,
                            tile=tile or Ensemble().tile_size(step.fn, sweep_state(SWEEP, RATES), batch()))
    assert_result_is(result, reference)
    assert set(result.retcode) == {"until", "non_finite", "max_steps"}
    assert jax.tree_util.tree_leaves(result.history["grads"]) == [] and result.resumed_from == 0     # not kept
    assert np.isnan(result.history["loss"][0, result.steps[0]:]).all() or result.steps[0] == result.steps.max()


def test_a_deep_ensemble_with_per_member_batches_is_the_vmapped_step():
    """Adam on an MLP: bitwise jax.jit(jax.vmap(step)) called once per step; XLA compiles the vmapped
    `while_loop` of the step to other last bits (so it does one member's unbatched loop), within 1e-6."""
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt), keep_aux=("loss",))
    params = members(8)
    data = stack_trees([batch(seed=s) for s in range(8)])
    result = loopfuse.fit(step, fresh((params, jax.vmap(opt.init)(params))), per_member(data), 40, chunk=16,
                          progress=False, ensemble=Ensemble(tile=2))
    assert (result.retcode == "max_steps").all() and (result.steps == 40).all()
    state, history = stepped_fit(train_step(opt), (params, jax.vmap(opt.init)(params)), data, 40, own=True, tile=2)
    assert_trees_equal((result.state, result.history["loss"]), (state, history["loss"]))
    state, history, _, _ = vmapped_fit(train_step(opt), (params, jax.vmap(opt.init)(params)), data, 40, own=True)
    assert_trees_close((result.state, result.history["loss"]), (state, history["loss"]), rtol=1e-5, atol=1e-6)


def test_a_one_member_ensemble_is_the_plain_fit():
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt), keep_aux=("loss",))
    until = lambda state, aux: aux["loss"] < 0.5        # noqa: E731
    plain = loopfuse.fit(step, (mlp_params(), opt.init(mlp_params())), batch(), 30, chunk=8, progress=False, until=until)
    one = loopfuse.fit(step, jax.tree_util.tree_map(lambda x: x[None], (mlp_params(), opt.init(mlp_params()))),
                       batch(), 30, chunk=8, progress=False, until=until, ensemble=True)
    assert one.steps.tolist() == [plain.steps] and one.retcode.tolist() == [plain.retcode] == ["until"]
    assert_trees_equal(jax.tree_util.tree_map(lambda x: x[0], (one.state, one.history)), (plain.state, plain.history))


def test_the_ensembles_step_is_derived_from_the_members_and_compiled_once():
    """The ensemble's Step is kept with the member's (`Step.derived`): a second fit compiles nothing."""
    opt = optax.sgd(0.1)
    step = loopfuse.compile_step(train_step(opt), keep_aux=("loss",))
    for _ in range(2):
        loopfuse.fit(step, fresh((members(4), jax.vmap(opt.init)(members(4)))), batch(), 8, chunk=4, progress=False,
                     ensemble=True)
    derived = step.derived(("ensemble", None, False, ("loss",)), lambda: None)
    assert derived is not None and step.compile_count == 0
    assert derived.loop(4, until=loopfuse.drivers.ensemble.all_stopped).compile_count == 1


def test_checkpoints_resume_bitwise(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    step = loopfuse.compile_step(train_step(SWEEP), keep_aux=("loss",))
    until = lambda state, aux: aux["loss"] < 0.3       # noqa: E731
    kwargs = dict(chunk=8, progress=False, until=until, stop_on_nonfinite=True, ensemble=True)
    whole = loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 40, **kwargs)
    loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 16, checkpoint_dir=tmp_path, **kwargs)
    resumed = loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 40, checkpoint_dir=tmp_path, **kwargs)
    assert resumed.resumed_from == 16
    assert_trees_equal((resumed.state, resumed.history["loss"], resumed.steps),
                       (whole.state, whole.history["loss"], whole.steps))
    np.testing.assert_array_equal(resumed.retcode, whole.retcode)


def test_an_interrupt_keeps_each_members_retcode():
    step = loopfuse.compile_step(train_step(SWEEP), keep_aux=("loss",))

    def interrupt(done, aux):
        if done >= 16:
            raise KeyboardInterrupt
    result = loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 100, chunk=8, progress=False, callback=interrupt,
                          until=lambda state, aux: aux["loss"] < 0.3, stop_on_nonfinite=True, ensemble=True)
    assert result.interrupted and result.history["loss"].shape == (8, 16)
    running = result.steps == 16
    assert (result.retcode[running] == "interrupted").all() and set(result.retcode[~running]) <= {"until", "non_finite"}


def test_an_error_after_a_chunk_carries_the_members_state():
    step = loopfuse.compile_step(train_step(SWEEP), keep_aux=("loss",))

    def fail(done, aux):
        raise ValueError("boom")
    with pytest.raises(FitError, match="boom") as info:
        loopfuse.fit(step, sweep_state(SWEEP, RATES), batch(), 100, chunk=8, progress=False, callback=fail,
                     ensemble=True)
    result = info.value.result
    assert (result.steps == 8).all() and (result.retcode == "error").all()
    assert jax.tree_util.tree_leaves(result.state)[0].shape[0] == 8 and result.history["loss"].shape == (8, 8)
