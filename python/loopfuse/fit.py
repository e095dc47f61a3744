"""fit: run N steps as device loops of K steps, with a progress bar and callbacks between chunks."""
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np

from .data import Dataset
from .step import Step


@dataclass
class FitResult:
    """The last complete state, the aux history of the steps that ran (leading axis: step)."""

    state: Any
    history: Any
    steps: int
    interrupted: bool = False


def fit(step: Step, state, batch, num_steps: int, *, chunk: int = 100, progress: bool = True,
        callback: Callable[[int, Any], None] | None = None) -> FitResult:
    """Run `num_steps` updates of `step` as device loops of at most `chunk` steps.

    Between chunks a tqdm bar advances and ``callback(steps_done, history_chunk)`` sees that
    chunk's aux history (host numpy). On KeyboardInterrupt the state after the last completed
    chunk is returned (the chunk in flight is discarded), never a half-donated one.
    """
    if num_steps < 1 or chunk < 1:
        raise ValueError(f"num_steps ({num_steps}) and chunk ({chunk}) must be positive")
    history, done, interrupted = [], 0, False
    bar = _bar(num_steps, progress)
    try:
        while done < num_steps:
            k = min(chunk, num_steps - done)
            start = done if isinstance(batch, Dataset) else 0
            new_state, aux = step.loop(k)(state, batch, start=start)
            jax.block_until_ready(new_state)
            state, done = new_state, done + k
            aux = jax.tree_util.tree_map(np.asarray, aux)
            history.append(aux)
            if bar is not None:
                bar.update(k)
                _postfix(bar, aux)
            if callback is not None:
                callback(done, aux)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    stacked = jax.tree_util.tree_map(lambda *h: np.concatenate(h), *history) if history else None
    return FitResult(state, stacked, done, interrupted)


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, unit="step")


def _postfix(bar, aux) -> None:
    leaves = jax.tree_util.tree_leaves_with_path(aux)
    scalars = {jax.tree_util.keystr(p) or "aux": float(v[-1]) for p, v in leaves if v is not None and v.ndim == 1}
    if scalars:
        bar.set_postfix({k: f"{v:.4g}" for k, v in list(scalars.items())[:3]})
