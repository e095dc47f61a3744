"""Fixtures shared by the test files (helpers and problems are in problems.py)."""
import signal

import pytest


@pytest.fixture
def sigint_raises():
    """SIGINT raising KeyboardInterrupt, whatever this process inherited (a shell starts a background
    job with SIGINT ignored, and Python then leaves it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def no_executable_of_an_earlier_test():
    """Each test compiles its own programs: none is served from the executables an earlier test left in this
    process's memory (`cache.RECENT`), so a test that patches a pass sees its patch run. (A test that patches one
    after compiling the same program clears them itself.)"""
    from loopfuse.compile import cache
    cache.RECENT.clear()
