"""Checks of user-given arguments shared by every entry point (one rule, one message)."""
import math
import operator
import os
import re

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


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_limit(value, name: str = "memory_limit") -> int | str:
    """`value` as a memory limit: a positive number of bytes (an int or a float, rounded down), a string of a
    number and a unit (``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``: KiB, MiB, GiB and TiB are powers of 1024, KB, MB,
    GB and TB of 1000), or ``"device"`` (resolved where the devices are known, `memory_plan.limit_bytes`).

    Examples:
        >>> memory_limit("2GiB"), memory_limit("1.5 kB"), memory_limit(4096), memory_limit("device")
        (2147483648, 1500, 4096, 'device')
        >>> memory_limit("2 gigs")
        Traceback (most recent call last):
        ValueError: memory_limit must be bytes, a size such as "2GiB" or "512 MiB", or "device"; got '2 gigs'
        >>> memory_limit(0.5)
        Traceback (most recent call last):
        ValueError: memory_limit must be at least 1 byte, got 0.5
    """
    given = value
    if isinstance(value, str):
        found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if value.strip() == "device":
            return "device"
        if found is None or found[2].lower() not in _UNITS:
            raise ValueError(f'{name} must be bytes, a size such as "2GiB" or "512 MiB", or "device"; got {value!r}')
        value = float(found[1]) * _UNITS[found[2].lower()]
    elif isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(type(value), "__index__"):
        raise TypeError(f'{name} must be bytes, a size such as "2GiB", or "device"; got {type(value).__name__} '
                        f"{value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of bytes, got {given!r}")
    value = int(value) if isinstance(value, float) else operator.index(value)
    if value < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {given!r}")
    return value


def folder(value, name: str):
    """`value` as a folder setting: None, a str or an os.PathLike (a TypeError naming `name` else: bytes and
    numbers failed inside pathlib at the first call)."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder (a str or os.PathLike) or None, got {type(value).__name__} {value!r}")
    return value


def device(value, name: str = "device"):
    """`value` as the one device to run on: None or a jax Device."""
    import jax
    if value is not None and not isinstance(value, jax.Device):
        raise TypeError(f"{name} must be a jax device (e.g. jax.devices()[0], jax.devices('cpu')[0]) or None, got "
                        f"{type(value).__name__} {value!r}")
    return value


def xla_options(xla_options) -> dict:
    """`xla_options` (None or a mapping of XLA option name to bool/int/float/str, or None to leave an
    option unset) as a dict."""
    if xla_options is None:
        return {}
    if not hasattr(xla_options, "items"):
        raise TypeError(f"xla_options must be a mapping of XLA option names to values, got {xla_options!r}")
    for name, value in xla_options.items():
        if not isinstance(name, str) or not (value is None or isinstance(value, (bool, int, float, str))):
            raise TypeError(f"xla_options[{name!r}] = {value!r}: names must be str and values bool, int, "
                            "float, str, or None (leave the option unset)")
    return dict(xla_options)
