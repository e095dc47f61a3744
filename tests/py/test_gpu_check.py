"""bench/gpu_check.py --quick (the check a lent GPU runs) works on CPU: every section is filled and its
checks pass, except that while `simplify` is a default pass the GPT-style model's bits differ from
jax.jit's (simplify reassociates its arithmetic; issue 20 takes it out of the defaults). A corpus
row tells loopfuse's difference from jax.jit's own run-to-run variation; --sections runs only those."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import jax.numpy as jnp

from loopfuse.compile import pipeline

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_check.py"
SPEC = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)


def run_check(tmp_path, *args):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path), *args],
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=600)
    return proc, json.loads((tmp_path / "gpu_check.json").read_text())


@pytest.mark.slow
def test_quick_gpu_check_runs_on_cpu(tmp_path):
    proc, report = run_check(tmp_path)
    assert (tmp_path / "gpu_check.md").read_text() in proc.stdout
    assert report["environment"]["platform"] == "cpu" and report["errors"] == {}
    assert list(report["seconds"]) == [*gpu_check.SECTIONS, "all"]
    simplified = "simplify" in pipeline.DEFAULT_PASSES
    checks = {(r["problem"], r["check"]): r["ok"] for r in report["results"]}
    expected = {k: not (simplified and k[0].startswith("GPT")) for k in checks}
    assert ("tiny MLP", "until stops like jax.jit") in checks and ("tiny MLP", "debug.callback 4 times in loop(4)") in checks
    assert ("GPT 1x16", "loop(4) == jax.jit scan(4)") in checks
    assert checks == expected, report["results"]
    assert proc.returncode == (1 if simplified else 0), proc.stderr[-3000:]
    # corpus: a step and a loop per program, all equal to jax.jit's (a CPU's jax.jit does not vary)
    rows = report["corpus"]["rows"]
    assert [(r["program"], r["check"]) for r in rows] == [
        ("diffrax_saveat_t1", "step == jax.jit"), ("diffrax_saveat_t1", "loop(3) == 3 jax.jit steps"),
        ("cond_switch", "step == jax.jit"), ("cond_switch", "loop(3) == jax.jit scan(3)"),
        ("segment_sum_scatter_add", "step == jax.jit"), ("segment_sum_scatter_add", "loop(3) == jax.jit scan(3)")]
    assert all(r["status"] == "ok" for r in rows), rows
    assert set(report["corpus"]["seconds"]) == set(gpu_check.CORPUS_QUICK)
    for row in report["speed"].values():
        assert set(row) == {"jax.jit + donation", "loopfuse step", "hand-written scan(4)", "loopfuse loop(4)"}
        assert all(v["steps_per_s"] > 0 for v in row.values())
    # anatomy: the tiny MLP's executables, their instructions in and outside the loop, the host time of a call
    anatomy = report["anatomy"]["variants"]
    assert list(anatomy) == ["jax.jit + donation", "loopfuse step", "hand-written scan(4)", "loopfuse loop(4)"]
    for name, r in anatomy.items():
        looped = "(4)" in name
        assert (r["ops"]["outside"].get("while") == 1) == looped and bool(r["ops"]["loop body"]) == looped
        assert r["ops"]["loop body" if looped else "outside"].get("fusion", 0) > 0
        assert (r["xla_options"] is None) == name.startswith(("jax.jit", "hand-written"))
        assert 0 < r["host_us"] <= r["whole_us"]
    assert "## What a call of the tiny MLP runs" in proc.stdout
    assert len(report["memory"]) == 2
    for m in report["memory"].values():
        assert m["option"] == "xla_cpu_copy_insertion_use_region_analysis" and m["bitwise_equal"]
        assert all(r["peak"] == r["argument"] + r["output"] - r["alias"] + r["temp"] > 0 for r in m["rows"].values())
    assert report["cache"] == {**report["cache"], "ok": True, "xla_ran": [True, False], "same_bits": True}
    # pack: every variant compiled and timed; the scan is its own reference and loopfuse's loop equals it
    ensemble = report["ensemble"]      # issue 32's quadratic, 64 members in tiles of 32: XLA sums a batch of 32
    assert ensemble["params_and_steps"] and ensemble["history_rel_diff"] < 1e-6   # otherwise (README, "Ensembles")
    assert ensemble["ratio"] > 0 and "optimistix" in ensemble["markdown"]
    pack = report["pack"]
    assert pack["leaves"] == gpu_check.PACK["quick"]["leaves"] and list(pack["rows"]) == list(gpu_check.PACK_VARIANTS)
    rows = {name: by_k[str(gpu_check.PACK["k"])] for name, by_k in pack["rows"].items()}
    assert all(r["compile_s"] > 0 and r["steps_per_s"] > 0 for r in rows.values())
    assert rows["lax.scan (jax.jit, donated)"]["bitwise_vs_scan"] and rows["loopfuse loop"]["bitwise_vs_scan"]
    assert "## Packed state (issue 23)" in proc.stdout and "## Differential corpus" in proc.stdout
    # shuffle: bench_data's 1M x 16 at a tenth; the shuffled Dataset's epoch loop equals the fixed order's
    sh = report["shuffle"]
    assert sh["size"] == gpu_check.SHUFFLE["size"] and sh["bitwise"] and sh["random_equals_shuffled_dataset"]
    assert set(sh["results"]["variants"]) == {f"{a} arrays, {s}" for a in ("device", "numpy")
                                              for s in ("unshuffled", "shuffled")}
    assert all(r["steps_per_s"]["median"] > 0 for r in sh["results"]["variants"].values())
    assert sh["results"]["epoch_order_cpu_s"] > 0 and "## Shuffled Dataset (issue 23 item 4)" in proc.stdout
    # layers: the GPT's blocks and the flax linen and nnx GPTs' rolled, the loss after 3 steps within the
    # check's tolerance of jax.jit's
    ly = report["layers"]
    assert ly["ok"] and list(ly["models"]) == ["GPT", "flax linen GPT", "flax nnx GPT"]
    assert ly["models"]["GPT"]["report"].startswith("rolled [0]['blocks']")
    assert ly["models"]["flax linen GPT"]["report"].startswith("rolled [0]['params']['_LinenBlock_*']")
    for m in ly["models"].values():
        assert m["rolled"] and m["ok"] and all(r["temp"] > 0 and r["steps_per_s"] > 0 for r in m["rows"].values())
    assert "## Rolled layers (issues 31 and 38): ok" in proc.stdout


@pytest.mark.slow     # the script runs on a lent GPU; default: its rows' and report's logic below
def test_sections_runs_only_those(tmp_path):
    proc, report = run_check(tmp_path, "--sections", "ensemble", "anatomy")     # two of the cheapest
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(report["seconds"]) == ["anatomy", "ensemble", "all"]   # in the script's order, not the command's
    assert {"anatomy", "ensemble"} <= set(report) and not {"results", "cache", "memory", "speed"} & set(report)
    assert "gpu_check: anatomy took" in proc.stdout and "## Results" not in proc.stdout


def test_corpus_row_tells_loopfuse_from_jit_variation():
    """Equal bits: ok; loopfuse off by 2**-23 in one leaf: FAILED with the difference; jax.jit
    differing from itself: its own status, which fails nothing."""
    one, other = {"a": jnp.ones(3), "b": jnp.zeros(2)}, {"a": jnp.ones(3).at[1].add(2.0 ** -23), "b": jnp.zeros(2)}
    runs = iter([one, other])
    rows = [gpu_check.differential("p", "c", lambda: one, lambda: one),
            gpu_check.differential("p", "c", lambda: other, lambda: one),
            gpu_check.differential("p", "c", lambda: one, lambda: next(runs))]
    assert [r["status"] for r in rows] == ["ok", "FAILED", gpu_check.VARIES]
    assert rows[1]["detail"] == "1 of 2 leaves differ (['a']); max abs 1.19e-07, max rel 1.19e-07"
    assert rows[2]["detail"].startswith("jax.jit against itself: 1 of 2 leaves differ")
    report = {"corpus": {"rows": rows[:1] + rows[2:]}, "errors": {}}
    assert gpu_check.failures(report) == []
    assert gpu_check.failures({"corpus": {"rows": rows}, "errors": {}}) == ["corpus"]
