"""The chunk driver of `fit` and `minimize`: N steps as calls of K-step device loops (`LoopChunks`).

Between chunks it advances the progress bar, collects the aux history, calls the callback and
saves checkpoints. A chunk that can stop early (``until=``, ``stop_on_nonfinite=``) ends the run
after the step that asked it to. The state is never lost: SIGINT is held while a chunk runs and
delivered once its result is bound (Ctrl-C stops after the chunk in flight, or the chunks queued
by a chained run, see `drive`); an exception after a chunk completed is raised as `FitError`
carrying the state reached.
"""
import math
import signal
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from . import validate
from .checkpoint import Checkpoints
from .errors import FitError
from .results import FitResult
from .step import Step
from .trace import dotted

CHAIN_SECONDS = 0.05    # the device time of the chunks a chained run keeps queued, at most (past two)
_STEP_SECONDS: "weakref.WeakKeyDictionary[Step, float]" = weakref.WeakKeyDictionary()  # of a step's last chained run
STOPS = ("until", "non_finite")     # the retcodes of a run a step ended (recorded in its checkpoint)


class Stop(NamedTuple):
    """What a chunk that can stop early reports: the steps it ran (a scalar, <= k) and whether a step
    asked to stop (a scalar bool: its `until` was true or, watched, its floating aux non-finite)."""

    steps: Any
    stopped: Any


class Chunks(Protocol):
    """What the driver runs: chunks of `k` steps from global step index `start`."""

    stop_on_nonfinite: bool     # a step whose floating aux leaves hold a NaN or Inf ends the run
    chains: bool                # `run` takes `after`: a chunk may be dispatched before the last one's stop is read

    def prepare(self, state, k: int, start: int = 0) -> jax.tree_util.PyTreeDef:
        """Build the call for `k` steps from global step `start` (donates nothing; a `Dataset` serves the
        epochs of the call about to run); return the aux tree structure."""

    def run(self, state, start: int, k: int, after=None) -> tuple[Any, Any, Stop | None]:
        """``(new_state, aux, stop)`` after steps ``start .. start + k``; aux leaves have a leading [k]
        axis. `stop` is None when the chunk cannot stop early (all k steps ran). `after`: the previous
        chunk's `Stop.stopped` still on the device, or None (only given where `chains`); when it is
        true the chunk runs no step."""


def aux_structure(step: Step, state, batch, start: int = 0):
    """The tree structure of the aux that `step` returns (the leaves `keep_aux` drops are None)."""
    t = step.compiled(state, batch, start=start).traced
    kept = [0 if keep else None for keep in t.aux_kept]
    return jax.tree_util.tree_structure(jax.tree_util.tree_unflatten(t.aux_def, kept))


def check_checkpoint_options(checkpoint_dir, checkpoint_every, keep) -> None:
    """Raise naming the bad `checkpoint_dir=`/`checkpoint_every=`/`keep=` option of fit or minimize."""
    for name, value in (("checkpoint_every", checkpoint_every), ("keep", keep)):
        if value is not None:
            validate.steps(value, name)
    if checkpoint_dir is None and checkpoint_every is not None:
        raise ValueError("checkpoint_every= needs checkpoint_dir= (the folder to save into)")


class LoopChunks:
    """The chunks of `drive` as ``step.loop(k, until=..., stop_on_nonfinite=...)`` calls (wrap-loop
    evaluates the stop on the device); a `Dataset` batch sees the global step index.

    until: ``until(new_state, aux) -> scalar bool``: the run ends after the step where it is true.
    stop_on_nonfinite: a step whose kept floating aux leaves hold a NaN or Inf ends the run.
    """

    chains = True

    def __init__(self, step: Step, batch, until: Callable | None = None, stop_on_nonfinite: bool = False):
        self.step, self.batch, self.until, self.stop_on_nonfinite = step, batch, until, stop_on_nonfinite
        self._prepared: dict = {}     # k -> aux structure (a run's state keeps its signature)
        self._loops: dict = {}        # k -> its Step

    def loop(self, k: int) -> Step:
        if k not in self._loops:
            self._loops[k] = self.step.loop(k, until=self.until, stop_on_nonfinite=self.stop_on_nonfinite)
        return self._loops[k]

    def prepare(self, state, k: int, start: int = 0):
        if k not in self._prepared:
            self._prepared[k] = aux_structure(self.loop(k), state, self.batch, start)
        return self._prepared[k]

    def run(self, state, start: int, k: int, after=None):
        loop = self.loop(k)
        state, aux, *stop = (loop(state, self.batch, start=start) if after is None
                             else loop.after(after, state, self.batch, start=start))
        return state, aux, Stop(*stop) if stop else None


def drive(chunks: Chunks, state, num_steps: int, *, chunk: int, progress: bool = False,
          callback: Callable[[int, Any], None] | None = None, checkpoints: Checkpoints | None = None,
          every: int | None = None, pipelined: bool = False) -> FitResult:
    """Run `num_steps` steps in chunks of at most `chunk` (cut at multiples of `every` when checkpointing),
    or fewer when a chunk stops early (see `FitResult.retcode`).

    With `checkpoints`, the latest checkpoint is restored first and one is saved every `every` steps
    and at the end (also an early one, recording why the run ended); chunk boundaries depend only on
    the global step, so a resumed run makes the same calls as an uninterrupted one.

    Each chunk is waited for and its aux history moved to the host, so Ctrl-C stops after the chunk
    in flight; `pipelined` dispatches chunks without waiting (throughput for one-step chunks), the
    history staying on the device until the end, where a Ctrl-C may then land outside the driver.
    Pipelined chunks that can stop early are chained (`Chunks.chains`, without checkpoints or a
    callback): the next one is dispatched before the previous one's stop is read and runs no step
    if it stopped. As many are in flight as take about `CHAIN_SECONDS` (at least two), by the wall
    time per step of the last chained run of the same step, or else of the first chunk (two are in
    flight until it is read back), so a Ctrl-C stops after those. At the end the last one's flag (a
    stop keeps it true) tells whether any stopped, and only then is each one's stop read. Otherwise
    chunks that can stop early are waited for: the next one runs only if they did not stop.
    """
    done = planned = resumed_from = 0     # done: steps whose chunk was read back; planned: dispatched
    history, retcode, bar = [], "max_steps", None    # history: the flat aux leaves of each chunk
    in_flight: list = []                  # (k, aux, stop, dispatch time) of chunks not yet read back
    chained = pipelined and checkpoints is None and callback is None and chunks.chains
    depth, timed, ran_all = 1 + chained, not chained, False    # timed: depth set from a duration
    step = getattr(chunks, "step", None) if chained else None
    if step is not None and step in _STEP_SECONDS:
        depth, timed = max(2, math.ceil(CHAIN_SECONDS / (_STEP_SECONDS[step] * chunk))), True
    sigint = _SigintHold()

    def read_back() -> Any:
        """Take the oldest chunk in flight into done, retcode and the history (and a checkpoint);
        its aux history, on the host unless pipelined and unable to stop."""
        nonlocal done, retcode, depth, timed
        k, aux, stop, dispatched = in_flight.pop(0)
        if ran_all:                       # the last chunk in flight did not stop, so no chunk did
            stop = None
        if not pipelined or stop is not None:
            jax.block_until_ready(state if not in_flight else aux)
            if not timed:
                depth, timed = max(2, math.ceil(CHAIN_SECONDS / (time.perf_counter() - dispatched))), True
            aux = jax.tree_util.tree_map(np.asarray, aux)
        ran = k if stop is None else int(stop.steps)
        if stop is not None:
            aux = jax.tree_util.tree_map(lambda h: h[:ran], aux)
            if retcode not in STOPS:
                retcode = _why_stopped(aux, stop.stopped, ran, chunks.stop_on_nonfinite) or retcode
            elif ran:                     # chained after a stop, it must have run no step
                raise RuntimeError(f"a chunk chained after a stop ran {ran} steps: its loop ignored the "
                                   "stopped flag it was given (wrap-loop's loopfuse.stopped argument)")
        done += ran
        history.append(jax.tree_util.tree_leaves(aux))
        ended = done == num_steps or retcode in STOPS
        if checkpoints is not None and (every is not None and done % every == 0 or ended):
            checkpoints.save(done, state, _stack(aux_def, history), retcode if retcode in STOPS else None,
                             wait=ended)
        return aux, ran

    try:
        sigint.install()
        if checkpoints is not None:
            checkpoints.check(state, num_steps)
        first = _next_chunk(0, num_steps, chunk, every)
        aux_def, prepared = chunks.prepare(state, first), {first}   # prepared: chunk sizes whose call is built
        if checkpoints is not None:
            restored = checkpoints.restore(state, _paths(aux_def))
            if restored is not None:
                resumed_from, state, leaves, stopped = restored
                done = planned = resumed_from
                history.append(leaves)
                retcode = stopped or retcode
        bar = progress_bar(num_steps, done) if progress else None
        started = time.perf_counter()
        while in_flight or planned < num_steps and retcode not in STOPS:
            dispatch = planned < num_steps and retcode not in STOPS and len(in_flight) < depth
            if dispatch:
                k = _next_chunk(planned, num_steps, chunk, every)
                if k not in prepared:          # compiling stays interruptible: nothing is donated yet
                    chunks.prepare(state, k, planned)
                    prepared.add(k)
            with sigint.hold():
                if dispatch:
                    previous = in_flight[-1][2] if in_flight else None
                    t = time.perf_counter()
                    state, aux, stop = chunks.run(state, planned, k, previous and previous.stopped)
                    in_flight.append((k, aux, stop, t))
                    planned += k
                    if len(in_flight) < depth and planned < num_steps:
                        continue               # read the oldest chunk back once the next one is queued
                if chained and planned == num_steps and not ran_all and in_flight[-1][2] is not None:
                    ran_all = not bool(in_flight[-1][2].stopped)
                aux, ran = read_back()
            if bar is not None or callback is not None:
                aux = jax.tree_util.tree_map(np.asarray, aux)
            if bar is not None:
                bar.update(ran)
                _postfix(bar, aux)
            if callback is not None:
                callback(done, aux)
    except KeyboardInterrupt:
        retcode = "interrupted"
        while in_flight:                   # the state is the last chunk's: count the steps it holds
            read_back()
    except Exception as e:
        if done == resumed_from and not in_flight:   # nothing ran: the caller's state is untouched
            raise
        while in_flight:
            read_back()
        result = FitResult(state, _stack(aux_def, history), done, "error", resumed_from)
        raise FitError(f"stopped by {type(e).__name__} after {done} of {num_steps} steps: {e}; FitError.result "
                       f"holds the state, steps and aux history after step {done}", result) from e
    finally:
        sigint.restore()
        if bar is not None:
            bar.close()
        if checkpoints is not None:
            checkpoints.close()
    if step is not None and done > resumed_from:
        _STEP_SECONDS[step] = (time.perf_counter() - started) / (done - resumed_from)
    return FitResult(state, _stack(aux_def, history) if history else None, done, retcode, resumed_from)


def _why_stopped(aux, stopped, n: int, nonfinite: bool) -> str | None:
    """The retcode of a run after a chunk that ran `n` steps (`aux`: their host history) and asked to
    stop or not (`stopped`), or None to go on: "non_finite" if watched and a floating aux leaf of step
    n holds a NaN or Inf, else "until" if a step asked to stop."""
    if nonfinite and any(jnp.issubdtype(h.dtype, jnp.inexact) and not np.isfinite(h[n - 1]).all()
                         for h in jax.tree_util.tree_leaves(aux)):
        return "non_finite"
    return "until" if bool(stopped) else None


def chunk_sizes(start: int, num_steps: int, chunk: int, every: int | None = None) -> set[int]:
    """The chunk sizes `drive` runs from step `start` (to build their loops ahead)."""
    sizes = set()
    while start < num_steps:
        k = _next_chunk(start, num_steps, chunk, every)
        sizes.add(k)
        start += k
    return sizes


def _next_chunk(done: int, num_steps: int, chunk: int, every: int | None) -> int:
    """The next chunk's size. Chunks of `chunk` steps tile each interval of `every` steps from its start
    (or the whole run), cut at its end and at `num_steps`: boundaries depend on the global step only."""
    start = 0 if every is None else done - done % every
    end = num_steps if every is None else min(num_steps, start + every)
    return min(chunk - (done - start) % chunk, end - done)


def _paths(aux_def) -> list[str]:
    tree = jax.tree_util.tree_unflatten(aux_def, [0] * aux_def.num_leaves)
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _stack(aux_def, history: list) -> Any:
    """One aux tree whose leaves are the chunks' histories concatenated along the step axis (those
    still on the device copied to the host together)."""
    history = jax.device_get(history)
    return jax.tree_util.tree_unflatten(aux_def, [np.concatenate(parts) for parts in zip(*history)])


class _SigintHold:
    """SIGINT held inside `hold()` blocks and delivered at their end; outside them, as before.

    Installed for the whole run (in the main thread, which alone receives signals, and only over a
    Python-level handler): a signal outside a block goes straight to the handler that was installed.
    """

    def __init__(self):
        self.holding, self.pending, self.previous = False, False, None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None:
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handle(self, signum, frame):
        if self.holding:
            self.pending = True
        else:
            self._deliver(frame)

    def _deliver(self, frame):
        self.pending = False
        if callable(self.previous):
            self.previous(signal.SIGINT, frame)
        elif self.previous == signal.SIG_DFL:  # the default action: the process ends
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)

    @contextmanager
    def hold(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                self._deliver(None)


def progress_bar(total: int, initial: int = 0):
    """A tqdm bar over `total` steps, starting at `initial`."""
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="step")


def _postfix(bar, aux) -> None:
    """Show the last value of up to three scalar-per-step aux leaves (e.g. ``loss=0.0123``), named by
    their paths as `keep_aux` names them."""
    leaves = jax.tree_util.tree_leaves_with_path(aux)
    scalars = {dotted(p) or "aux": float(v[-1]) for p, v in leaves if v.ndim == 1}
    if scalars:
        bar.set_postfix({k: f"{v:.4g}" for k, v in list(scalars.items())[:3]})
