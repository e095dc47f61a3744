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
