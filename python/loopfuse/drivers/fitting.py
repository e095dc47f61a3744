"""fit: run N steps as device loops of K steps, with a progress bar, callbacks, checkpoints and stops."""
import os
from dataclasses import replace
from typing import Any, Callable


from .. import validate
from ..compile import stopping
from ..state import static_leaves
from ..state.checkpoint import Checkpoints
from ..state.data import Dataset
from .chunks import LoopChunks, carried, check_checkpoint_options, closed_on_failure, drive
from .ensemble import wrapper
from .results import FitError, FitResult
from .step import Step


def fit(step: Step, state, batch, num_steps: int, *, chunk: int = 100, progress: bool = True,
        callback: Callable[[int, Any], None] | None = None, until: Callable | None = None,
        stop_on_nonfinite: bool = False, checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int | None = None, keep: int | None = 3, ensemble=False) -> FitResult:
    """Run `num_steps` updates of `step` as device loops of at most `chunk` steps.

    Chunks are queued on the device: while one runs, the next ones are dispatched (as many as take
    about ``chunks.CHAIN_SECONDS``, by the first chunk's time), and each is read back in turn: a tqdm
    bar advances and ``callback(steps_done, history_chunk)`` sees its aux history (host numpy). With
    a callback, each chunk is seen by it before the next is dispatched; a chunk whose checkpoint is
    due is saved before the next is. On KeyboardInterrupt (Ctrl-C) the chunks in flight finish and
    the last one's state is returned with ``retcode="interrupted"``; any other exception after a
    chunk completed is raised as `FitError` from it, with ``.result`` holding the state reached
    (``.result.retcode == "error"``).

    until:            ``until(new_state, aux) -> scalar bool``, evaluated inside the device loop after
                      every step: the run ends after the first step where it is true (``retcode="until"``).
    stop_on_nonfinite: end the run after the first step whose kept floating aux leaves hold a NaN or
                      Inf (``retcode="non_finite"``). A stopped run's history has exactly ``steps`` rows.
    checkpoint_dir:   save the state, the steps done and the aux history there (orbax) every
                      `checkpoint_every` steps (default: `chunk`) and at the end, keeping the newest
                      `keep` (None: all). If it holds checkpoints, the latest is restored (the passed
                      `state` is the template for structure, dtypes and shardings) and only the
                      remaining steps run, a `Dataset` continuing at the global step, so the result
                      is bitwise that of an uninterrupted run; ``result.resumed_from`` says from where.
                      A run that `until` or a non-finite value ended is finished: resuming it runs no step.
    A step that rolls layers (``compile_step(..., memory_budget=b)``) runs on the state with its layers'
    leaves stacked (`chunks.carried`: packed once, the pytree given back at the end; checkpoints keep the
    pytree), so its loops update the layers in place with no stack built per call.
    ensemble:         True (or a `loopfuse.Ensemble`) trains N copies in one call: `state` leaves lead with
                      the member axis N, `step` is one member's; the batch is shared, or per member when
                      wrapped as ``loopfuse.per_member(batch)``. `until` and `stop_on_nonfinite` end each
                      member on its own (a stopped member costs no more work, see `ensemble`), the run
                      once all have stopped; the `FitResult` is per member. `callback` sees each chunk's
                      history as run, leaves [k, N, ...].

    Examples:
        >>> import jax.numpy as jnp
        >>> import loopfuse
        >>> def fn(w, target):
        ...     return w - 0.5 * (w - target), {"loss": jnp.sum((w - target) ** 2)}
        >>> result = loopfuse.fit(loopfuse.compile_step(fn), jnp.ones(2), jnp.zeros(2), 4, chunk=2, progress=False)
        >>> result.steps, result.retcode, result.state.tolist(), result.history["loss"].tolist()
        (4, 'max_steps', [0.0625, 0.0625], [2.0, 0.5, 0.125, 0.03125])
    """
    if not isinstance(step, Step):
        raise TypeError(f"step must be a Step (loopfuse.compile_step(fn)), got {type(step).__name__}")
    num_steps = validate.steps(num_steps, "num_steps")
    chunk = validate.steps(chunk, "chunk")
    stopping.check(until, stop_on_nonfinite, chunk)
    checkpoint_every, keep = check_checkpoint_options(checkpoint_dir, checkpoint_every, keep)
    if isinstance(batch, Dataset):
        batch.validate()
    until = static_leaves.until_on_wrapped(until)      # (an ensemble calls it on the state as `wrapper` holds it)
    members, state, batch = wrapper(ensemble, state, "state", batch)     # the one question: an ensemble?
    step, state, until, stop_on_nonfinite = members.wrap(step, state, batch, until, stop_on_nonfinite,
                                                         step.options.keep_aux)
    chunks = LoopChunks(step, batch, until, stop_on_nonfinite)
    checkpoints = Checkpoints(checkpoint_dir, keep) if checkpoint_dir is not None else None
    with closed_on_failure(checkpoints):
        state, checkpoints, back = carried(chunks.program(min(chunk, num_steps)), state, batch, checkpoints)
    try:
        result = drive(chunks, state, num_steps, chunk=chunk, progress=progress, callback=callback,
                       checkpoints=checkpoints, every=(checkpoint_every or chunk) if checkpoints else None)
    except FitError as e:
        e.result = _unwrapped(members.result(back(e.result)))
        raise
    return _unwrapped(members.result(back(result)))


def _unwrapped(result: FitResult) -> FitResult:
    """`result` with its state as the caller holds it (`static_leaves.unwrap`)."""
    return replace(result, state=static_leaves.unwrap(result.state))
