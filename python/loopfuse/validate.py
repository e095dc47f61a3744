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
