"""What the chunked drivers return: `FitResult` (`fit`), `Solution` (`minimize`), and `FitError` (a run that
failed after some steps, carrying the `FitResult` it reached)."""
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LoopfuseError


@dataclass
class FitResult:
    """The last complete state, the aux history of the steps that ran (leading axis: step).

    steps:        steps the state has taken (resumed ones included); the history has as many rows.
    retcode:      why the run ended: "max_steps" (all num_steps ran), "until" (the `until` predicate
                  was true after the last step), "non_finite" (the last step's floating aux held a
                  NaN or Inf, with ``stop_on_nonfinite=True``), "interrupted" (KeyboardInterrupt,
                  Ctrl-C), or "error" (in ``FitError.result``: an exception after a chunk completed).
                  A run resumed from the checkpoint of a run that "until" or "non_finite" ended keeps
                  that retcode and runs no step.
    resumed_from: the checkpoint's step count the run resumed from (0 for a fresh start).

    Of an ensemble (``fit(..., ensemble=True)``), per member: `state` leaves and `history` leaves lead with
    the member axis N (history [N, steps, ...], unwritten (NaN, 0) past each member's stop), `steps` is an
    int array [N] and `retcode` a string array [N] (members still running when the run ended have its
    retcode: "max_steps", "interrupted" or "error").
    """

    state: Any
    history: Any
    steps: int | np.ndarray
    retcode: str | np.ndarray = "max_steps"
    resumed_from: int = 0

    @property
    def interrupted(self) -> bool:
        """Stopped early by KeyboardInterrupt (Ctrl-C)."""
        if isinstance(self.retcode, str):
            return self.retcode == "interrupted"
        return bool(np.any(np.asarray(self.retcode) == "interrupted"))


@dataclass(frozen=True, eq=False)
class Solution:
    """What `minimize` found.

    params:           the parameters after the last step.
    loss_history:     float array [steps]; entry i is the loss at step i, before that step's update.
    steps:            the steps run (resumed ones included): `steps` of `minimize`, or fewer if it stopped.
    retcode:          why it stopped: "converged" (`until` was true), "non_finite" (the loss of the last
                      step was NaN or Inf, with ``stop_on_nonfinite``) or "max_steps" (it ran all `steps`).
    steps_per_second: steps / wall time of the solve loop: from the first step's dispatch until the
                      final params are ready and the loss history is on the host, with every executable
                      already built (see compile_seconds).
    compile_seconds:  wall time before the loop spent building executables (for GradOnly: one
                      discarded warm-up step, which compiles the derivative and the eager ops).
    backend:          the backend that ran it.
    best:             of an ensemble, the index of the member with the lowest last loss (None otherwise, or
                      when no member's last loss is finite).

    Of an ensemble (``minimize(..., ensemble=True)``), per member: `params` leaves lead with the member axis
    N, `steps` is an int array [N], `retcode` a string array [N], `loss_history` [N, max(steps)] (NaN past
    each member's stop), and steps_per_second counts member steps.
    """

    params: Any
    loss_history: np.ndarray
    steps: int | np.ndarray
    retcode: str | np.ndarray
    steps_per_second: float
    compile_seconds: float
    backend: Any              # the `backends.Backend` that ran it
    best: int | None = None

    def params_for(self, ensemble: bool) -> Any:
        """Its params, for `minimize` to continue from as an `ensemble` or as one solve; a TypeError where that
        and the solve that made it disagree."""
        members = np.ndim(self.steps) > 0
        if members and not ensemble:
            raise TypeError(
                f"params is the Solution of a {np.size(self.steps)}-member ensemble, but ensemble=False solves one "
                "problem: pass ensemble=True to continue each member, or pass sol.params explicitly to solve one "
                "problem whose params lead with the member axis")
        if ensemble and not members:
            raise TypeError(
                "params is the Solution of a single solve, but an ensemble solves N problems whose params lead "
                "with the member axis: leave ensemble out to continue it, or pass sol.params explicitly to solve "
                "the entries of its leading axis as the members")
        return self.params


class FitError(LoopfuseError, RuntimeError):
    """`fit` or `minimize` failed after some steps ran; ``result`` holds the state they reached.

    The cause is chained (``raise FitError(...) from cause``); ``result`` is a `FitResult` with the
    state, step count and aux history of the chunks that completed before it.
    """

    def __init__(self, message: str, result: FitResult):
        super().__init__(message)
        self.result = result
