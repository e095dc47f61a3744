"""Per-step calls through jaxlib's C++ dispatcher: the same results as loopfuse's Python path,
donation, errors and compile counts kept, and a clean bypass (effects, forced fallback)."""
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopfuse
from loopfuse import _jax_compat
from loopfuse.errors import DonatedArrayError


@pytest.fixture
def misses(monkeypatch):
    """The arguments after (state, batch) of every call that took the Python path as a dispatcher cache miss."""
    seen = []
    miss = loopfuse.Step._cache_miss

    def counting(self, state, batch, *args, **static):    # args: none, or the step index and a loop's stop flag
        seen.append(args)
        return miss(self, state, batch, *args, **static)
    monkeypatch.setattr(loopfuse.Step, "_cache_miss", counting)
    return seen


@pytest.fixture
def python_path(monkeypatch):
    """Force loopfuse's Python call path (the route taken when the private dispatcher is gone)."""
    monkeypatch.setenv(_jax_compat.FORCE_ENV, "fallback")
    _jax_compat._cpp_dispatch.cache_clear()
    yield
    monkeypatch.delenv(_jax_compat.FORCE_ENV)
    _jax_compat._cpp_dispatch.cache_clear()


def _sgd(s, b):
    w = s["w"] - 0.1 * (s["w"] - b["x"] * b["scale"])
    return {"w": w, "n": s["n"] + 1, "key": jax.random.split(s["key"])[0]}, \
        {"loss": jnp.sum(w ** 2), "key": s["key"], "unused": w * 2}


def _state():
    return {"w": jnp.arange(4.0), "n": jnp.zeros((), jnp.int32), "key": jax.random.key(1)}


def _snapshot(x):
    """A leaf as (dtype, weak type, sharding, shape, bytes) (typed keys as their raw data)."""
    data = jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return str(x.dtype), x.aval.weak_type, x.sharding, np.asarray(data).shape, np.asarray(data).tobytes()


def _run(step, batches):
    """Every call's (state, aux) as snapshots (a state is donated by the call after it)."""
    state, out = _state(), []
    for b in batches:
        state, aux = step(state, b)
        out.append(jax.tree_util.tree_map(_snapshot, (state, aux)))
    return out


BATCHES = [{"x": jnp.ones(4), "scale": 1.0}, {"x": np.full(4, 2.0, np.float32), "scale": 0.5},
           {"x": jnp.ones(4), "scale": 2.0}, {"x": jnp.ones(4), "scale": 1.0}]


def test_repeated_calls_run_in_cpp_and_match_the_python_path_bitwise(misses, monkeypatch):
    step = loopfuse.compile_step(_sgd, keep_aux=("loss", "key"))
    got = _run(step, BATCHES)
    assert step.compile_count == 1
    # dispatcher signatures (committedness and host arrays count): fresh state, numpy batch, device batch;
    # the fourth call repeats the third's and runs in C++
    assert len(misses) == 3
    monkeypatch.setenv(_jax_compat.FORCE_ENV, "fallback")
    _jax_compat._cpp_dispatch.cache_clear()
    try:
        want = _run(loopfuse.compile_step(_sgd, keep_aux=("loss", "key")), BATCHES)
    finally:
        monkeypatch.delenv(_jax_compat.FORCE_ENV)
        _jax_compat._cpp_dispatch.cache_clear()
    assert got == want
    assert got[-1][1]["unused"] is None and got[-1][0]["key"][0].startswith("key<")


def test_a_plain_call_runs_no_python_but_its_own_frame_before_the_dispatcher():
    """A call without keywords of a cached signature goes from Step.__call__ straight to jaxlib's C++
    dispatcher: no other Python function runs (issue 33: more frames, isinstance checks and lookups cost
    a tiny step 5% against jax.jit)."""
    step = loopfuse.compile_step(lambda s, b: (s + b, jnp.sum(s)))
    s, b = jnp.ones(3), jnp.ones(3)
    for _ in range(2):
        s, _ = step(s, b)
    ran = []
    sys.setprofile(lambda frame, event, arg: ran.append(frame.f_code.co_qualname) if event == "call" else None)
    try:
        s, _ = step(s, b)
    finally:
        sys.setprofile(None)
    assert ran == ["Step.__call__"]
    np.testing.assert_array_equal(s, 4 * np.ones(3))


def test_donation_consumes_the_state_in_cpp_and_a_reused_leaf_is_named(misses):
    step = loopfuse.compile_step(_sgd)
    state, _ = step(_state(), BATCHES[0])  # fresh (uncommitted) arrays: a signature of its own
    state, _ = step(state, BATCHES[0])
    new, _ = step(state, BATCHES[0])
    assert len(misses) == 2 and all(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    fresh = {**_state(), "w": state["w"]}  # one donated leaf among live ones
    with pytest.raises(DonatedArrayError, match=r"state leaf \['w'\] was donated"):
        step(fresh, BATCHES[0])
    assert not fresh["n"].is_deleted() and not fresh["key"].is_deleted()
    with pytest.raises(TypeError):  # a new signature that fails to trace keeps the state
        step(new, {"x": jnp.ones(5), "scale": 1.0})
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(new))


def test_one_buffer_in_two_leaves_on_a_cached_signature_takes_the_python_path():
    step = loopfuse.compile_step(lambda s, b: (jax.tree_util.tree_map(lambda x: x + b, s), 0.0))
    step({"a": jnp.ones(3), "b": jnp.ones(3)}, 1.0)  # caches the signature in C++
    w = jnp.ones(3)
    out, _ = step({"a": w, "b": w}, 1.0)
    np.testing.assert_array_equal(out["a"], 2 * np.ones(3))
    np.testing.assert_array_equal(out["b"], 2 * np.ones(3))
    assert step.compile_count == 1


def test_static_arguments_and_dataset_start_through_the_dispatcher(misses):
    def fn(s, b, *, scale):
        return s + scale * b, jnp.sum(b)
    step = loopfuse.compile_step(fn, donate=False)
    x = jnp.ones(3)
    for scale in (2.0, 3.0, 2.0, 3.0):
        np.testing.assert_array_equal(step(x, x, scale=scale)[0], (1 + scale) * np.ones(3))
    assert step.compile_count == 2 and len(misses) == 2
    with pytest.raises(TypeError, match="hashable"):
        step(x, x, scale=[1])

    data = loopfuse.Dataset(jnp.arange(8.0).reshape(8, 1), batch_size=2)
    walk = loopfuse.compile_step(lambda s, b: (s + jnp.sum(b), b), donate=False)
    got = [float(walk(jnp.zeros(()), data, start=i)[0]) for i in range(6)]
    assert got == [1.0, 5.0, 9.0, 13.0, 1.0, 5.0] and walk.compile_count == 1


def test_a_loop_that_stops_returns_its_step_count_through_the_dispatcher(misses):
    step = loopfuse.compile_step(lambda s, b: (s + b, {"s": s})).loop(10, until=lambda s, aux: s >= 3)
    for _ in range(3):
        state, aux, steps, stopped = step(jnp.zeros(()), 1.0)
        assert int(steps) == 3 and bool(stopped) and float(state) == 3.0
    assert len(misses) == 1


def test_a_step_with_effects_bypasses_the_dispatcher(capfd, misses):
    def fn(s, b):
        jax.debug.print("s={s}", s=s)
        return s + b, 0.0
    step = loopfuse.compile_step(fn)
    s = jnp.zeros(())
    for _ in range(3):
        s, _ = step(s, 1.0)
    jax.effects_barrier()
    assert capfd.readouterr().out.count("s=") == 3
    assert len(misses) == 3 and step.compile_count == 1  # every call on the Python path, as jax.jit does


def test_threads_on_a_new_signature_compile_once_and_agree():
    import threading
    step = loopfuse.compile_step(lambda s, b: (s * b, 0.0), donate=False)
    barrier, outs = threading.Barrier(4), []

    def call():
        barrier.wait()
        for _ in range(5):
            outs.append(step(jnp.ones(3), 2.0)[0])
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outs) == 20 and all(np.array_equal(o, 2 * np.ones(3)) for o in outs)
    assert step.compile_count == 1


def test_forced_fallback_takes_the_python_path(python_path, misses):
    assert _jax_compat.status()["dispatch"] == "fallback"
    step = loopfuse.compile_step(_sgd)
    assert _run(step, BATCHES) == _run(jax.jit(_sgd), BATCHES)     # dtypes, weak types, shardings, values
    assert misses == [] and step.compile_count == 1


def test_a_failing_dispatch_self_test_warns_and_falls_back(monkeypatch, misses):
    _jax_compat._cpp_dispatch.cache_clear()

    def changed(api):
        raise TypeError("pjit(): incompatible function arguments")
    monkeypatch.setattr(_jax_compat, "_test_cpp_dispatch", changed)
    try:
        with pytest.warns(UserWarning, match=r"jaxlib\._jax\.pjit.*failed its self-test.*public fallback"):
            step = loopfuse.compile_step(_sgd)
            _run(step, BATCHES[:1])
        assert _run(step, BATCHES) == _run(jax.jit(_sgd), BATCHES)  # dtypes, weak types, shardings, values
        assert misses == [] and step.compile_count == 1
    finally:
        _jax_compat._cpp_dispatch.cache_clear()


def test_the_dispatch_self_test_passes_on_the_installed_jax():
    _jax_compat._cpp_dispatch.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _jax_compat.status()["dispatch"] == "private"
