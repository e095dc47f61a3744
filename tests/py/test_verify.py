"""verify=True / LOOPFUSE_VERIFY=1: each new executable's first call is checked against jax.jit of
the unmodified step, a difference is a MiscompileError naming the leaf and the culprit, and the
caller's state survives the check."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import layered
import loopfuse
from loopfuse.compile import pipeline
from loopfuse.diagnostics import verify
from problems import NegateFirstResult, assert_trees_equal, batch, fresh, init_state, train_step

OPTION = "xla_cpu_copy_insertion_use_region_analysis"


def _lotka_volterra_step():
    """One Adam step of the Lotka-Volterra fit with diffrax (Tsit5, PID, SaveAt(ts)): the program that
    region-analysis copy insertion miscompiles."""
    import diffrax

    def vf(t, y, th):
        a, b, c, d = jnp.exp(th)
        x, z = y
        return jnp.stack([a * x - b * x * z, -c * z + d * x * z])

    ts = jnp.linspace(0.0, 10.0, 21)

    def solve(th):
        return diffrax.diffeqsolve(diffrax.ODETerm(vf), diffrax.Tsit5(), 0.0, 10.0, 0.05, jnp.array([1.0, 1.0]),
                                   args=th, saveat=diffrax.SaveAt(ts=ts), max_steps=1024,
                                   stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6)).ys

    opt = optax.adam(1e-2)

    def step(state, data):
        th, opt_state = state
        loss, g = jax.value_and_grad(lambda th: jnp.mean((solve(th) - data) ** 2))(th)
        updates, opt_state = opt.update(g, opt_state, th)
        return (optax.apply_updates(th, updates), opt_state), {"loss": loss}

    th0 = jnp.log(jnp.array([1.2, 0.8, 2.8, 0.8]))
    return step, (th0, opt.init(th0)), solve(jnp.log(jnp.array([1.5, 1.0, 3.0, 1.0])))


def _alive(state) -> bool:
    return not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


@pytest.mark.slow
def test_forced_copy_insertion_option_on_an_ode_solve_is_caught_and_named():
    step, state, data = _lotka_volterra_step()
    checked = loopfuse.compile_step(step, verify=True, xla_options={OPTION: True})
    with pytest.raises(loopfuse.MiscompileError, match=f"state leaf .* differs by up to .*Removing the XLA option {OPTION}") as e:
        checked(state, data)
    assert e.value.culprits == [f"the XLA option {OPTION}"] and e.value.xla_options == {OPTION: True}
    assert e.value.max_abs > 0 and e.value.path.startswith("the state leaf")
    assert _alive(state)                                    # the check never consumes the caller's state
    reference = jax.jit(step)(fresh(state), data)
    new, aux = loopfuse.compile_step(step, verify=True)(state, data)   # the defaults pass
    assert_trees_equal((new, aux), reference)


def test_a_wrong_pass_is_named():
    fn = lambda w, t: (w - 0.5 * (w - t), {"loss": jnp.sum((w - t) ** 2)})  # noqa: E731
    w = jnp.ones(3)
    step = loopfuse.compile_step(fn, verify=True, passes=[NegateFirstResult()])
    with pytest.raises(loopfuse.MiscompileError, match="Removing the pass 'negate-first-result'") as e:
        step(w, jnp.zeros(3))
    assert e.value.path == "the state" and e.value.max_abs == 1.0
    assert _alive(w)


def test_the_check_runs_once_per_executable_and_then_costs_nothing(monkeypatch):
    calls = []
    real = verify.check
    monkeypatch.setattr(verify, "check", lambda *a: calls.append(1) or real(*a))
    opt = optax.adam(1e-2)
    step = loopfuse.compile_step(train_step(opt), verify=True)
    state, reference = init_state(opt), fresh(init_state(opt))
    jitted = jax.jit(train_step(opt))
    for _ in range(3):
        state, aux = step(state, batch())
        reference, ref_aux = jitted(reference, batch())
        assert_trees_equal(state, reference)
    assert len(calls) == 1
    unchecked = loopfuse.compile_step(train_step(opt))   # off by default
    unchecked(init_state(opt), batch())
    assert len(calls) == 1


LOOPS = {"plain": dict(), "until": dict(until=lambda s, aux: aux["loss"] < 2.0),
         "nonfinite": dict(stop_on_nonfinite=True)}
# the default run has each loop and each keep_aux: every aux leaf with the plain loop (the scan reference),
# the loss alone with the stopping ones
DEFAULT_LOOPS = {(None, "plain"), (("loss",), "until"), (("loss",), "nonfinite")}


@pytest.mark.parametrize("keep_aux, loop", [
    pytest.param(k, loop, id=f"{k and k[0]}-{loop}", marks=() if (k, loop) in DEFAULT_LOOPS else pytest.mark.slow)
    for k in (None, ("loss",)) for loop in LOOPS])
def test_loops_pass_against_k_jitted_steps_or_their_scan(monkeypatch, loop, keep_aux):
    monkeypatch.setenv(verify.VERIFY_ENV, "1")
    opt = optax.sgd(0.1)
    step = loopfuse.compile_step(train_step(opt), keep_aux=keep_aux).loop(5, **LOOPS[loop])
    out = step(init_state(opt), batch())
    state = fresh(init_state(opt))
    for _ in range(int(out[2]) if len(out) > 2 else 5):
        state, _ = jax.jit(train_step(opt))(state, batch())
    assert_trees_equal(out[0], state)


@pytest.mark.slow     # the same loop, verified, stops in test_packed's test_until_sees_the_unpacked_state
def test_a_stopping_loop_may_equal_jax_jits_while_loop():
    """An Adam MLP stopping on a params leaf: loopfuse's loop equals jax.jit of the same steps as one
    `lax.while_loop` bitwise, but K lone jitted steps only to 1 ulp (XLA compiles the step inside a
    loop otherwise); verify accepts it (it raised MiscompileError before taking the while loop as a
    reference) and stops where jax.jit's loop stops."""
    from test_pack_state import OPTIMIZERS, PARAMS
    opt = OPTIMIZERS["adam"]()

    def until(s, aux):
        return jnp.abs(s[0]["layers"][0].w[0, 0] - PARAMS["layers"][0].w[0, 0]) > 0.025
    fn, state = train_step(opt), init_state(opt, PARAMS)
    got, _, steps, _ = loopfuse.compile_step(fn, verify=True).loop(10, until=until)(fresh(state), batch())

    def body(carry):
        s, i, _ = carry
        s, aux = fn(s, batch())
        return s, i + 1, until(s, aux)
    want, want_steps, _ = jax.jit(lambda s: jax.lax.while_loop(lambda c: (c[1] < 10) & ~c[2], body, (s, 0, False)))(
        fresh(state))
    assert int(steps) == int(want_steps) == 3
    assert_trees_equal(got, want)


def test_a_wrong_loop_is_caught_and_a_dataset_batch_is_followed():
    rng = np.random.default_rng(0)
    data = loopfuse.Dataset({"x": rng.normal(size=(40, 4)).astype(np.float32),
                             "y": rng.normal(size=(40, 1)).astype(np.float32)}, batch_size=8, key=jax.random.key(1))
    opt = optax.sgd(0.1)
    good = loopfuse.compile_step(train_step(opt), keep_aux=("loss",), verify=True).loop(7)
    good(init_state(opt), data, start=3)
    bad = loopfuse.compile_step(train_step(opt), keep_aux=("loss",), verify=True,
                                passes=[NegateFirstResult()]).loop(7)
    state = init_state(opt)
    with pytest.raises(loopfuse.MiscompileError, match="negate-first-result"):
        bad(state, data, start=3)
    assert _alive(state)


def test_the_error_names_every_pass_that_ran_wrap_loops_rows_included():
    """A long loop of a small step writes its histories in blocks (wrap-loop's rows, decided from the traced
    program): the error names the pipeline the executable ran, rows included (it named the options' own,
    without them)."""
    def step(w, data):
        return w - 0.1 * (w - data), {"loss": jnp.sum((w - data) ** 2)}
    loop = loopfuse.compile_step(step, verify=True, passes=[NegateFirstResult()]).loop(200)
    with pytest.raises(loopfuse.MiscompileError) as caught:
        loop(jnp.arange(3.0), jnp.ones(3))
    ran = loop.compiled(jnp.arange(3.0), jnp.ones(3)).passes
    assert caught.value.passes == pipeline.pipeline_string(ran) and "wrap-loop{steps=200 rows=128}" in str(caught.value)


@pytest.mark.slow
def test_a_bias_before_a_batch_norm_moves_either_way_within_verifys_tolerance():
    """flax linen blocks ``x + relu(BatchNorm(Dense(x)))``, AdamW as users run it (eps 1e-8): the norm takes each
    feature's mean out, so the Dense bias's gradient is rounding noise, which Adam turns into a step either way,
    as large as its noise is against eps. The rolled program (the loss jax.jit's) moves those biases otherwise
    than jax.jit does, beyond jax.jit's own change of them (verify's bound before, a MiscompileError), within
    twice the largest change of any parameter: verify=True passes it."""
    step, state, data = layered.linen_batch_norm_mlp(4, 16, 16)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, verify=True)
    new, aux = call(loopfuse.pack(fresh(state), layers=True), data)
    assert call.compiled(loopfuse.pack(fresh(state), layers=True), data).reports["roll-layers"].startswith("rolled ")
    ref, ref_aux = jax.jit(step)(fresh(state), data)
    assert float(aux["loss"]) == float(ref_aux["loss"])
    got, want, before = (jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), p[0]) for p in (new.unpack(), ref, state))
    largest = max(np.max(np.abs(w - b)) for w, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(before)))
    beyond = []
    for block in want:
        if block.startswith("_LinenNormedBlock_"):
            g, w, b = (t[block]["Dense_0"]["bias"] for t in (got, want, before))
            assert np.all(np.abs(g - w) <= 2 * largest)
            beyond.append(np.max(np.abs(g - w)) > np.max(np.abs(w - b)))
    assert any(beyond)


@pytest.mark.slow
def test_blocks_computing_in_bfloat16_are_held_to_two_bfloat16_units():
    """Mixed precision (float32 params cast to bfloat16 in each block): XLA rounds bfloat16 at other points in
    a loop than in the unrolled program, so jax.jit of the same blocks as a lax.scan has a loss more than
    `ROLLED_RTOL` from jax.jit's; the rolled program is held to two bfloat16 units (`verify.rolled_rtol`), and
    verify=True passes it (a MiscompileError before); a float32 step keeps `ROLLED_RTOL`."""
    step, state, data = layered.bfloat16_mlp(4, 64, 32)
    scan_step, scan_state, _ = layered.bfloat16_mlp(4, 64, 32, scan=True)
    loss, scan_loss = (float(jax.jit(f)(fresh(s), data)[1]["loss"]) for f, s in ((step, state), (scan_step, scan_state)))
    assert abs(scan_loss - loss) > verify.ROLLED_RTOL * abs(loss)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0, verify=True)
    new, aux = call(loopfuse.pack(fresh(state), layers=True), data)
    compiled = call.compiled(loopfuse.pack(fresh(state), layers=True), data)
    assert compiled.reports["roll-layers"].startswith("rolled ")
    rtol = verify.rolled_rtol(compiled.traced.module)
    assert rtol == 2 * float(jnp.finfo(jnp.bfloat16).eps)
    assert abs(float(aux["loss"]) - loss) <= rtol * abs(loss)
    f32_step, f32_state, f32_data = layered.eqx_mlp(layers=4, width=8, hidden=16, batch=4)
    traced = loopfuse.compile_step(f32_step, memory_budget=0.0).compiled(fresh(f32_state), f32_data).traced
    assert verify.rolled_rtol(traced.module) == verify.ROLLED_RTOL
