"""Errors loopfuse raises; each names the leaf, shape, pass or line at fault (`FitError`, which carries a
`FitResult`, is in `results`), and the one way it warns (`warn`; `_jax_compat`, which imports no other module of
loopfuse's, warns on its own)."""
import functools
import os
import sys
import types
import warnings


class LoopfuseError(Exception):
    """Base class for loopfuse errors."""


class StateMismatchError(LoopfuseError, ValueError):
    """A pytree leaf's structure, shape or dtype is not what the step needs."""


class DonatedArrayError(LoopfuseError, RuntimeError):
    """An array that an earlier call donated (and so deleted) was passed again."""


class AuxPathError(LoopfuseError, ValueError):
    """A `keep_aux` entry names no leaf or subtree of the step's aux."""


class InitFoldError(LoopfuseError, ValueError):
    """A loop cannot start from its init inside its program (`Step.loop`'s ``init``): the step has ordered
    effects, its state typed PRNG keys, or the init effects of its own."""


class CheckpointError(LoopfuseError, RuntimeError):
    """The latest checkpoint of a run cannot be read (damaged after it was written): the message names it and the
    one before it."""


class MemoryReportError(LoopfuseError, RuntimeError):
    """XLA did not write the buffer assignment or live ranges that `Step.memory_report` reads."""


class MemoryLimitError(LoopfuseError, ValueError):
    """No plan of the step fits its ``memory_limit``: ``floor`` is the least peak any plan reaches (bytes),
    ``plan`` that plan; the message names the buffers live at its peak, with their lines."""

    def __init__(self, message: str, *, floor: int, plan: str):
        super().__init__(message)
        self.floor, self.plan = floor, plan


class MiscompileError(LoopfuseError, AssertionError):
    """A verified executable (``compile_step(..., verify=True)``) computed other values than
    ``jax.jit`` of the same function.

    ``path`` names the first differing leaf, ``max_abs``/``max_rel`` its largest absolute and
    relative difference, ``passes`` the pipeline and ``xla_options`` the XLA options in effect,
    ``culprits`` what makes the result equal to jax.jit when removed alone (see `verify`).
    """

    def __init__(self, message: str, *, path: str, max_abs: float, max_rel: float, passes: str,
                 xla_options: dict, culprits: list):
        super().__init__(message)
        self.path, self.max_abs, self.max_rel = path, max_abs, max_rel
        self.passes, self.xla_options, self.culprits = passes, xla_options, culprits


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn` at the user's line: the first frame of the call stack outside loopfuse (its package and
    its passes), however deep in a compile the warning is raised, so a warning names the call that caused it
    and shows once per call site (the `warnings` default)."""
    level = 2           # 1: this function's frame, 2: its caller's
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(_homes()):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


@functools.cache
def _homes() -> tuple[str, ...]:
    """The folders of loopfuse's modules: the package's and its passes'."""
    import loopfuse.passes
    return tuple(os.path.join(os.path.realpath(p), "") for p in (os.path.dirname(__file__), *loopfuse.passes.__path__))
