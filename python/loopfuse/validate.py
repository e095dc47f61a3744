"""Checks of user-given arguments shared by every entry point (one rule, one message)."""

STEPS_LIMIT = 2**31  # the device loop counter is int32


def steps(value, name: str = "steps") -> int:
    """`value` as a step count: a positive int (not a bool) below 2**31, which the int32 loop counter holds.

    Raises TypeError for another type and ValueError out of range, naming the argument `name`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    if value >= STEPS_LIMIT:
        raise ValueError(f"{name} must be below 2**31 (the device loop counter is int32), got {value}")
    return value
