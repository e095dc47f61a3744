"""fit: run N steps as device loops of K steps, with a progress bar, callbacks and checkpoints."""
import os
from typing import Any, Callable

import jax

from .checkpoint import Checkpoints
from . import validate
from .chunks import FitResult, drive
from .data import Dataset
from .step import Step


def aux_structure(step: Step, state, batch):
    """The tree structure of the aux that `step` returns (the leaves `keep_aux` drops are None)."""
    t = step.compiled(state, batch).traced
    kept = [0 if keep else None for keep in t.aux_kept]
    return jax.tree_util.tree_structure(jax.tree_util.tree_unflatten(t.aux_def, kept))


def check_checkpoint_options(checkpoint_dir, checkpoint_every, keep) -> None:
    """Raise naming the bad `checkpoint_dir=`/`checkpoint_every=`/`keep=` option of fit or minimize."""
    for name, value in (("checkpoint_every", checkpoint_every), ("keep", keep)):
        if value is not None:
            validate.steps(value, name)
    if checkpoint_dir is None and checkpoint_every is not None:
        raise ValueError("checkpoint_every= needs checkpoint_dir= (the folder to save into)")


class _StepChunks:
    """`Step.loop(k)` calls; a `Dataset` batch sees the global step index."""

    def __init__(self, step: Step, batch):
        self.step, self.batch = step, batch

    def prepare(self, state, k: int):
        return aux_structure(self.step.loop(k), state, self.batch)

    def run(self, state, start: int, k: int):
        return self.step.loop(k)(state, self.batch, start=start if isinstance(self.batch, Dataset) else 0)


def fit(step: Step, state, batch, num_steps: int, *, chunk: int = 100, progress: bool = True,
        callback: Callable[[int, Any], None] | None = None, checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int | None = None, keep: int | None = 3) -> FitResult:
    """Run `num_steps` updates of `step` as device loops of at most `chunk` steps.

    Between chunks a tqdm bar advances and ``callback(steps_done, history_chunk)`` sees that
    chunk's aux history (host numpy). On KeyboardInterrupt (Ctrl-C) the chunk in flight finishes
    and its state is returned with ``interrupted=True``; any other exception after a chunk
    completed is raised as `FitError` from it, with ``.result`` holding the state reached.

    checkpoint_dir:   save the state, the steps done and the aux history there (orbax) every
                      `checkpoint_every` steps (default: `chunk`) and at the end, keeping the newest
                      `keep` (None: all). If it holds checkpoints, the latest is restored (the passed
                      `state` is the template for structure, dtypes and shardings) and only the
                      remaining steps run, a `Dataset` continuing at the global step, so the result
                      is bitwise that of an uninterrupted run; ``result.resumed_from`` says from where.
    """
    if not isinstance(step, Step):
        raise TypeError(f"step must be a Step (loopfuse.compile_step(fn)), got {type(step).__name__}")
    validate.steps(num_steps, "num_steps")
    validate.steps(chunk, "chunk")
    check_checkpoint_options(checkpoint_dir, checkpoint_every, keep)
    if isinstance(batch, Dataset):
        batch.validate()
    checkpoints = Checkpoints(checkpoint_dir, keep) if checkpoint_dir is not None else None
    return drive(_StepChunks(step, batch), state, num_steps, chunk=chunk, progress=progress, callback=callback,
                 checkpoints=checkpoints, every=(checkpoint_every or chunk) if checkpoints else None)
