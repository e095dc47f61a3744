"""Dump-IR (keyword and environment variable), pass-failure reproducers, and their replay."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

import loopfuse
from loopfuse import pipeline
from loopfuse.mlir_context import parse_module
from loopfuse.passes import Simplify
from problems import batch, init_state, train_step

EXPECTED = ["00-traced", "01-after-drop-unused-outputs", "02-after-simplify", "03-after-wrap-loop",
            "04-after-alias-state", "05-final"]


def _check_dump(root):
    (folder,) = [d for d in root.iterdir() if d.is_dir()]
    files = sorted(p.stem for p in folder.glob("*.mlir"))
    assert files == EXPECTED
    for p in folder.glob("*.mlir"):
        parse_module(p.read_text())  # every stage is valid MLIR
    assert "stablehlo.while" in (folder / "05-final.mlir").read_text()
    assert "stablehlo.while" not in (folder / "00-traced.mlir").read_text()


def test_dump_ir_keyword(tmp_path):
    opt = optax.sgd(0.1)
    loopfuse.compile_step(train_step(opt), dump_ir=tmp_path, steps=3)(init_state(opt), batch())
    _check_dump(tmp_path)


def test_dump_ir_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPFUSE_DUMP_IR", str(tmp_path))
    opt = optax.sgd(0.1)
    loopfuse.compile_step(train_step(opt)).loop(3)(init_state(opt), batch())
    _check_dump(tmp_path)


def _broken(self, module_op):
    raise RuntimeError("deliberately broken")


def test_pass_failure_names_the_pass_and_writes_a_replayable_reproducer(tmp_path, monkeypatch):
    monkeypatch.setattr(Simplify, "apply", _broken)
    state = init_state(optax.sgd(0.1))
    with pytest.raises(pipeline.PipelineError, match="pass 'simplify' failed: deliberately broken") as err:
        loopfuse.compile_step(train_step(optax.sgd(0.1)), dump_ir=tmp_path)(state, batch())
    repro = err.value.reproducer
    assert repro.parent.parent == tmp_path
    text = repro.read_text()
    assert text.startswith("// loopfuse-pipeline: builtin.module(simplify,alias-state)")
    parse_module(text)
    monkeypatch.undo()
    replay = subprocess.run([sys.executable, "-m", "loopfuse.opt", "--reproducer", str(repro)],
                            capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    assert "tf.aliasing_output" in replay.stdout  # the healthy pipeline runs to the end
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


def test_failure_without_dump_dir_still_writes_a_reproducer(monkeypatch):
    monkeypatch.setattr(Simplify, "apply", _broken)
    with pytest.raises(pipeline.PipelineError) as err:
        loopfuse.compile_step(lambda s, b: (s + b, 0.0))(jnp.ones(2), jnp.ones(2))
    assert err.value.reproducer.exists()


def test_unknown_pass_is_a_clear_error():
    with pytest.raises(loopfuse.LoopfuseError, match="pass 'no-such-pass' failed: unknown pass"):
        loopfuse.compile_step(lambda s, b: (s + b, 0.0), passes=["no-such-pass"])(jnp.ones(2), jnp.ones(2))
