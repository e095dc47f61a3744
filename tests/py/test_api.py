"""The package's public names: imported on first use, each the documented object."""
import subprocess
import sys

import pytest

import loopfuse


def test_every_public_name_resolves_and_is_listed():
    assert sorted(loopfuse.__all__) == sorted(set(loopfuse.__all__))
    for name in loopfuse.__all__:
        assert getattr(loopfuse, name).__name__ == name
    assert set(loopfuse.__all__) <= set(dir(loopfuse))


def test_fit_is_the_function_whatever_was_imported_first():
    """Importing the driver modules first (as `minimize` does) must not shadow `loopfuse.fit`."""
    code = ("import loopfuse.drivers.solve, loopfuse.drivers.fitting, loopfuse.drivers.chunks\nimport loopfuse\n"
            "assert callable(loopfuse.fit) and loopfuse.fit.__module__ == 'loopfuse.drivers.fitting', loopfuse.fit\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="compile_stepp"):
        loopfuse.compile_stepp  # noqa: B018
