"""Dump-IR (keyword and environment variable), pass-failure reproducers, and their replay."""
import errno
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse.compile import pipeline
from loopfuse.compile.mlir_context import parse_module
from loopfuse.passes import Simplify
from problems import batch, init_state, train_step

EXPECTED = ["00-traced", "01-after-drop-unused-outputs", "02-after-wrap-loop", "03-after-alias-state", "04-final"]


def _check_dump(root):
    (folder,) = [d for d in root.iterdir() if d.is_dir()]
    files = sorted(p.stem for p in folder.glob("*.mlir"))
    assert files == EXPECTED
    for p in folder.glob("*.mlir"):
        parse_module(p.read_text())  # every stage is valid MLIR
    assert "stablehlo.while" in (folder / "04-final.mlir").read_text()
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
        loopfuse.compile_step(train_step(optax.sgd(0.1)), dump_ir=tmp_path, passes=["simplify"])(state, batch())
    repro = err.value.reproducer
    assert repro.parent.parent == tmp_path
    assert not (repro.parent / "executable.txt").exists()      # XLA never ran: nothing says it compiled
    text = repro.read_text()
    assert text.startswith("// loopfuse-pipeline: builtin.module(simplify,alias-state)")
    parse_module(text)
    monkeypatch.undo()
    replay = subprocess.run([sys.executable, "-m", "loopfuse.diagnostics.opt", "--reproducer", str(repro)],
                            capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    assert "tf.aliasing_output" in replay.stdout  # the healthy pipeline runs to the end
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


def test_failure_without_dump_dir_still_writes_a_reproducer(monkeypatch):
    monkeypatch.setattr(Simplify, "apply", _broken)
    with pytest.raises(pipeline.PipelineError) as err:
        loopfuse.compile_step(lambda s, b: (s + b, 0.0), passes=["simplify"])(jnp.ones(2), jnp.ones(2))
    assert err.value.reproducer.exists()


def test_unknown_pass_is_a_clear_error():
    with pytest.raises(loopfuse.LoopfuseError, match="pass 'no-such-pass' failed: unknown pass"):
        loopfuse.compile_step(lambda s, b: (s + b, 0.0), passes=["no-such-pass"])(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match="pass 'wrap-loop' option 'steps': expects int"):   # a loopfuse pass's
        loopfuse.compile_step(lambda s, b: (s + b, 0.0), passes=["wrap-loop{steps=x}"])   # options: when it is made


def _add(s, b):
    return s + b, jnp.sum(s)


def test_programs_that_differ_get_their_own_dump_folders(tmp_path):
    step = loopfuse.compile_step(_add, dump_ir=tmp_path)
    for variant in [step, step.loop(2), step.loop(3), loopfuse.compile_step(_add, dump_ir=tmp_path, passes=["simplify"]),
                    loopfuse.compile_step(_add, dump_ir=tmp_path, donate=False)]:
        variant.lower(jnp.ones(2), jnp.ones(2))
    folders = [d for d in tmp_path.iterdir()]
    assert len(folders) == 5 and all(d.name.startswith("_add-") for d in folders)
    finals = {p.name for d in folders for p in d.glob("*-final.mlir")}
    assert finals == {"02-final.mlir", "03-final.mlir", "04-final.mlir"}  # no alias, step, loop or simplify


def test_a_function_name_cannot_escape_the_dump_folder(tmp_path):
    def evil(s, b):
        return s + b, 0.0
    evil.__name__ = "../../x y"
    loopfuse.compile_step(evil, dump_ir=tmp_path / "dump").lower(jnp.ones(2), jnp.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["dump"]
    (folder,) = (tmp_path / "dump").iterdir()
    assert re.fullmatch(r"_x_y-[0-9a-f]{12}", folder.name)


def _disk_full(monkeypatch):
    """Every Path.write_text creates its file and then fails as a full disk does."""
    def write_text(self, *args, **kwargs):
        self.open("w").close()
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


def test_a_full_disk_neither_masks_the_pass_failure_nor_leaves_an_empty_reproducer(tmp_path, monkeypatch):
    monkeypatch.setattr(Simplify, "apply", _broken)
    _disk_full(monkeypatch)
    state = jnp.ones(2)
    with pytest.warns(UserWarning, match="IR dump stopped.*No space left on device"):
        with pytest.raises(pipeline.PipelineError,
                           match="(?s)deliberately broken.*reproducer: not written.*No space") as err:
            loopfuse.compile_step(_add, dump_ir=tmp_path, passes=["simplify"])(state, jnp.ones(2))
    assert err.value.reproducer is None and err.value.write_error.errno == errno.ENOSPC
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no empty or partial file left behind
    assert not state.is_deleted()


def test_a_full_disk_during_the_dump_warns_and_still_compiles(tmp_path, monkeypatch):
    _disk_full(monkeypatch)
    with pytest.warns(UserWarning, match="IR dump stopped"):
        out, _ = loopfuse.compile_step(_add, dump_ir=tmp_path)(jnp.ones(2), jnp.ones(2))
    np.testing.assert_array_equal(out, 2 * np.ones(2))
