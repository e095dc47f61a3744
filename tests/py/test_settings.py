"""Settings a keyword gives, else an environment variable (loopfuse.settings): folders expand ``~``."""
from pathlib import Path

import jax.numpy as jnp
import pytest

import loopfuse
from loopfuse import settings

ENV = "LOOPFUSE_TEST_FOLDER"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home folder ($HOME) in tmp_path, the current directory another folder there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV, raising=False)
    return tmp_path / "home"


def test_folder_expands_the_home_folder(home, monkeypatch):
    assert settings.folder("~/.cache/loopfuse", ENV) == home / ".cache" / "loopfuse"
    assert settings.folder(Path("~") / "x", ENV) == home / "x"
    assert settings.folder("runs/~1", ENV) == Path("runs/~1")                   # only a leading ~
    monkeypatch.setenv(ENV, "~/from-env")
    assert settings.folder(None, ENV) == home / "from-env"


def test_folder_unset_or_empty_is_none(home, monkeypatch):
    assert settings.folder(None, ENV) is None and settings.folder("", ENV) is None
    monkeypatch.setenv(ENV, "")
    assert settings.folder(None, ENV) is None


def test_cache_dir_and_dump_ir_under_the_home_folder(home, tmp_path):
    def step(x, b):
        return x * b + 1.0, {"sum": jnp.sum(x)}
    compiled = loopfuse.compile_step(step, cache_dir="~/.cache/loopfuse", dump_ir="~/dump")
    compiled(jnp.ones(3), jnp.ones(3))
    assert list((home / ".cache" / "loopfuse").iterdir()) and list((home / "dump").iterdir())
    assert not (tmp_path / "~").exists()
