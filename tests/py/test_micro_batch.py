"""micro-batch (``compile_step(..., micro_batches=m)``): the loss and gradient over m slices of the
batch in a device loop, each gradient summed over the slices in slice order, one update after it.

Tolerance: the loop reassociates each sum over the batch axis (m partial sums added where the step
summed the whole axis at once). Under the StableHLO reference interpreter a step whose sums are
exact (integer-valued floats) is bitwise equal to the step as traced, and a transformer's gradients
are within `RTOL` of each leaf's largest value. Against ``jax.jit`` after a few steps every leaf is
within `RTOL` of its largest value plus `ATOL`; Adam divides a gradient that is zero but for rounding
by its own size, so the tests that compare Adam's states use `EPS` (as test_roll_layers does)."""
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
import corpus
import layered
import transformer
from ir_helpers import interpret
from loopfuse.compile.mlir_context import parse_module
from problems import assert_trees_equal, fresh, mlp_loss, mlp_params, train_step

RTOL, ATOL = 1e-5, 1e-6      # micro-batched against jax.jit: see the module docstring
EPS = 1e-5                   # Adam's epsilon in the tests that compare states
TINY4 = dict(transformer.TINY, batch=4)


def leaves_close(a, b) -> None:
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        assert np.all(np.abs(x - y) <= RTOL * np.max(np.abs(y)) + ATOL), \
            (jax.tree_util.keystr(path), float(np.max(np.abs(x - y))), float(np.max(np.abs(y))))


def steps(call, state, batch, k: int):
    losses = []
    for _ in range(k):
        state, aux = call(state, batch)
        losses.append(aux["loss"])
    return state, np.asarray(losses)


def mlp_batch(n: int, d_in: int = 4, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, d_in)).astype(np.float32), "y": rng.normal(size=(n, 1)).astype(np.float32)}


def sum_loss(params, batch):
    return mlp_loss(params, batch) * batch["x"].shape[0]


def exact_step(state, batch):
    """A least-squares SGD step whose every sum is exact in float32 (small integers, a batch of 8:
    the mean's 1/8 and the step size are powers of two), with aux reduced over the batch by a sum, a
    max and an integer count, two maxima concatenated (not added in the loop: a sum's rule), and returned
    per example."""
    def loss(w):
        r = batch["x"] @ w - batch["y"]
        return jnp.mean(r ** 2), r
    (value, r), g = jax.value_and_grad(loss, has_aux=True)(state)
    aux = {"loss": value, "worst": jnp.max(jnp.abs(r)), "positive": jnp.sum(r > 0), "residuals": r,
           "peaks": jnp.concatenate([jnp.max(batch["x"] * state, 0), jnp.max(batch["x"] * (state + 1), 0)])}
    return state - g / 64, aux


def test_exact_sums_are_bitwise_equal_in_the_reference_interpreter():
    rng = np.random.default_rng(0)
    w = rng.integers(-3, 4, size=3).astype(np.float32)
    batch = {"x": rng.integers(-3, 4, size=(8, 3)).astype(np.float32),
             "y": rng.integers(-5, 6, size=8).astype(np.float32)}
    plain = loopfuse.compile_step(exact_step, donate=False).lower(w, batch)["final"]
    args = [w, batch["x"], batch["y"]]
    expected = interpret(parse_module(plain), args)
    for m in (2, 4):
        final = loopfuse.compile_step(exact_step, donate=False, micro_batches=m).lower(w, batch)["final"]
        assert f"loopfuse.micro_batch = {m}" in final
        got = interpret(parse_module(final), args)
        assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]


def twice_step(w, batch):
    """A least-squares SGD step reading its weight twice, exact in float32 on small integers: jax sums the
    weight's gradient over the two products' terms, each a sum over the batch."""
    def loss(w):
        r = batch["x"] @ w + (2 * batch["x"]) @ w - batch["y"]
        return jnp.mean(r ** 2)
    value, g = jax.value_and_grad(loss)(w)
    return w - g / 64, {"loss": value}


def test_a_leaf_read_more_than_once_is_accumulated_once():
    """The terms of a gradient jax sums over a leaf's uses (a leaf every layer reads, a tied embedding) are
    added in the loop, on each slice's terms, and the loop accumulates that one sum, not each term: exact
    sums stay bitwise under the reference interpreter; the tied MLP (8 layers, one matrix every layer reads)
    accumulates 10 partial sums (the loss, the 8 layers' matrices, the shared one), not 17, within the
    tolerance of jax.jit."""
    rng = np.random.default_rng(0)
    w = rng.integers(-3, 4, size=3).astype(np.float32)
    batch = {"x": rng.integers(-3, 4, size=(8, 3)).astype(np.float32),
             "y": rng.integers(-5, 6, size=8).astype(np.float32)}
    args = [w, batch["x"], batch["y"]]
    expected = interpret(parse_module(loopfuse.compile_step(twice_step, donate=False).lower(w, batch)["final"]), args)
    call = loopfuse.compile_step(twice_step, donate=False, micro_batches=4)
    assert "accumulated 2 partial sums" in call.compiled(w, batch).reports["micro-batch"]
    got = interpret(parse_module(call.lower(w, batch)["final"]), args)
    assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]

    step, state, x = layered.tied_mlp(layers=8, width=16, batch=16, opt=optax.adam(1e-2, eps=EPS))
    call = loopfuse.compile_step(step, keep_aux=("loss",), micro_batches=4)
    assert "accumulated 10 partial sums" in call.compiled(fresh(state), x).reports["micro-batch"]
    leaves_close(steps(call, fresh(state), x, 2)[0], steps(jax.jit(step), fresh(state), x, 2)[0])


def test_transformer_gradients_in_the_reference_interpreter():
    """Each gradient of a one-block transformer, summed over 2 slices, against the step as traced (token
    embeddings as one-hot products: see transformer.gpt(onehot=))."""
    _, state, tokens = transformer.gpt(**dict(TINY4, layers=1), onehot=True)
    params = state[0]

    def loss(p, t):
        x = jax.nn.one_hot(t[:, :-1], TINY4["vocab"]) @ p["tok"] + p["pos"]
        for b in p["blocks"]:
            x = transformer.block(b, x, TINY4["heads"])
        return transformer._head(p, x, t)

    def grads(p, t):
        value, g = jax.value_and_grad(loss)(p, t)
        return p, {"loss": value, "grads": g}

    args = [np.asarray(x) for x in jax.tree_util.tree_leaves((params, tokens))]
    plain = interpret(parse_module(loopfuse.compile_step(grads, donate=False).lower(params, tokens)["final"]), args)
    cut = loopfuse.compile_step(grads, donate=False, micro_batches=2).lower(params, tokens)["final"]
    assert "loopfuse.micro_batch = 2" in cut
    got = interpret(parse_module(cut), args)
    leaves_close(got, plain)


@pytest.mark.parametrize("problem", ["mlp mean adam", "mlp sum sgd",
                                     pytest.param("transformer adamw", marks=pytest.mark.slow)])
def test_matches_jit_within_the_tolerance(problem):
    if problem == "transformer adamw":
        step, state, batch = transformer.gpt(**TINY4, opt=optax.adamw(3e-4, eps=EPS))
        m = 2
    else:
        opt = optax.adam(1e-2, eps=EPS) if "adam" in problem else optax.sgd(1e-3)
        step = train_step(opt, mlp_loss if "mean" in problem else sum_loss)
        params = mlp_params((4, 32, 32, 1))
        state, batch, m = (params, opt.init(params)), mlp_batch(64), 4
    call = loopfuse.compile_step(step, keep_aux=("loss",), micro_batches=m, verify=problem == "mlp mean adam")
    assert call.compiled(fresh(state), batch).reports["micro-batch"].startswith(f"micro-batched into {m} slices")
    got, losses = steps(call, fresh(state), batch, 3)
    reference = jax.jit(step)
    expected, expected_losses = steps(reference, fresh(state), batch, 3)
    leaves_close(got, expected)
    np.testing.assert_allclose(losses, expected_losses, rtol=RTOL)


def test_loop_runs_the_same_slices_at_every_step():
    opt = optax.adam(1e-2, eps=EPS)
    params = mlp_params((4, 32, 1))
    state, batch = (params, opt.init(params)), mlp_batch(32)
    loop = loopfuse.compile_step(train_step(opt), keep_aux=("loss",), micro_batches=4).loop(5)
    got, aux = loop(fresh(state), batch)
    expected, losses = steps(jax.jit(train_step(opt)), fresh(state), batch, 5)
    leaves_close(got, expected)
    np.testing.assert_allclose(aux["loss"], losses, rtol=RTOL)


@pytest.mark.slow
def test_fit_and_minimize_take_the_slices():
    """fit over a shuffled Dataset (the batch gathered from the epoch's order, sliced in the loop) and
    minimize's CompiledLoop(micro_batches=...) against the same runs on the whole batch."""
    opt = optax.adam(1e-2, eps=EPS)
    params = mlp_params((4, 16, 1))
    data = loopfuse.Dataset(mlp_batch(64), batch_size=16, key=jax.random.key(0))
    runs = {m: loopfuse.fit(loopfuse.compile_step(train_step(opt), keep_aux=("loss",), micro_batches=m),
                            fresh((params, opt.init(params))), data, 12, chunk=4, progress=False) for m in (None, 4)}
    leaves_close(runs[4].state, runs[None].state)
    np.testing.assert_allclose(runs[4].history["loss"], runs[None].history["loss"], rtol=RTOL)
    sols = {m: loopfuse.minimize(mlp_loss, params, mlp_batch(32), opt, steps=8,
                                 backend=loopfuse.CompiledLoop(steps=4, micro_batches=m)) for m in (None, 2)}
    leaves_close(sols[2].params, sols[None].params)
    np.testing.assert_allclose(sols[2].loss_history, sols[None].loss_history, rtol=RTOL)


@pytest.mark.parametrize("program", ["batch norm", "masked mean"])
def test_a_loss_that_does_not_decompose_is_refused_with_its_line(program):
    """Batch norm's statistics reach the per-example normalisation; a masked mean's 1/sum(mask) the
    per-example cotangent: both steps run on the whole batch, as traced, and the warning and the
    report name the op that mixes the examples and its line."""
    if program == "batch norm":
        p = corpus.batchnorm_state()
        statistics = Path(corpus.__file__).read_text().splitlines().index("        return h, h.mean(0), h.var(0)")
        fn, state, batch, line = p.fn, p.state, p.batch, f"corpus.py:{statistics + 1}"
    else:
        opt = optax.sgd(0.1)

        def fn(state, batch):
            def loss(w):
                err = (batch["x"] @ w - batch["y"]) ** 2
                return jnp.sum(err * batch["mask"]) / jnp.sum(batch["mask"])
            value, g = jax.value_and_grad(loss)(state[0])
            updates, opt_state = opt.update(g, state[1], state[0])
            return (optax.apply_updates(state[0], updates), opt_state), {"loss": value}

        w = jnp.zeros((3, 1))
        state, batch = (w, opt.init(w)), {**mlp_batch(8, 3), "mask": np.ones((8, 1), np.float32)}
        line = f"test_micro_batch.py:{fn.__code__.co_firstlineno + 3}"
    call = loopfuse.compile_step(fn, micro_batches=2)
    with pytest.warns(UserWarning, match=r"micro_batches=2 not applied") as caught:
        text = call.compiled(fresh(state), batch).reports["micro-batch"]
    assert text.startswith("did not micro-batch: stablehlo.") and "reads a per-example value and a sum over the " \
        f"batch" in text and f"({line})" in text.split(" reads ")[0], text
    assert text in str(caught[0].message)
    assert caught[0].filename == __file__      # the warning names the call that compiled, not loopfuse's line
    with pytest.warns(UserWarning, match=r"the micro-batch pass not applied"):      # given as a pass
        loopfuse.compile_step(fn, passes="micro-batch{slices=2}").compiled(fresh(state), batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_trees_equal(call(fresh(state), batch), jax.jit(fn)(fresh(state), batch))


def test_a_batch_that_does_not_divide_is_an_error_naming_the_leaf():
    opt = optax.sgd(0.1)
    params = mlp_params((4, 8, 1))
    with pytest.raises(loopfuse.StateMismatchError, match=r"batch\['x'\] has 12 rows, which do not divide "
                                                          r"into micro_batches=8 slices"):
        loopfuse.compile_step(train_step(opt), micro_batches=8)((params, opt.init(params)), mlp_batch(12))
    data = loopfuse.Dataset(mlp_batch(40), batch_size=10)
    with pytest.raises(loopfuse.StateMismatchError, match=r"the Dataset's batch_size has 10 rows"):
        loopfuse.compile_step(train_step(opt), micro_batches=4)((params, opt.init(params)), data)
    with pytest.raises(ValueError, match="micro_batches must be a positive int, got 0"):
        loopfuse.compile_step(train_step(opt), micro_batches=0)


@pytest.mark.slow
def test_temporaries_fall_with_the_slices():
    """Where the activations dominate (a batch of 2048 through three 512-wide layers), the step holds one
    slice's activations at a time: the temporaries fall with m (17.0, 13.4, 8.3, 5.7 MiB on jaxlib 0.10's
    XLA:CPU), towards the gradient accumulators and one slice's gradient of the 512x512 weights."""
    opt = optax.adam(1e-3)
    params = mlp_params((64, 512, 512, 512, 1))
    state, batch = (params, opt.init(params)), mlp_batch(2048, 64)
    temp = {m: loopfuse.compile_step(train_step(opt), keep_aux=("loss",), micro_batches=m).memory_stats(state, batch).temp
            for m in (None, 2, 4, 8)}
    assert temp[None] > temp[2] > temp[4] > temp[8] and temp[8] < 0.4 * temp[None], temp
