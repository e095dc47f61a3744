"""Where an op comes from, for messages: its name and the line of the user's code that made it, the
innermost frame of its location outside jax and the libraries a step calls into (`LIBRARIES`)."""
import functools
import importlib.util
import os
import re

from jaxlib.mlir import ir

# frames inside them are not the user's line (an equinox layer's, a diffrax solve's: the line that calls it is)
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "equinox", "haiku", "diffrax", "optimistix", "lineax", "loopfuse")


def described(op: ir.Operation) -> str:
    """``stablehlo.dot_general (model.py:12)``: the op and its `line`, or the op alone where it has none."""
    where = line(op)
    return f"{op.name} ({where})" if where else op.name


def line(op: ir.Operation) -> str | None:
    """``model.py:12``: the user's file:line of `op`'s location (the innermost frame outside
    `LIBRARIES`, else the innermost), or None where it has none."""
    found = re.findall(r'"([^"]+)":(\d+)(?::\d+)?', str(op.location))
    if not found:
        return None
    file, number = next((f for f in found if not in_library(f[0])), found[0])
    return f"{file.rsplit('/', 1)[-1]}:{number}"


@functools.cache
def in_library(file: str) -> bool:
    """Whether `file` is inside one of `LIBRARIES` (asked once per file: a resolved path costs file system calls)."""
    return os.path.realpath(file).startswith(_library_folders())


@functools.cache
def _library_folders() -> tuple[str, ...]:
    folders = []
    for name in LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        folders += [os.path.join(os.path.realpath(f), "") for f in (spec.submodule_search_locations or [])] if spec else []
    return tuple(folders)
