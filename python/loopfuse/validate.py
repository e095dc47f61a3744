"""Checks of user-given arguments shared by every entry point (one rule, one message)."""
import operator

STEPS_LIMIT = 2**31  # the device loop counter is int32


def steps(value, name: str = "steps") -> int:
    """`value` as a step count: a positive integer (an int or numpy integer, not a bool) below 2**31,
    which the int32 loop counter holds.

    Raises TypeError for another type and ValueError out of range, naming the argument `name`.

    Examples:
        >>> import numpy as np
        >>> steps(np.int64(8))
        8
        >>> steps(0, "chunk")
        Traceback (most recent call last):
        ValueError: chunk must be a positive int, got 0
        >>> steps(2.0)
        Traceback (most recent call last):
        TypeError: steps must be a positive int, got float 2.0
    """
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    if value >= STEPS_LIMIT:
        raise ValueError(f"{name} must be below 2**31 (the device loop counter is int32), got {value}")
    return value


def budget(value, name: str = "memory_budget") -> float:
    """`value` as a memory budget: a real number in [0, 1] (0: the least memory, 1: the step as traced).

    Examples:
        >>> budget(0)
        0.0
        >>> budget(1.5)
        Traceback (most recent call last):
        ValueError: memory_budget must be in [0, 1], got 1.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(value).__name__} {value!r}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value:g}")
    return value
