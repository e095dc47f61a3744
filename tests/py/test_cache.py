"""The persistent compile cache: hits across processes, keys, damaged entries, concurrent writers.

Cross-process checks run the CHILD program below in fresh interpreters (hard timeouts); the rest
run in this process on a tiny Adam step.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.compile import cache, xla
from loopfuse.compile.mlir_context import make_context

sys.path.insert(0, str(Path(__file__).parent))
from problems import assert_trees_equal, batch, fresh, init_state, mlp_params, train_step  # noqa: E402

OPT = optax.adam(1e-2)
STEP = train_step(OPT)
BATCH = batch()
TIMEOUT = 240

CHILD = r"""
import json, os, sys, time, warnings
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import jax, numpy as np, optax, loopfuse
from loopfuse.compile import cache, xla
from problems import batch, init_state, train_step

warnings.simplefilter("error", cache.CacheWarning)
mode, where = sys.argv[2], Path(sys.argv[3])
opt = optax.adam(1e-2)
if mode == "run":          # compile through the cache and take one step
    state = init_state(opt)
    step = loopfuse.compile_step(train_step(opt), keep_aux=("loss",), cache_dir=where)
    ex = step.compiled(state, batch())
    new, aux = step(state, batch())
    leaves = jax.tree_util.tree_leaves((new, aux))
    print(json.dumps({"hit": "xla" not in ex.seconds, "alias": ex.memory.alias,
                      "out": [np.asarray(x).tobytes().hex() for x in leaves]}))
elif mode == "store":      # write one entry many times, starting when the go file appears
    ex = loopfuse.compile_step(train_step(opt)).compiled(init_state(opt), batch())
    devices = jax.devices()[:1]
    entry = cache.Entry(where / "shared.lfx", devices, xla.compile_options(devices, ex.xla_options, shardy=False))
    (where / f"ready-{sys.argv[4]}").touch()
    while not (where / "go").exists():
        time.sleep(0.01)
    print(all(entry.store(ex.executable, ex.module) for _ in range(20)))
elif mode == "mesh":       # one program on several device sets and shardings (4 CPU devices)
    import jax.numpy as jnp
    params = {"w": jnp.ones((512, 512)), "b": jnp.zeros((512,))}   # w is 1 MiB: "params" splits it
    def fn(state, b):
        return jax.tree_util.tree_map(lambda p: p - 0.1 * jnp.mean(b) * p, state), jnp.sum(b)
    d = jax.devices()
    variants = [dict(device=d[0]), dict(device=d[1]), dict(devices=d[:2]), dict(devices=d, sharding="data"),
                dict(devices=d, sharding="params")]
    misses, outs = [], []
    for kw in variants + variants[-1:]:
        ex = loopfuse.compile_step(fn, cache_dir=where, donate=False, **kw)
        misses.append("xla" in ex.compiled(params, jnp.ones((8,))).seconds)
        outs.append(np.asarray(ex(params, jnp.ones((8,)))[0]["w"]).tobytes().hex())
    print(json.dumps({"misses": misses, "entries": len(list(where.glob("*.lfx"))),
                      "same_after_hit": outs[-1] == outs[-2]}))
"""


def child(*args, env=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(Path(__file__).parent), *map(str, args)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-4000:]
    return out


@pytest.fixture(autouse=True)
def on_disk_only(monkeypatch):
    """The folder's entries, not the executables this process keeps in memory (test_recent_executables.py)."""
    monkeypatch.setattr(cache.RECENT, "size", 0)


def compiled(where, fn=STEP, state=None, **kw):
    """(Executable, its outputs) of a fresh Step over the cache folder `where`."""
    state = init_state(OPT) if state is None else state
    step = loopfuse.compile_step(fn, cache_dir=where, **kw)
    ex = step.compiled(state, BATCH)
    return ex, step(fresh(state), BATCH)


def entries(where: Path) -> list:
    return sorted(where.glob("*.lfx"))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """store(where, **kw): the cache folder `where` holding the entry of ``compiled(**kw)``, copied from one
    compiled once per module and keyword set; returns that call's outputs (so tests that only need an
    entry to be there do not each compile it: a miss is tested by test_hit_skips_passes_and_xla...)."""
    made = {}

    def store(where: Path, **kw):
        name = repr(sorted(kw.items()))
        if name not in made:
            folder = tmp_path_factory.mktemp("stored")
            made[name] = folder, compiled(folder, **kw)[1]
        folder, out = made[name]
        where.mkdir(parents=True, exist_ok=True)
        for path in entries(folder):
            shutil.copy2(path, where / path.name)
        return out
    return store


# ---- hits -----------------------------------------------------------------------------------
def test_second_process_loads_the_executable_and_gets_the_same_bits(tmp_path):
    first = json.loads(finish(child("run", tmp_path)))
    second = json.loads(finish(child("run", tmp_path)))
    assert (first["hit"], second["hit"]) == (False, True)
    assert second["out"] == first["out"]          # bitwise
    assert second["alias"] == first["alias"] > 0  # the donated state is still updated in place
    assert len(entries(tmp_path)) == 1


def test_hit_skips_passes_and_xla_and_keeps_the_layout(tmp_path):
    miss, out_miss = compiled(tmp_path, keep_aux=("loss",))
    hit, out_hit = compiled(tmp_path, keep_aux=("loss",))
    assert "xla" in miss.seconds and "drop-unused-outputs" in miss.seconds
    assert set(hit.seconds) == {"trace", "cache"}
    assert hit.results == miss.results and str(hit.module) == str(miss.module)
    assert_trees_equal(out_hit, out_miss)
    assert jax.tree_util.tree_leaves(out_hit[1]["grads"]) == []


def test_an_entry_is_readable_as_the_umask_allows(tmp_path):
    """A cache shared by several users: an entry is written as an ordinary file is (it was the owner's alone,
    0600, so another user recompiled and replaced it with their own)."""
    old = os.umask(0o022)
    try:
        loopfuse.compile_step(STEP, cache_dir=tmp_path)(fresh(init_state(OPT)), BATCH)
    finally:
        os.umask(old)
    entries = list(tmp_path.rglob("*.lfx"))
    assert entries and all(p.stat().st_mode & 0o777 == 0o644 for p in entries)


def test_environment_variable_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    loopfuse.compile_step(STEP).compiled(init_state(OPT), BATCH)
    assert len(entries(tmp_path)) == 1


# ---- keys -----------------------------------------------------------------------------------
def _scaled_step(state, b):
    (p, o), aux = STEP(state, b)
    return (jax.tree_util.tree_map(lambda x: 0.5 * x, p), o), aux


VARIANTS = {
    "function": dict(fn=_scaled_step),
    "passes": dict(passes=["simplify"]),
    "pass options": dict(steps=3),
    "donation": dict(donate=False),
    "kept outputs": dict(keep_aux=("loss",)),
    "shapes": dict(state=init_state(OPT, mlp_params((4, 6, 1)))),
}


# shapes slow: they reach the key as the function does, in the traced module's text
@pytest.mark.parametrize("what", [pytest.param(w, marks=pytest.mark.slow if w == "shapes" else ()) for w in VARIANTS])
def test_programs_that_differ_never_share_an_entry(tmp_path, what, stored):
    stored(tmp_path, steps=2)
    assert len(entries(tmp_path)) == 1
    variant = dict(steps=2) | VARIANTS[what]
    ex, _ = compiled(tmp_path, **variant)
    assert "xla" in ex.seconds, f"a program with other {what} was served from the cache"
    assert len(entries(tmp_path)) == 2


def test_key_covers_versions_platform_devices_options_and_flags(monkeypatch):
    d = jax.devices()[:1]
    options = xla.compile_options(d, {}, shardy=False)
    base = cache.key(b"module", "p", d, options)

    class Device:
        platform, device_kind, id, process_index = "cpu", "other cpu", 0, 0

    xla_option = xla.compile_options(d, {"xla_cpu_enable_fast_math": True}, shardy=False)
    keys = {"module": cache.key(b"module2", "p", d, options), "pipeline": cache.key(b"module", "p2", d, options),
            "device kind": cache.key(b"module", "p", [Device()], options),
            "device count": cache.key(b"module", "p", d * 2, options),
            "xla option": cache.key(b"module", "p", d, xla_option),
            "shardy": cache.key(b"module", "p", d, xla.compile_options(d, {}, shardy=True))}
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false")
    keys["XLA_FLAGS"] = cache.key(b"module", "p", d, options)
    monkeypatch.delenv("XLA_FLAGS")
    real = cache.versions()
    monkeypatch.setattr(cache, "versions", lambda: {**real, "jax": "0.0.1"})
    keys["versions"] = cache.key(b"module", "p", d, options)
    assert {k for k, v in keys.items() if v == base} == set()
    assert len(set(keys.values())) == len(keys)


@pytest.mark.slow
def test_devices_and_shardings_never_share_an_entry(tmp_path):
    facts = json.loads(finish(child("mesh", tmp_path, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})))
    assert facts["misses"] == [True] * 5 + [False] and facts["entries"] == 5
    assert facts["same_after_hit"]


def test_host_callbacks_are_not_cached(tmp_path, capfd):
    def f(x, b):
        jax.debug.print("x = {}", x)
        return x + b, ()
    where = tmp_path / "cache"
    step = loopfuse.compile_step(f, cache_dir=where, dump_ir=tmp_path / "dump")
    step(jnp.ones(3), jnp.ones(3))
    jax.effects_barrier()
    assert "x = [1. 1. 1.]" in capfd.readouterr().out
    assert not where.exists() or not any(where.iterdir())
    (note,) = (tmp_path / "dump").glob("*/executable.txt")
    assert "not cached (the program has host callbacks)" in note.read_text()
    plain = loopfuse.compile_step(lambda x, b: (x + b, ()), cache_dir=where)
    plain(jnp.ones(3), jnp.ones(3))
    assert len(list(where.glob("*"))) == 1      # the same folder does cache a program without callbacks


# ---- damaged entries and folders ------------------------------------------------------------
def _flip_a_byte(path: Path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _other_version(path: Path):
    data = path.read_bytes()
    jax_version = f'"jax": "{jax.__version__}"'.encode()
    path.write_bytes(data.replace(jax_version, b'"jax": "0.0.1"' + b" " * (len(jax_version) - 14), 1))


def _not_an_entry(path: Path):
    path.write_bytes(b"\x00" * 64)


@pytest.mark.parametrize("damage", [_flip_a_byte, _truncate, _other_version, _not_an_entry],
                         ids=["corrupt", "truncated", "other version", "foreign file"])
def test_damaged_entry_warns_once_and_recompiles(tmp_path, damage, stored):
    reference = stored(tmp_path)
    (path,) = entries(tmp_path)
    damage(path)
    with pytest.warns(cache.CacheWarning, match="unusable") as caught:
        ex, out = compiled(tmp_path)
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    assert "xla" in ex.seconds
    assert_trees_equal(out, reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, out = compiled(tmp_path)      # the entry was rewritten
    assert "xla" not in again.seconds
    assert_trees_equal(out, reference)


def test_unwritable_folder_warns_and_runs_uncached(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _, reference = compiled(None)
    with pytest.warns(cache.CacheWarning, match="running uncached") as caught:
        ex, out = compiled(blocker / "cache")
    assert len(caught) == 1 and "xla" in ex.seconds
    assert_trees_equal(out, reference)


def test_concurrent_writers_both_succeed_and_readers_never_see_half_an_entry(tmp_path):
    writers = [child("store", tmp_path, i) for i in range(2)]
    deadline = time.monotonic() + TIMEOUT
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert time.monotonic() < deadline and all(w.poll() is None for w in writers), "a writer did not start"
        time.sleep(0.05)
    d = jax.devices()[:1]
    entry = cache.Entry(tmp_path / "shared.lfx", d, xla.compile_options(d, {xla.COPY_FREE["cpu"]: True}, shardy=False))
    context = make_context()
    (tmp_path / "go").touch()
    loads = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)   # a partial entry would warn
        while any(w.poll() is None for w in writers):
            loads += entry.load(context) is not None
    assert [finish(w).strip() for w in writers] == ["True", "True"]
    assert entry.load(context) is not None
    assert not list(tmp_path.glob("*.tmp"))
    assert loads > 0


# ---- the IR dump ----------------------------------------------------------------------------
def test_dump_says_where_the_executable_came_from(tmp_path):
    for _ in range(2):
        compiled(tmp_path / "cache", dump_ir=tmp_path / "dump")
    (folder,) = (tmp_path / "dump").iterdir()
    stages = sorted(p.name for p in folder.glob("*.mlir"))
    assert stages[0] == "00-traced.mlir" and stages[-1].endswith("-final.mlir") and len(stages) == 4
    assert (folder / "executable.txt").read_text().startswith("loaded from the compile cache")
