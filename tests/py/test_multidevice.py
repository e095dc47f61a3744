"""SPMD over 4 CPU devices: compile_step(..., devices=, sharding=) and its .loop(K).

jax fixes the device count at its first import, which another test module has already done in
this pytest process, so the checks run in a fresh interpreter (multidevice_check.py, with
``--xla_force_host_platform_device_count=4``) that prints its findings as JSON; the assertions
are here.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).with_name("multidevice_check.py")
K = 4                      # multidevice_check.K
TOL = 1e-5                 # max |sharded - single| / max |single| per leaf (cross-device sum order differs)
BATCH_SPLIT = '#sdy.sharding<@mesh, [{"data"}, {}]>'


@pytest.fixture(scope="module")
def facts() -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"multidevice_check.py failed:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout)


def section(facts: dict, name: str) -> dict:
    out = facts[name]
    assert "exception" not in out or name == "bad_batch", f"{name} check raised:\n{out.get('traceback')}"
    return out


def test_four_cpu_devices(facts):
    assert facts["device_count"] == 4
    assert section(facts, "data")["num_devices"] == 4


# ---- sharding="data" ---------------------------------------------------------------------------
def test_data_parallel_matches_single_device(facts):
    d = section(facts, "data")
    ref = np.array(d["ref_losses"])
    assert ref.shape == (K,) and ref[-1] < ref[0]
    np.testing.assert_allclose(d["step_losses"], ref, rtol=TOL)
    np.testing.assert_allclose(d["loop_losses"], ref, rtol=TOL)   # the [K] history of one loop call
    assert d["step_state_rel_diff"] < TOL
    assert d["loop_state_rel_diff"] < TOL
    assert d["loop2_state_rel_diff"] < TOL                           # a second call from the returned state
    assert d["step_compile_count"] == 1
    assert d["loop_compile_count"] == 1                              # two calls; lower() runs no XLA


def test_data_parallel_outputs_span_all_devices(facts):
    d = section(facts, "data")
    for where in ("step_placement", "loop_placement"):
        leaves = d[where]
        assert leaves
        for path, leaf in leaves.items():
            assert leaf["is_jax_array"], (where, path)
            assert leaf["num_devices"] == 4 and leaf["fully_addressable_shards"] == 4, (where, path, leaf)
            assert leaf["spec"] == "P()", (where, path, leaf)      # "data" replicates state and aux
            assert leaf["shard_shape"] == leaf["shape"], (where, path, leaf)
    assert d["loop_placement"]["['aux']['loss']"]["shape"] == [K]


def test_data_parallel_final_ir(facts):
    sig = section(facts, "data")["signature"]
    text = sig["text"]
    assert sig["has_mesh"]
    assert len(sig["mesh_lines"]) == 1 and sig["mesh_lines"][0].startswith('sdy.mesh @mesh = <["data"=4]>')
    assert sig["while_count"] == 1
    batch_args = [a for a in sig["args"] if a["state"] is None]
    state_args = [a for a in sig["args"] if a["state"] is not None]
    assert [a["type"] for a in batch_args] == ["tensor<16x4xf32>", "tensor<16x2xf32>"]
    assert all(a["sharding"] == BATCH_SPLIT for a in batch_args), batch_args
    assert state_args and all(a["sharding"] is not None and '"data"' not in a["sharding"] for a in state_args)
    # The same, read straight off the text.
    assert re.search(r'%arg\d+: tensor<16x4xf32> \{sdy\.sharding = #sdy\.sharding<@mesh, \[\{"data"\}, \{\}\]>\}', text)
    assert re.search(r'%arg\d+: tensor<16x2xf32> \{sdy\.sharding = #sdy\.sharding<@mesh, \[\{"data"\}, \{\}\]>\}', text)
    # The loss history: a [K] aux result with the unsharded step axis wrap-loop prepends.
    aux = [r for r in sig["results"] if r["state"] is None]
    assert [(r["type"], r["sharding"]) for r in aux] == [(f"tensor<{K}xf32>", "#sdy.sharding<@mesh, [{}]>")]


DATA_PARALLEL_CHECKS = """\
CHECK: sdy.mesh @mesh = <["data"=4]>
CHECK-LABEL: func.func public @main
CHECK-SAME: loopfuse.state = "['params']['w1']", sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>, tf.aliasing_output
CHECK-SAME: %arg{{[0-9]+}}: tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}
CHECK-SAME: %arg{{[0-9]+}}: tensor<16x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}
CHECK-SAME: tensor<4xf32> {{{.*}}sdy.sharding = #sdy.sharding<@mesh, [{}]>}
CHECK: stablehlo.while
CHECK-NOT: stablehlo.while
"""


def test_data_parallel_final_ir_filecheck(facts, tmp_path):
    checks = tmp_path / "checks.txt"
    checks.write_text(DATA_PARALLEL_CHECKS)
    run = subprocess.run([sys.executable, "-m", "filecheck", str(checks)], input=section(facts, "data")["signature"]["text"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# ---- sharding="params" -------------------------------------------------------------------------
def test_params_sharding_splits_large_leaves(facts):
    p = section(facts, "params")
    placement = p["placement"]
    for path in ("['state']['params']['w']", "['state']['opt'][0].mu['w']", "['state']['opt'][0].nu['w']"):
        leaf = placement[path]
        assert leaf["shape"] == [256, 1024]
        assert leaf["spec"] == "P('data',)", (path, leaf)
        assert leaf["shard_shape"] == [64, 1024], (path, leaf)
        assert leaf["num_devices"] == 4
    for path in ("['state']['params']['b']", "['state']['params']['v']", "['state']['opt'][0].count",
                 "['aux']['loss']"):  # small leaves stay replicated
        assert placement[path]["spec"] == "P()", (path, placement[path])
        assert placement[path]["num_devices"] == 4
    args = {a["state"]: a["sharding"] for a in p["signature"]["args"]}
    results = {r["state"]: r["sharding"] for r in p["signature"]["results"] if r["state"] is not None}
    for path in ("['params']['w']", "['opt'][0].mu['w']", "['opt'][0].nu['w']"):
        assert args[path] == '#sdy.sharding<@mesh, [{"data"}, {}]>', (path, args[path])
        assert results[path] == args[path]
    assert args["['params']['b']"] == "#sdy.sharding<@mesh, [{}]>"
    assert p["signature"]["while_count"] == 1


def test_params_sharding_matches_single_device(facts):
    p = section(facts, "params")
    ref = np.array(p["ref_losses"])
    assert ref[-1] < ref[0]
    np.testing.assert_allclose(p["loop_losses"], ref, rtol=TOL)
    assert p["state_rel_diff"] < TOL


# ---- errors and datasets -----------------------------------------------------------------------
def test_indivisible_batch_names_the_leaf(facts):
    b = facts["bad_batch"]
    assert b["exception"] == "StateMismatchError" and b["is_state_mismatch"], b
    assert "['w']" in b["message"] and "(6,)" in b["message"] and "4 devices" in b["message"], b["message"]
    assert "['x']" not in b["message"]
    assert b["compile_count"] == 0  # refused before XLA is asked
    assert b.get("bare_message", "").startswith("the batch has shape (6, 3): its leading (batch) axis"), b


@pytest.mark.parametrize("kind", ["no_key", "key"])
def test_dataset_batch_on_four_devices(facts, kind):
    d = section(facts, "dataset")[kind]
    np.testing.assert_allclose(d["loop_losses"], d["ref_losses"], rtol=TOL)
    assert len(d["loop_losses"]) == 7
    assert d["state_rel_diff"] < TOL
    assert all(leaf["num_devices"] == 4 and leaf["is_jax_array"] for leaf in d["placement"].values())


def test_scalar_batch_leaf_is_replicated_and_dataset_batch_size_must_divide(facts):
    d = section(facts, "scalars")
    np.testing.assert_allclose(d["scalar_out"], [0.5, 0.5, 0.5])
    assert d["dataset_error"] and "batch_size=6" in d["dataset_error"] and "4 devices" in d["dataset_error"]


def test_minimize_with_a_sharded_compiled_loop_matches_one_device(facts):
    d = section(facts, "minimize")
    assert d["num_devices"] == 4
    assert d["rel_diff"] < TOL and d["history_diff"] < 1e-5


# ---- micro_batches -----------------------------------------------------------------------------
def test_micro_batches_spread_each_slice_over_the_devices(facts):
    """Each of the 2 slices is 4 rows of each device's 8 (the batch viewed as [4 devices, 2 slices, 4,
    ...]): the fixed batch and a shuffled Dataset's match the whole batch on one device within the
    tolerance of both (the slices' sums and the devices' all-reduce reassociate the gradient); the
    wide model's temporaries per device fall with 4 slices."""
    d = section(facts, "micro_batch")
    assert d["report"].startswith("micro-batched into 2 slices, each spread over 4 devices")
    assert d["dataset_report"].startswith("micro-batched into 2 slices, each spread over 4 devices")
    assert "tensor<32x4xf32>) -> tensor<4x2x4x4xf32>" in d["final"]
    np.testing.assert_allclose(d["loop_losses"], d["ref_losses"], rtol=TOL)
    assert d["state_rel_diff"] < TOL
    assert all(leaf["num_devices"] == 4 for leaf in d["placement"].values())
    np.testing.assert_allclose(d["dataset_losses"], d["dataset_ref_losses"], rtol=TOL)
    assert d["dataset_state_rel_diff"] < TOL
    assert d["temp"]["4"] < d["temp"]["None"], d["temp"]


# ---- verify ------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["step", "loop", "dataset"])
def test_verify_passes_a_data_parallel_adam_mlp(facts, call):
    """verify compares a program over the mesh with jax.jit over the same mesh: the step and loop(K) equal
    jax.jit with the same shardings bitwise, one device's only to rounding (the all-reduce sums in another
    order), which verify took for a miscompile when its reference ran on one device."""
    v = section(facts, "verify")
    assert not v["one_device_equal"]       # what verify compared the program with before
    d = v[call]
    assert "miscompile" not in d, d["miscompile"]
    assert d["rel_diff"] < TOL if call == "dataset" else d["equal"]


def test_verify_still_names_a_wrong_pass_on_the_mesh(facts):
    """Without the pass the program equals the sharded reference, so the bisection names the pass."""
    wrong = section(facts, "verify")["wrong_pass"]
    assert wrong is not None and wrong["path"].startswith("the state leaf"), wrong
    assert wrong["culprits"] == ["the pass 'negate-first-result'"], wrong


# ---- memory_budget on a mesh -------------------------------------------------------------------
def test_rolling_a_pytree_state_counts_one_devices_share_of_the_activations(facts):
    """Stacking the replicated layers' leaves inside the call costs each device a whole copy; the activations
    rolling saves are split over the devices. On one device the pytree rolls (0.62x); on 4 it would hold 1.57x
    the unrolled step's temporaries, so the pass declines it there; packed, it rolls on both."""
    one, four = (section(facts, "roll")[n] for n in ("1", "4"))
    assert one["report"].startswith("rolled") and one["pytree"] < 0.7 * one["unrolled"], one
    assert four["report"].startswith("did not roll") and "stacking the layers' leaves" in four["report"], four
    assert four["pytree"] <= four["unrolled"], four
    assert one["packed"] < 0.4 * one["unrolled"] and four["packed"] < 0.5 * four["unrolled"], (one, four)


def test_a_mesh_in_effect_with_explicit_axes_is_named(facts):
    out = section(facts, "set_mesh")
    explicit, auto = out["AxisType.Explicit"], out["AxisType.Auto"]
    assert explicit["message"].startswith("compile_step(devices=...) lays the state and the batch out over a mesh of "
                                          "its own") and explicit["state_kept"], explicit
    assert auto == {"equal": True}, auto


def test_a_layout_over_several_devices_needs_devices(facts):
    """jax.jit runs a step that lays values out over 4 devices over them; without devices= loopfuse refuses it
    (it ran on one device, dropping the layout) and keeps the state, with devices= it equals jax.jit."""
    for name in ("constraint", "shard_map"):
        out = section(facts, "constraint")[name]
        assert out["message"].startswith("fn lays values out over 4 devices") and out["state_kept"], out
        assert out["equal_with_devices"], out
