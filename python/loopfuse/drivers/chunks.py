"""The chunk driver of `fit` and `minimize`: N steps as calls of K-step device loops (`LoopChunks`).

Between chunks it advances the progress bar, collects the aux history, calls the callback and
saves checkpoints. A chunk that can stop early (``until=``, ``stop_on_nonfinite=``) ends the run
after the step that asked it to. The state is never lost: SIGINT is held while a chunk is
dispatched or read back and delivered once its result is bound (Ctrl-C stops after the chunks in
flight: the one running and those queued behind it, about `CHAIN_SECONDS` of steps, see `_Run`);
an exception after a chunk completed is raised as `FitError` carrying the state reached.
"""
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from .. import validate
from ..errors import MemoryLimitError
from ..passes import control_flow, wrap_loop
from ..passes.roll_layers import rolled_layers, update_after_loops
from ..run.sigint import SigintHold
from ..state import packed
from ..state.checkpoint import CarriedAs, Checkpoints, check_directory
from ..state.leaves import dotted, keyed_paths, raw
from .results import FitError, FitResult
from .step import Step

CHAIN_SECONDS = 0.05    # the device time of the chunks a run keeps queued behind the one running, at most
STOPS = ("until", "non_finite")     # the retcodes of a run a step ended (recorded in its checkpoint)
CHUNK = 100             # the steps per device call of a run the host follows (progress bar, callback, checkpoints)
CALL_BYTES = {"cpu": 4 << 30}   # of a run it does not follow: about this much work per call, as bytes of values
OP_BYTES = {"cpu": 512}         # written, an op's fixed cost (its kernel's start) counted as this many


@dataclass
class Pace:
    """The wall time per step of a Step's last queued run (kept with the Step: ``step.derived(("pace",), Pace)``)."""

    seconds: float | None = None


class Stop(NamedTuple):
    """What a chunk that can stop early reports: the steps it ran (a scalar, <= k) and whether a step
    asked to stop (a scalar bool: its `until` was true or, watched, its floating aux non-finite)."""

    steps: Any
    stopped: Any


class Chunks(Protocol):
    """What the driver runs: chunks of `k` steps from global step index `start`."""

    stop_on_nonfinite: bool     # a step whose floating aux leaves hold a NaN or Inf ends the run
    chains: bool                # `run` takes `after`: a chunk may be dispatched before the last one's stop is read

    def program(self, k: int) -> Step | None:
        """The Step a chunk of `k` steps calls (None: steps not compiled, GradOnly's)."""

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


def check_checkpoint_options(checkpoint_dir, checkpoint_every, keep) -> tuple[int | None, int | None]:
    """``(checkpoint_every, keep)`` as ints; raise naming the bad `checkpoint_dir=`/`checkpoint_every=`/`keep=`
    option of fit or minimize."""
    checkpoint_every, keep = (None if value is None else validate.steps(value, name)
                              for name, value in (("checkpoint_every", checkpoint_every), ("keep", keep)))
    if checkpoint_dir is None and checkpoint_every is not None:
        raise ValueError("checkpoint_every= needs checkpoint_dir= (the folder to save into)")
    if checkpoint_dir is not None:
        check_directory(checkpoint_dir)
    return checkpoint_every, keep


class LoopChunks:
    """The chunks of `drive` as ``step.loop(k, until=..., stop_on_nonfinite=...)`` calls (wrap-loop
    evaluates the stop on the device); a `Dataset` batch sees the global step index.

    until: ``until(new_state, aux) -> scalar bool``: the run ends after the step where it is true.
    stop_on_nonfinite: a step whose kept floating aux leaves hold a NaN or Inf ends the run.
    """

    chains = True

    def __init__(self, step: Step, batch, until: Callable | None = None, stop_on_nonfinite: bool = False):
        self.step, self.batch, self.until, self.stop_on_nonfinite = step, batch, until, stop_on_nonfinite

    def loop(self, k: int) -> Step:
        return self.step.loop(k, until=self.until, stop_on_nonfinite=self.stop_on_nonfinite)

    program = loop

    def prepare(self, state, k: int, start: int = 0):
        return aux_structure(self.loop(k), state, self.batch, start)

    def run(self, state, start: int, k: int, after=None):
        loop = self.loop(k)
        state, aux, *stop = (loop(state, self.batch, start=start) if after is None
                             else loop.after(after, state, self.batch, start=start))
        return state, aux, Stop(*stop) if stop else None


def carried(step: Step | None, state, batch, checkpoints: Checkpoints | None = None):
    """``(state, checkpoints, back)``: how a driver carries `state` through the calls of `step` (its
    first chunk's, `Chunks.program`; None: nothing compiled). Where it rolls layers (``memory_budget``, or a
    ``memory_limit``, whose plan may) and its program on the state with its layers stacked
    (``pack(state, layers=True)``; under a limit, the plan chosen for it, where one fits) rolls a run of layers
    (roll-layers' report; that compile is the first chunk's own; an update run alone, after a micro-batch
    loop, does not count: a pytree's update writes its leaves in place), the stacked state:
    the loops then update the layers in place, with no stack built or taken apart per call (the packed
    figure of README "Rolling repeated layers"), unless the update runs after the loops and the program on
    `state` as it is needs fewer temporaries (both compiled: XLA's figures decide, the same every time;
    `optax.apply_if_finite` keeps each layer's new moments until its check). Else `state` as it is.
    `checkpoints` keep the caller's layout (`checkpoint.CarriedAs`); ``back(result)`` gives a `FitResult`
    the caller's layout back."""
    if step is None or isinstance(state, packed.PackedState) or \
            step.options.memory_budget is None and step.options.memory_limit is None:
        return state, checkpoints, same_layout
    stacked = packed.pack(state, layers=True)
    try:
        compiled = step.compiled(stacked, batch)
    except MemoryLimitError:     # the stacked buffers' copies put every plan there over the limit:
        return state, checkpoints, same_layout      # the pytree's may fit
    report = compiled.reports.get("roll-layers", "")
    if not rolled_layers(report) or (update_after_loops(report)
                                      and step.compiled(state, batch).memory.temp < compiled.memory.temp):
        return state, checkpoints, same_layout
    views = CarriedAs(checkpoints, packed.PackedState.unpack, stacked.layout.pack) if checkpoints else None
    return stacked, views, lambda result: replace(result, state=result.state.unpack())


@contextlib.contextmanager
def closed_on_failure(checkpoints: Checkpoints | CarriedAs | None):
    """`checkpoints` closed (their folder released) where what runs inside fails: a driver's work before `drive`,
    which closes them itself once it runs."""
    try:
        yield
    except BaseException:
        if checkpoints is not None:
            checkpoints.close()
        raise


def same_layout(result: FitResult) -> FitResult:
    """`carried`'s ``back`` of a state carried in the caller's layout: the result as it is."""
    return result


def drive(chunks: Chunks, state, num_steps: int, *, chunk: int, progress: bool = False,
          callback: Callable[[int, Any], None] | None = None, checkpoints: Checkpoints | CarriedAs | None = None,
          every: int | None = None, pipelined: bool = False) -> FitResult:
    """Run `num_steps` steps in chunks of at most `chunk` (cut at multiples of `every` when checkpointing),
    or fewer when a chunk stops early (see `FitResult.retcode`).

    With `checkpoints`, the latest checkpoint is restored first and one is saved every `every` steps
    and at the end (also an early one, recording why the run ended); chunk boundaries depend only on
    the global step, so a resumed run makes the same calls as an uninterrupted one.

    Chunks are queued on the device (`_Run`), each read back in turn: its aux history moved to the
    host, then the bar and the callback see it. A Ctrl-C stops after the chunks in flight. With a
    `callback`, each chunk is read back and seen by it before the next is dispatched (a callback
    that raises stops the run there). `pipelined` (throughput for one-step chunks) leaves the
    history of a chunk that cannot stop on the device until the end, without waiting for it, where a
    Ctrl-C may then land outside the driver.
    """
    run = _Run(chunks, state, num_steps, chunk, every, checkpoints, pipelined, queued=callback is None)
    sigint, bar = SigintHold(), None
    try:
        sigint.install()
        run.start()
        bar = progress_bar(num_steps, run.done) if progress else None
        while run.in_flight or not run.planned_all:
            k = run.next_chunk()
            if k is not None:
                run.prepare(k)               # compiling stays interruptible: nothing is donated yet
            with sigint:
                if k is not None:
                    run.dispatch(k)
                    if run.next_chunk() is not None:
                        continue             # read the oldest chunk back once the queue is full
                read = run.read_back()
            if read is not None and (bar is not None or callback is not None):
                aux, ran = host(read[0]), read[1]
                if bar is not None:
                    bar.update(ran)
                    _postfix(bar, aux)
                if callback is not None:
                    callback(run.done, aux)
    except KeyboardInterrupt:
        run.retcode = "interrupted"
        with sigint.ignored():               # stopping already: another Ctrl-C waits for the state and its save
            run.drain()                      # the state is the last chunk's: count the steps it holds
            run.save_reached()
    except Exception as e:
        if run.planned == run.resumed_from:  # nothing was dispatched: the caller's state is untouched
            raise
        run.drain()
        raise FitError(f"stopped by {type(e).__name__} after {run.done} of {num_steps} steps: {e}; FitError.result "
                       f"holds the state, steps and aux history after step {run.done}", run.result("error")) from e
    finally:
        with sigint.ignored() if run.retcode == "interrupted" else contextlib.nullcontext():
            if bar is not None:
                bar.close()
            if checkpoints is not None:
                checkpoints.close()     # waits for a save in flight
        sigint.restore()
    return run.result()


class _InFlight(NamedTuple):
    """A chunk dispatched and not yet read back."""

    k: int
    aux: Any
    stop: Stop | None
    dispatched: float         # time.perf_counter() at its dispatch
    saves: bool               # a checkpoint of its state is due: nothing is dispatched before it is read back


class _Run:
    """One `drive` run: the state of the last chunk dispatched, the chunks in flight (dispatched, not yet
    read back; oldest first) and what the chunks read back add up to (steps done, retcode, history).

    `queued`: while one chunk runs, the next ones are queued, as many as take about `CHAIN_SECONDS`
    (pipelined: at least one), by the wall time per step of the step's last queued run, or else of the
    first chunk (read back alone: with `pipelined`, two are in flight until then). A chunk that can
    stop early is then chained (`Chunks.chains`): dispatched with the previous one's stop flag, it runs
    no step if that one stopped. Otherwise one chunk is in flight, a chunk that can stop read back
    before the next runs. A chunk whose checkpoint is due is read back before the next is dispatched
    (the next would consume its state).
    """

    def __init__(self, chunks: Chunks, state, num_steps: int, chunk: int, every: int | None,
                 checkpoints: Checkpoints | CarriedAs | None, pipelined: bool, queued: bool):
        self.chunks, self.state, self.num_steps, self.chunk, self.every = chunks, state, num_steps, chunk, every
        self.checkpoints, self.pipelined, self.queued = checkpoints, pipelined, queued and chunks.chains
        self.done = self.planned = self.resumed_from = 0    # done: steps read back; planned: dispatched
        self.retcode = "max_steps"
        self.history: list[list] = []                       # the flat aux leaves of each chunk read back
        self.in_flight: deque[_InFlight] = deque()
        self.prepared: set[int] = set()                     # chunk sizes whose call is built
        self.aux_def: Any = None
        self.ran_all = False          # the last chunk's flag read false: no chunk in flight stopped
        self.started = 0.0            # time.perf_counter() once the run started (after a restore)
        step = getattr(chunks, "step", None) if self.queued else None
        self.pace = step.derived(("pace",), Pace) if step is not None else None
        self.depth, self.timed = (1 + pipelined, False) if self.queued else (1, True)
        if self.pace is not None and self.pace.seconds is not None:
            self._set_depth(self.pace.seconds * chunk)

    @property
    def planned_all(self) -> bool:
        """No chunk is left to dispatch: all steps are, or a step ended the run."""
        return self.planned == self.num_steps or self.retcode in STOPS

    def start(self) -> None:
        """Build the first chunk's call; with checkpoints, restore the latest one (steps, state, history)."""
        if self.checkpoints is not None:
            self.checkpoints.check(self.state, self.num_steps)
        self.prepare(_next_chunk(0, self.num_steps, self.chunk, self.every))
        if self.checkpoints is not None:
            restored = self.checkpoints.restore(self.state, _paths(self.aux_def))
            if restored is not None:
                self.resumed_from, self.state, leaves, stopped = restored
                self.done = self.planned = self.resumed_from
                self.history.append(leaves)
                self.retcode = stopped or self.retcode
        self.started = time.perf_counter()

    def next_chunk(self) -> int | None:
        """The size of the chunk to dispatch now, or None: read the oldest one back first."""
        if self.planned_all or len(self.in_flight) >= self.depth or self.in_flight and self.in_flight[-1].saves:
            return None
        return _next_chunk(self.planned, self.num_steps, self.chunk, self.every)

    def prepare(self, k: int) -> None:
        """Build the call of a chunk of `k` steps (once per size; the first one's gives the aux structure)."""
        if k not in self.prepared:
            aux_def = self.chunks.prepare(self.state, k, self.planned)
            if self.aux_def is None:
                self.aux_def = aux_def
            self.prepared.add(k)

    def dispatch(self, k: int) -> None:
        """Run the next chunk of `k` steps (chained after the last one in flight)."""
        previous = self.in_flight[-1].stop if self.in_flight else None
        t = time.perf_counter()
        self.state, aux, stop = self.chunks.run(self.state, self.planned, k, previous and previous.stopped)
        self.planned += k
        self.in_flight.append(_InFlight(k, aux, stop, t, self._checkpoint_due(self.planned)))

    def read_back(self) -> tuple[Any, int] | None:
        """Take the oldest chunk in flight into the steps done, the retcode and the history (and save the
        checkpoint due after it): ``(its aux history, steps it ran)``, or None for a chunk chained after
        the stop (it ran no step). The history is on the host unless pipelined and unable to stop."""
        if self.pipelined and self.planned == self.num_steps and not self.ran_all and self.in_flight[-1].stop is not None:
            self.ran_all = not bool(self.in_flight[-1].stop.stopped)    # a stop keeps the flag true
        k, aux, stop, dispatched, _ = self.in_flight.popleft()
        if self.ran_all:
            stop = None
        if not self.pipelined or stop is not None:
            outputs = jax.tree_util.tree_leaves((aux, stop))
            jax.block_until_ready(outputs if outputs and self.in_flight else self.state)
            if not self.timed:
                self._set_depth(time.perf_counter() - dispatched)
            aux = host(aux)
        ran = k if stop is None else int(stop.steps)
        if self.retcode in STOPS:
            if ran:
                raise RuntimeError(f"a chunk chained after a stop ran {ran} steps: its loop ignored the "
                                   "stopped flag it was given (wrap-loop's loopfuse.stopped argument)")
            return None
        if stop is not None:
            aux = jax.tree_util.tree_map(lambda h: h[:ran], aux)
            self.retcode = _why_stopped(aux, stop.stopped, ran, self.chunks.stop_on_nonfinite) or self.retcode
        self.done += ran
        self.history.append(jax.tree_util.tree_leaves(aux))
        ended = self.done == self.num_steps or self.retcode in STOPS
        if self.checkpoints is not None and (ended or self._checkpoint_due(self.done)):
            self.checkpoints.save(self.done, self.state, _stack(self.aux_def, self.history),
                                  self.retcode if self.retcode in STOPS else None, wait=ended)
        return aux, ran

    def save_reached(self) -> None:
        """Save the checkpoint of the steps read back, where it is not saved yet (a run Ctrl-C stopped)."""
        if self.checkpoints is not None and self.done > self.resumed_from:
            self.checkpoints.save(self.done, self.state, _stack(self.aux_def, self.history),
                                  self.retcode if self.retcode in STOPS else None, wait=True)

    def drain(self) -> None:
        """Read back every chunk still in flight."""
        while self.in_flight:
            self.read_back()

    def result(self, retcode: str | None = None) -> FitResult:
        """The run's result (with `retcode`: that one, for a FitError's); records the step's time per step."""
        ran = self.done - self.resumed_from
        if self.pace is not None and ran and retcode is None:
            self.pace.seconds = (time.perf_counter() - self.started) / ran
        history = _stack(self.aux_def, self.history) if self.history else None
        return FitResult(self.state, history, self.done, retcode or self.retcode, self.resumed_from)

    def _checkpoint_due(self, steps: int) -> bool:
        """Whether a checkpoint is due after `steps` steps: every `every` steps and at the end."""
        return self.checkpoints is not None and (steps == self.num_steps or self.every is not None and steps % self.every == 0)

    def _set_depth(self, chunk_seconds: float) -> None:
        self.depth = 1 + max(self.pipelined, math.floor(CHAIN_SECONDS / max(chunk_seconds, 1e-9)))
        self.timed = True


def _why_stopped(aux, stopped, n: int, nonfinite: bool) -> str | None:
    """The retcode of a run after a chunk that ran `n` steps (`aux`: their host history) and asked to
    stop or not (`stopped`), or None to go on: "non_finite" if watched and a floating aux leaf of step
    n holds a NaN or Inf, else "until" if a step asked to stop."""
    if nonfinite and any(jnp.issubdtype(h.dtype, jnp.inexact) and not np.isfinite(h[n - 1]).all()
                         for h in jax.tree_util.tree_leaves(aux)):
        return "non_finite"
    return "until" if bool(stopped) else None


def steps_per_call(module: ir.Module, platform: str) -> int:
    """The most steps one device call runs of a run nothing on the host follows (no progress bar, callback
    or checkpoint), from its step's traced `module` and the `platform` it runs on (a choice from the
    program: never from timings).

    Each call costs the host about 50 us (dispatch, results, the driver) and the device its own start:
    20 calls of 100 steps took 0.9 ms more than one call of 2,000 steps of a 3-us step (issue 40). Where the
    host follows the run, it sees each chunk of `CHUNK` steps; otherwise chunks serve only Ctrl-C, which
    stops after the call in flight: a call does `CALL_BYTES` of work, each step's ops and values counted
    (`wrap_loop.step_work`, `OP_BYTES` per op, every value though XLA fuses most), about 0.1 to 0.3 s on the
    2-core CPU of BENCHMARKS.md for bench_minimize_call's MLPs (80,000 steps of the 32 x 8 one, 7,000 of the
    256 x 64), and never fewer than `CHUNK` steps. A step with loops or conditionals of its own (a line
    search, an ODE solve) has no such bound: `CHUNK`; so has a platform not measured (a GPU's kernels start
    in microseconds, not tens of nanoseconds: its own figures would be needed).
    """
    if platform not in CALL_BYTES or control_flow.own_control_flow(module.operation):
        return CHUNK
    ops, values = wrap_loop.step_work(module.operation)
    return max(CHUNK, CALL_BYTES[platform] // max(1, values + OP_BYTES[platform] * ops))


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
    return keyed_paths(jax.tree_util.tree_unflatten(aux_def, [0] * aux_def.num_leaves))


def _stack(aux_def, history: list) -> Any:
    """One aux tree whose leaves are the chunks' histories concatenated along the step axis (those
    still on the device copied to the host together, see `host`)."""
    return jax.tree_util.tree_unflatten(aux_def, [np.concatenate(parts) for parts in zip(*host(history))])


def host(tree) -> Any:
    """`tree` with its arrays on the host (numpy; a typed PRNG key as its key data, `leaves.raw`, which numpy
    cannot hold as a key): `jax.device_get`, which starts every copy before it waits for one, but where every
    array is on a CPU, whose memory is the host's, each is read in place (device_get copies them: 0.3 ms for a
    minimize's 20 chunks of history, as long as 5 of their device calls)."""
    tree = jax.tree_util.tree_map(raw, tree)
    devices: set[Any] = {d for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)
                         for d in x.sharding.device_set}
    return jax.tree_util.tree_map(np.asarray, tree) if all(d.platform == "cpu" for d in devices) else jax.device_get(tree)


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
