"""Dataset serving: each epoch's shuffle order computed once (bitwise jax.random.permutation's),
host arrays placed on the device once per Dataset, batches in the documented order."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import Dataset, compile_step
from loopfuse.state import data

N, BS = 24, 8  # 3 batches per epoch


def documented_rows(key, steps) -> np.ndarray:
    """Today's order: step i reads rows of permutation(fold_in(key, epoch), N), epoch = i // batches."""
    nb = N // BS
    return np.stack([np.asarray(jax.random.permutation(jax.random.fold_in(key, i // nb), N))[
        (i % nb) * BS:(i % nb + 1) * BS] for i in steps])


def rows_step(state, batch):
    """Trains nothing; returns the example indices of its batch."""
    return {"n": state["n"] + 1}, {"rows": batch["idx"]}


def arrays():
    return {"x": np.arange(N * 2, dtype=np.float32).reshape(N, 2), "idx": np.arange(N, dtype=np.int32)}


@pytest.mark.parametrize("make_key, n", [   # one sort round, two sort rounds; each key kind and round count by default
    (jax.random.key, 100), pytest.param(jax.random.key, 2000, marks=pytest.mark.slow),
    pytest.param(jax.random.PRNGKey, 100, marks=pytest.mark.slow), (jax.random.PRNGKey, 2000)],
    ids=["key-100", "key-2000", "PRNGKey-100", "PRNGKey-2000"])
def test_epoch_order_is_jax_permutation_bitwise(n, make_key):
    key = make_key(3)
    for epoch in (0, 1, 7):
        np.testing.assert_array_equal(data.epoch_order(key, epoch, n),
                                      np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n)))


@pytest.mark.parametrize("steps, start", [pytest.param(1, 4, marks=pytest.mark.slow),   # within,
                                         pytest.param(2, 2, marks=pytest.mark.slow),   # across one,
                                         (7, 5)])                                      # across several epochs
def test_served_batches_follow_the_documented_order(steps, start):
    key = jax.random.key(0)
    ds = Dataset(arrays(), batch_size=BS, key=key)
    loop = compile_step(rows_step).loop(steps)
    state, aux = loop({"n": jnp.zeros((), jnp.int32)}, ds, start=start)
    got = np.asarray(aux["rows"]).reshape(steps, BS)
    expected = documented_rows(key, range(start, start + steps))
    np.testing.assert_array_equal(got, expected)
    # The same as the in-trace Dataset.batch (the definition of the order).
    batch = jax.jit(ds.batch)
    np.testing.assert_array_equal(got, np.stack([np.asarray(batch(np.int32(i))["idx"])
                                                 for i in range(start, start + steps)]))


@pytest.mark.parametrize("chunk", [2, 4, 7])  # chunks within epochs; a last, shorter chunk; chunks over 3 epochs
def test_fit_places_numpy_arrays_once_and_orders_each_epoch_once(monkeypatch, chunk):
    ds = Dataset(arrays(), batch_size=BS, key=jax.random.key(1))
    leaves = jax.tree_util.tree_leaves(ds.arrays)
    placed, ordered = [], []
    device_put, epoch_order = jax.device_put, data.epoch_order

    def counting_put(x, *args, **kwargs):
        placed.extend(i for i, a in enumerate(leaves) if x is a)
        return device_put(x, *args, **kwargs)

    def counting_order(key, epoch, n):
        ordered.append(epoch)
        return epoch_order(key, epoch, n)

    monkeypatch.setattr(jax, "device_put", counting_put)
    monkeypatch.setattr(data, "epoch_order", counting_order)
    step = compile_step(rows_step)
    result = loopfuse.fit(step, {"n": jnp.zeros((), jnp.int32)}, ds, 14, chunk=chunk, progress=False)
    assert sorted(placed) == list(range(len(leaves)))   # each array uploaded once, not once per chunk
    assert sorted(ordered) == list(range(5))             # 14 steps: epochs 0..4, each order computed once
    np.testing.assert_array_equal(result.history["rows"], documented_rows(ds.key, range(14)))


def test_unshuffled_numpy_dataset_is_placed_once():
    ds = Dataset(arrays(), batch_size=BS)
    sharding = jax.sharding.make_single_device_sharding(jax.devices()[0])
    first, later = ds.served(0, 4, sharding), ds.served(9, 4, sharding)
    assert all(a is b and isinstance(a, jax.Array) for a, b in
               zip(jax.tree_util.tree_leaves(first.arrays), jax.tree_util.tree_leaves(later.arrays)))
    loop = compile_step(rows_step).loop(4)
    _, aux = loop({"n": jnp.zeros((), jnp.int32)}, ds, start=2)
    np.testing.assert_array_equal(np.asarray(aux["rows"]).reshape(-1), np.r_[16:24, 0:24])


def test_host_order_falls_back_to_jax_when_it_stops_matching(monkeypatch):
    """The self-check at first use: a host sort that disagrees with jax is replaced by jax's own."""
    monkeypatch.setattr(data, "_FAST_ORDER_OK", {})
    monkeypatch.setattr(data, "_sort_bits", lambda key, epoch, n, rounds: jnp.zeros((rounds, n), jnp.uint32))
    key, n = jax.random.key(5), 50
    reference = [np.asarray(jax.random.permutation(jax.random.fold_in(key, e), n)) for e in range(2)]
    with pytest.warns(UserWarning, match="no longer matches"):
        np.testing.assert_array_equal(data.epoch_order(key, 0, n), reference[0])
    np.testing.assert_array_equal(data.epoch_order(key, 1, n), reference[1])  # decided once, no second warning


def test_inspection_takes_start_like_a_call_and_never_passes_it_to_the_step():
    ds = Dataset(arrays(), batch_size=BS, key=jax.random.key(2))
    step = compile_step(rows_step).loop(2)
    state = {"n": jnp.zeros((), jnp.int32)}
    executable = step.compiled(state, ds, start=5)
    assert "final" in step.lower(state, ds, start=5)
    assert step.memory_stats(state, ds, start=5) == executable.memory
    _, aux = step(state, ds, start=5)
    assert step.compile_count == 1  # the call runs the executable `compiled` built
    np.testing.assert_array_equal(np.asarray(aux["rows"]).reshape(2, BS), documented_rows(ds.key, range(5, 7)))


@pytest.mark.parametrize("chunk", [2, 7])
def test_device_orders_are_jax_permutation_bitwise(monkeypatch, chunk):
    """Off the CPU each epoch's order is jax.random.permutation run on the device (forced here): the
    batches of a fit, across epoch boundaries and in chunks over several epochs, are the documented ones."""
    monkeypatch.setattr(data, "HOST_SORT_PLATFORMS", ())
    monkeypatch.setattr(data, "epoch_order", None)  # the host sort is not used
    ds = Dataset(arrays(), batch_size=BS, key=jax.random.key(4))
    result = loopfuse.fit(compile_step(rows_step), {"n": jnp.zeros((), jnp.int32)}, ds, 14, chunk=chunk,
                          progress=False)
    np.testing.assert_array_equal(result.history["rows"], documented_rows(ds.key, range(14)))


@pytest.mark.parametrize("arrays_, message", [
    (np.float32(1.0), r"^the Dataset is a scalar; every leaf needs a leading example axis$"),
    ({"x": np.ones((4, 2)), "y": 2.0}, r"^Dataset leaf \['y'\] is a scalar"),
    ({"x": np.ones((4, 2)), "y": np.ones(3)}, r"^Dataset leaf \['y'\] has shape \(3,\); .* axis \(4\)$"),
])
def test_a_leaf_without_the_example_axis_is_named(arrays_, message):
    from loopfuse.errors import StateMismatchError
    state = {"n": jnp.zeros((), jnp.int32)}
    with pytest.raises(StateMismatchError, match=message):
        compile_step(rows_step)(state, Dataset(arrays_, batch_size=2))
    assert not state["n"].is_deleted()


@pytest.mark.parametrize("size, error", [(64.0, TypeError), ("64", TypeError), (True, TypeError), (0, ValueError)])
def test_a_batch_size_that_is_no_positive_int_is_refused_at_construction(size, error):
    with pytest.raises(error, match=f"^Dataset batch_size must be a positive int, got .*{size!r}$"):
        Dataset(arrays(), batch_size=size)
    assert Dataset(arrays(), batch_size=np.int64(4)).batch_size == 4 and type(Dataset(arrays(), batch_size=np.int64(4)).batch_size) is int
