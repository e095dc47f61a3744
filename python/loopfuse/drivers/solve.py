"""minimize: an Optimization.jl-style solve, the same optax step run by any backend."""
import functools
import inspect
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import validate
from ..compile import stopping
from ..compile.options import init_refused
from ..errors import InitFoldError
from ..passes.control_flow import own_control_flow
from ..state import static_leaves
from ..state.checkpoint import Checkpoints
from ..state.data import Dataset
from ..state.leaves import dtype, is_differentiable
from .backends import Backend, CompiledLoop, CompiledStep, GradOnly
from .chunks import (CHUNK, LoopChunks, Stop, carried, check_checkpoint_options, chunk_sizes, closed_on_failure,
                     drive, host, same_layout, steps_per_call)
from .ensemble import wrapper
from .object_keys import object_key
from .results import FitResult, Solution
from .step import Step

RETCODES = {"until": "converged"}   # minimize's names of the chunk driver's retcodes (the others as they are)


def minimize(loss: Callable, params, data=None, optimizer: optax.GradientTransformation = optax.adam(1e-3),
             steps: int = 1000, backend: Backend = CompiledLoop(), progress: bool = False,
             until: Callable | None = None, stop_on_nonfinite: bool = True,
             checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int | None = None,
             keep: int | None = 3, ensemble=False) -> Solution:
    """Minimize `loss` from `params` with `steps` updates of `optimizer`, run by `backend`.

    loss: ``loss(params, batch)``, or ``loss(params)`` when `data` is None; a real scalar.
    params: the initial params pytree, or a `Solution` to continue from: its params, with a fresh
    optimizer state (Adam for 500 steps, then L-BFGS: ``minimize(loss, minimize(loss, p0, ...), ...)``).
    Leaves that are not arrays or numbers (an equinox model's activation function; inside an equinox Module, any that
    is not an array) are held as structure, not trained (`static_leaves`): the loss sees the params as given, the
    optimizer their arrays. Of the arrays, the floating (and complex) ones are trained; an integer, bool or
    typed-key leaf (a mask, a count, an nnx model's RNG state) is held as it is, as `eqx.filter_value_and_grad`
    leaves it out (`_parts`).
    data: None, a fixed batch pytree, or a `Dataset` (step i sees ``data.batch(i)``).
    Every backend runs the same step: value and gradient by ``backend.ad``, then
    ``optimizer.update`` and ``optax.apply_updates``. The caller's `params` are copied, never donated.
    An update whose signature takes ``value``, ``grad`` or ``value_fn`` (by name or ``**extra_args``,
    as optax's `GradientTransformationExtraArgs` do) gets the step's loss, its gradient and
    ``lambda p: loss(p, batch)`` for that step's batch: `optax.lbfgs` and its zoom line search run
    inside the compiled step or loop. An update requiring any other keyword is a TypeError.
    until: ``until(params, loss) -> scalar bool`` on each step's params and loss, before its update
    (the loss that `loss_history` records): the solve ends after the first step where it is true
    (``retcode="converged"``; that step's update is applied). CompiledLoop evaluates it inside the
    device loop, the other backends after every step: CompiledStep and CompiledLoop compute the same
    steps (bitwise where XLA compiles the step inside a loop as alone), GradOnly rounds its eager update
    otherwise and may stop at another (see `backends`). A predicate that
    takes the keyword ``grad`` also gets the gradient at `params` (its leaves the trained arrays, None at the
    held ones), one that takes
    ``previous_loss`` the loss of the step before (+inf at the first; it is then carried in the state). Ready-made:
    `loopfuse.gtol` (gradient norm) and `loopfuse.ftol` (loss change), see `convergence`.
    stop_on_nonfinite: end the solve after the first step whose loss is NaN or Inf (``retcode="non_finite"``).
    checkpoint_dir, checkpoint_every, keep: as for `fit` (the checkpointed state is ``(params, opt_state)``,
    and the previous loss for an `until` that takes it; steps_per_second counts only the steps this call ran).
    ensemble: True (or a `loopfuse.Ensemble`) solves N problems in one call, `params` leaves leading with
    the member axis N: each member runs the same steps from its own params, on the shared `data` or, wrapped
    as ``loopfuse.per_member(data)``, on its own ``data[m]``; `until` and the non-finite stop end each member
    on its own, and a member that stopped costs no more work (see `ensemble`). The `Solution` is per member
    (params, steps, retcode, loss_history [N, steps]) with the `best` member's index.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> import loopfuse
        >>> sol = loopfuse.minimize(lambda w: jnp.sum((w - 3.0) ** 2), jnp.zeros(2), optimizer=optax.sgd(0.25), steps=3)
        >>> sol.params.tolist(), sol.loss_history.tolist(), sol.steps, sol.retcode
        ([2.625, 2.625], [18.0, 4.5, 1.125], 3, 'max_steps')
    """
    if not callable(loss):
        raise TypeError(f"loss must be callable, got {loss!r}")
    members, params, data = wrapper(ensemble, params, "params", data)     # the one question: an ensemble?
    steps = validate.steps(steps)
    stopping.check(until, stop_on_nonfinite, steps)
    checkpoint_every, keep = check_checkpoint_options(checkpoint_dir, checkpoint_every, keep)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    if not isinstance(backend, (GradOnly, CompiledStep, CompiledLoop)):
        raise TypeError(f"backend must be GradOnly(), CompiledStep() or CompiledLoop(), got {backend!r}")
    if isinstance(data, Dataset):
        data.validate()
    batch = () if data is None else data
    t0 = time.perf_counter()
    init, program = _program(loss, data is not None, optimizer, backend, until)
    initial = members.init(init)
    followed = progress or checkpoint_dir is not None      # the host sees each chunk
    watched = until is not None or not stop_on_nonfinite or followed   # not one call checked after it
    whole = _whole(program, members, params, batch, steps, watched)
    planned = whole.loops if whole is not None else None
    started = planned is not None       # the loop starts from the params (one call, no initial state of ours)
    if planned is not None:             # as the first such solve planned it: nothing to decide
        plain, runner, chunk, back = planned[0].on(batch), planned[1].on(batch), steps, same_layout
    else:
        program, state, stop, stop_on_nonfinite = members.wrap(
            program, initial(params, batch), batch, _flag if until is not None else None, stop_on_nonfinite, ("loss",))
        runner = _runner(backend, program, batch, stop, stop_on_nonfinite)
        chunk = runner.chunk_size(state, steps, followed)
        every = (checkpoint_every or chunk) if checkpoint_dir is not None else None
        checkpoints = Checkpoints(checkpoint_dir, keep) if checkpoint_dir is not None else None
        with closed_on_failure(checkpoints):
            plain = runner.unwatched(state, steps, chunk, followed)
            carried_state, checkpoints, back = carried((plain or runner).program(chunk), state, batch, checkpoints)
            if whole is not None and plain is not None and carried_state is state:   # carried as the init makes it
                started = whole.start(plain, runner, initial, params, steps)
            if not started:
                state = carried_state
                (plain or runner).compile(state, chunk_sizes(0, steps, chunk, every))
    compile_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    if plain is None:
        result = drive(runner, state, steps, chunk=chunk, progress=progress, checkpoints=checkpoints, every=every,
                       pipelined=True)    # a Ctrl-C raises KeyboardInterrupt below
    else:
        result = plain.started(initial, params, steps) if started else plain.whole(state, steps)
        if not np.isfinite(result.history["loss"]).all():
            state, _, back = carried(runner.program(chunk), initial(params, batch), batch)     # stop at the first one
            result = drive(runner, state, steps, chunk=chunk, pipelined=True)
    if result.interrupted:
        raise KeyboardInterrupt
    if plain is None:                # (one call's state came with the history the driver read)
        jax.block_until_ready(result.state)
    seconds = time.perf_counter() - t0
    result = members.result(back(result), RETCODES)
    ran = (max(result.steps - result.resumed_from, 0) if isinstance(result.steps, int)       # (member) steps
           else int(np.sum(np.maximum(result.steps - result.resumed_from, 0))))                  # this call ran
    losses = result.history["loss"]
    return Solution(static_leaves.unwrap(result.state[0]), losses, result.steps, result.retcode, ran / seconds,
                    compile_seconds, backend, members.best(losses, result.steps))


def _program(loss: Callable, has_data: bool, optimizer: optax.GradientTransformation, backend: Backend,
             until: Callable | None) -> tuple[Callable, Callable | Step]:
    """``(init, run)`` of one solve: `init(params, batch)` is the initial state ``(copy of params, optimizer
    state)``, and the loss of the step before (+inf) for an `until` that takes it, in one jitted call; `run`
    runs the steps: GradOnly's eager update, or the compiled backends' `Step` of it (which caches its
    executables by abstract signature; an ensemble's and CompiledStep's are derived from it). Kept while
    `loss` lives (by its identity, as jax.jit keys its function; a bound method by its object and function), for
    its last `_Programs.size` combinations of the other objects, each keyed by what it computes (`object_keys`:
    ``optax.adam(1e-3)`` or an `until` lambda written inline is one program; `gtol` and `ftol` by their
    tolerances), so repeating a solve compiles nothing and a loss that is gone frees what it closed over
    (`_Programs`)."""
    return _PROGRAMS.get(loss, (has_data, optimizer, backend, until))


def _build_program(loss, has_data, optimizer, backend, until):
    objective = _objective(loss, has_data)

    def as_given(jitted_init):      # init of the params as the caller holds them (a loop's init is given them so)
        return functools.wraps(jitted_init)(lambda params, batch: jitted_init(static_leaves.wrap(params), batch))
    previous = until is not None and "previous_loss" in _keywords(until, _UNTIL_KEYWORDS)

    def init(params, batch):
        state = jax.tree_util.tree_map(jnp.copy, (params, optimizer.init(_parts(params)[0])))
        if not previous:
            return state
        first = batch.batch(np.int32(0)) if isinstance(batch, Dataset) else batch
        value = jax.eval_shape(objective, params, first)        # the batch's shapes only: XLA is not given it
        return (*state, jnp.full(value.shape, jnp.inf, value.dtype))

    value_and_grad = backend.ad.value_and_grad(lambda trained, held, batch: objective(_joined(trained, held), batch))
    if isinstance(backend, GradOnly):
        return as_given(jax.jit(init)), _update(jax.jit(value_and_grad), objective, optimizer, until, jit_line_search=True)
    update = _update(value_and_grad, objective, optimizer, until)
    options = replace(backend.fragment, keep_aux=("loss",)) if isinstance(backend, CompiledLoop) else backend.fragment
    return as_given(jax.jit(init)), Step(update, options)  # a loop computes the `until` flag for its stop, never returns it


class _Programs:
    """`_build_program`'s results, kept per loss while it lives, as jax.jit keeps a function's traces: keyed by the
    loss's identity (a bound method's object's, with its function in the key: each access makes a new method
    object; two equal objects are two losses), dropped when it is collected, each program built on a proxy that
    holds the loss weakly, so that a program never keeps its own loss alive (a sweep of solves over losses
    closing over datasets keeps none of them). A loss that cannot be referenced weakly is kept, for the last
    `size` solves."""

    def __init__(self, size: int):
        self.size = size
        self.owners: dict[int, OrderedDict] = {}          # id(owner) -> programs, while the owner lives
        self.strong: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, loss: Callable, objects: tuple):
        """The program of `loss` and `objects` (``(has_data, optimizer, backend, until)``): found by the objects
        themselves where they are the ones it was built with, else by their `object_key`s (built on a miss)."""
        owner, func = (loss.__self__, loss.__func__) if inspect.ismethod(loss) else (loss, None)
        built: OrderedDict
        head: Callable | None
        try:
            ref = weakref.ref(owner)
        except TypeError:                           # not weakly referable: kept by its hash, if it has one
            try:
                hash(loss)
            except TypeError:
                return _build_program(loss, *objects)
            built, head = self.strong, loss
        else:
            with self.lock:
                if id(owner) not in self.owners:
                    self.owners[id(owner)] = OrderedDict()
                    weakref.finalize(owner, self.owners.pop, id(owner), None)
                built = self.owners[id(owner)]
            head = func
        same = (head, *objects)
        program = self._found(built, same)
        if program is not None:
            return program
        alike = (head, *map(object_key, objects))
        program = self._found(built, alike)
        if program is not None:
            return program
        program = _build_program(loss if built is self.strong else _weakly(loss, ref, func), *objects)
        with self.lock:
            for key in (same, alike):
                try:
                    built[key] = program
                except Exception:                   # noqa: BLE001 -- unhashable (or uncomparable): not kept so
                    pass
            while len(built) > 2 * self.size:          # (a program under two keys)
                built.popitem(last=False)
        return program

    def _found(self, built: OrderedDict, key: tuple):
        with self.lock:
            try:
                program = built.get(key)
            except Exception:                       # noqa: BLE001 -- an object that cannot be hashed or compared
                return None
            if program is not None:
                built.move_to_end(key)
            return program


def _weakly(loss: Callable, ref: weakref.ref, func: Callable | None) -> Callable:
    """`loss` called through `ref`, a weak reference to it (or, for a bound method, to its object, `func` its
    function), with its name and docstring: what a program holds of it."""
    def weak(*args, **kwargs):
        return func(ref(), *args, **kwargs) if func is not None else ref()(*args, **kwargs)
    functools.update_wrapper(weak, loss, updated=())
    vars(weak).pop("__wrapped__")                   # (it would hold the loss)
    return weak


_PROGRAMS = _Programs(64)


@dataclass
class _Whole:
    """How a solve at one signature runs as one device call from its params, once the first one planned it
    (`loops`, their batch dropped: each solve gives its own): its loop without a stop (`_Loop.unwatched`),
    started from the params (`_Loop.started`), and the loop that stops, which runs the solve again from the start
    where a loss is not finite. `refused`: its loop cannot start from the params (`start`)."""

    loops: "tuple[_Loop, _Loop] | None" = None
    refused: bool = False

    def start(self, plain: "_Loop", stopping: "_Loop", init: Callable, params, steps: int) -> bool:
        """Compile `plain`'s loop of `steps` from ``init(params, batch)`` and keep the plan; False, and never
        tried again, where it cannot start so (a mesh, a memory limit, one step: `options.init_refused`; ordered effects,
        typed keys in the state, an init with effects: `InitFoldError`)."""
        if self.refused or init_refused({**vars(plain.step.options), "steps": steps}):
            self.refused = True
            return False
        try:
            plain.started_program(init, steps).compiled(params, plain.batch)
        except InitFoldError:
            self.refused = True
            return False
        self.loops = plain.on(None), stopping.on(None)
        return True


def _whole(program, members, params, batch, steps: int, watched: bool) -> _Whole | None:
    """Where a solve of these `members` may run as one call started from its params (a compiled loop on a fixed
    batch whose only stop is the non-finite one and that the host does not follow: `watched` is false, see
    `_Loop.unwatched`), its `_Whole` for `steps` and the abstract signature of `params` and `batch` (kept with
    the Step, empty until the first such solve fills it); else None."""
    if not isinstance(program, Step) or watched or isinstance(batch, Dataset):
        return None
    return program.derived(("minimize", members, steps, Step._signature(params, batch, {})[0]), _Whole)


def _objective(loss: Callable, has_data: bool) -> Callable:
    """``objective(params, batch)``: `loss`, or for a loss of params only, `loss` ignoring the batch, on the params
    as the caller holds them (`static_leaves.unwrap`)."""
    if has_data:
        return lambda p, batch: loss(static_leaves.unwrap(p), batch)
    return lambda p, _: loss(static_leaves.unwrap(p))


def _runner(backend: Backend, program, batch, stop: Callable | None, stop_on_nonfinite: bool):
    """What runs `program`'s steps for `backend`, stopping after a step where ``stop(new_state, aux)`` is true
    (evaluated on the device by a loop, on the host after each step otherwise) or a non-finite loss."""
    if isinstance(backend, GradOnly):
        return _Eager(program, batch, stop, stop_on_nonfinite)
    if isinstance(backend, CompiledStep):
        return _Stepped(program.derived(("step axis",), lambda: Step(_with_step_axis(program.fn), program.options)),
                        batch, stop, stop_on_nonfinite)
    return _Loop(program, backend.steps, batch, stop, stop_on_nonfinite)


def _update(value_and_grad: Callable, objective: Callable, optimizer: optax.GradientTransformation,
            until: Callable | None, jit_line_search: bool = False) -> Callable:
    """The step every backend runs: ``(state, batch) -> (new state, {"loss": loss})``, the state being
    ``(params, opt_state)``, plus the loss of the step before when `until` takes ``previous_loss``.
    An update that takes ``value``/``grad``/``value_fn`` (`_OPTIMIZER_KEYWORDS`) gets them; with `until`,
    the aux also holds ``"until": until(params, loss, ...)``, its value on the params before the update
    (the solve stops on it through `_flag`: a loop inside, the host backends after each step).
    `jit_line_search` (GradOnly's eager step): an update that takes ``value_fn`` evaluates the loss (a
    line search), so it runs as one `jax.jit` with the batch as an argument; eagerly, jax would compile
    its while loop again at every step, as the loop body is a new closure each time."""
    wanted = _keywords(until, _UNTIL_KEYWORDS) if until is not None else ()
    given = _keywords(optimizer.update, _OPTIMIZER_KEYWORDS)

    def optimizer_update(grads, opt_state, trained, held, batch, value):
        offered = {"value": value, "grad": grads, "value_fn": lambda p: objective(_joined(p, held), batch)}
        return optimizer.update(grads, opt_state, trained, **{k: offered[k] for k in given})
    if jit_line_search and "value_fn" in given:
        optimizer_update = jax.jit(optimizer_update)

    def update(state, batch):
        params, opt_state, *previous = static_leaves.wrap(state)    # a step sees the state unwrapped: wrap it again
        trained, held = _parts(params)
        value, grads = value_and_grad(trained, held, batch)
        try:
            updates, opt_state = optimizer_update(grads, opt_state, trained, held, batch, value)
        except TypeError as e:
            if "keyword" not in str(e):
                raise
            raise TypeError(f"the optimizer's update needs arguments minimize cannot supply ({e}); minimize "
                            f"passes {', '.join(_OPTIMIZER_KEYWORDS)} (the loss of this step's batch) to an "
                            "update that takes them") from None
        new_state = (_joined(optax.apply_updates(trained, updates), held), opt_state, *([value] if previous else []))
        if until is None:
            return new_state, {"loss": value}
        known = {"grad": grads, "previous_loss": previous[0] if previous else None}
        flag = stopping.predicate(until(static_leaves.unwrap(params), value, **{k: known[k] for k in wanted}),
                                  "until=lambda params, loss: loss < 1e-6")
        return new_state, {"loss": value, "until": flag}
    return update


def _parts(params) -> tuple:
    """``(trained, held)``: `params` with None for each leaf the gradient does not see (`leaves.is_differentiable`:
    an integer, a bool, a typed key), as `eqx.partition` marks what it leaves out, and those leaves with None for
    the others; ``(params, None)`` where every leaf is trained (the program as if there were no split). A
    TypeError where none is."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    flags = [is_differentiable(x) for x in leaves]
    if all(flags):
        return params, None
    if not any(flags):
        raise TypeError("minimize trains the params' floating (or complex) leaves, and these have none: "
                        f"{jax.tree_util.tree_map(lambda x: str(dtype(x)), params)}")
    return (jax.tree_util.tree_unflatten(treedef, [x if f else None for x, f in zip(leaves, flags)]),
            jax.tree_util.tree_unflatten(treedef, [None if f else x for x, f in zip(leaves, flags)]))


def _joined(trained, held):
    """The params `_parts` split into `trained` and `held`."""
    if held is None:
        return trained
    return jax.tree_util.tree_map(lambda t, h: h if t is None else t, trained, held, is_leaf=lambda x: x is None)


_OPTIMIZER_KEYWORDS = ("value", "grad", "value_fn")   # what minimize passes to an update that takes them
_UNTIL_KEYWORDS = ("grad", "previous_loss")           # ... and to an `until` that takes them


def _keywords(fn: Callable, offered: tuple) -> tuple:
    """The names in `offered` that `fn` takes as keywords (all for ``**kwargs``); a TypeError naming any
    other keyword-only argument it requires."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):   # not introspectable: pass nothing
        return ()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return offered
    missing = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in offered]
    if missing:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} requires keyword arguments {missing} that minimize "
                        f"cannot supply; it supplies {list(offered)}")
    return tuple(p.name for p in params if p.name in offered and p.kind is not p.POSITIONAL_ONLY)


_HISTORY = jax.tree_util.tree_structure({"loss": 0})    # the aux history of a host-checked runner


class _HostChecked:
    """A runner whose chunk is one step, its stop checked on the host."""

    chains = False

    def chunk_size(self, state, steps: int, followed: bool) -> int:
        return 1

    def unwatched(self, state, steps: int, chunk: int, followed: bool) -> None:
        return None

    def prepare(self, state, k: int, start: int = 0):
        return _HISTORY


class _Eager(_HostChecked):
    """GradOnly: a jitted derivative inside an eager Python step, one step per `run`."""

    def __init__(self, update: Callable, batch, stop: Callable | None, stop_on_nonfinite: bool):
        self.update, self.batch, self.stop, self.stop_on_nonfinite = update, batch, stop, stop_on_nonfinite

    def compile(self, state, sizes) -> None:
        self.run(state, 0, 1)  # compiles the derivative and warms up the eager ops; nothing is donated

    def program(self, k: int) -> None:
        return None

    def run(self, state, start: int, k: int, after=None):
        batch = self.batch.batch(np.int32(start)) if isinstance(self.batch, Dataset) else self.batch
        new_state, aux = self.update(state, batch)
        return new_state, *_one_step(new_state, jax.tree_util.tree_map(lambda x: x[None], aux), self.stop,
                                     self.stop_on_nonfinite)


class _Stepped(_HostChecked):
    """CompiledStep: one call of the compiled `step` (its aux with a step axis) per step."""

    def __init__(self, step: Step, batch, stop: Callable | None, stop_on_nonfinite: bool):
        self.step, self.batch, self.stop, self.stop_on_nonfinite = step, batch, stop, stop_on_nonfinite

    def compile(self, state, sizes) -> None:
        self.step.compiled(state, self.batch)

    def program(self, k: int) -> Step:
        return self.step

    def run(self, state, start: int, k: int, after=None):
        state, aux = self.step(state, self.batch, start=start)
        return state, *_one_step(state, aux, self.stop, self.stop_on_nonfinite)


class _Loop(LoopChunks):
    """CompiledLoop: device loops of `steps` steps of `step` (None: chosen from the program), each ending after
    a step where ``stop(new_state, aux)`` is true: the loop's own stop (one solve's: `_flag`, the step's `until`
    flag)."""

    def __init__(self, step: Step, steps: int | None, batch, stop: Callable | None, stop_on_nonfinite: bool,
                 known: "_Known | None" = None):
        super().__init__(step, batch, stop, stop_on_nonfinite)
        self.steps, self.known = steps, known

    def chunk_size(self, state, steps: int, followed: bool) -> int:
        """The steps per device call of a run of `steps`: `CompiledLoop(steps=...)`'s; else `CHUNK` for a run
        the host follows (`followed`: a progress bar, checkpoints) or on a `Dataset` (a call serves its
        steps' epochs); else `steps_per_call` (the whole run, for a small step)."""
        if self.steps is not None:
            return min(self.steps, steps)
        if followed or isinstance(self.batch, Dataset):
            return min(CHUNK, steps)
        return min(steps, self._traits(state).per_call)

    def unwatched(self, state, steps: int, chunk: int, followed: bool) -> "_Loop | None":
        """This run without the loop's non-finite stop, where it is the only stop and the run one device call
        that the host does not follow (no progress bar, no checkpoint of a state the solve may not return)
        of a step without loops or conditionals of its own; else None. `minimize` runs it, then checks the
        loss history on the host: all finite, the stopping loop would have run the same steps (bitwise); a
        NaN or Inf, it runs the stopping loop from the start. A loop that can stop pays for its flag at every
        step (a kernel more: 2-10% of a 3-us step on a loaded CPU); a step that runs on after a NaN cannot loop
        forever where it has no loops of its own."""
        if (not self.stop_on_nonfinite or self.until is not None or chunk < steps or followed
                or not self._traits(state).straight):
            return None
        return _Loop(self.step, self.steps, self.batch, None, False, self._known(state))

    def whole(self, state, steps: int) -> FitResult:
        """The run of `steps` steps as one call of its loop, not through `drive`: its state, and its history on
        the host (read in place on a CPU: `chunks.host`). For `unwatched`'s run only, whose state is minimize's
        own copy: nothing holds a Ctrl-C back (a KeyboardInterrupt loses that copy, never the caller's params),
        and nothing but its history is read."""
        state, aux = self.loop(steps)(state, self.batch)
        return FitResult(state, host(aux), steps)

    def on(self, batch) -> "_Loop":
        """This runner on `batch`, of the same signature as its own (what it learned of its step holds)."""
        return _Loop(self.step, self.steps, batch, self.until, self.stop_on_nonfinite, self.known)

    def started_program(self, init: Callable, steps: int) -> Step:
        """The loop of `steps` steps started from ``init(params, batch)`` inside its program (`Step.loop`)."""
        return self.step.loop(steps, until=self.until, stop_on_nonfinite=self.stop_on_nonfinite, init=init)

    def started(self, init: Callable, params, steps: int) -> FitResult:
        """`whole` from ``init(params, batch)``, in one call of `started_program`: the state is its own, the
        caller's params never donated."""
        state, aux = self.started_program(init, steps)(params, self.batch)
        return FitResult(state, host(aux), steps)

    def prepare(self, state, k: int, start: int = 0):
        """`LoopChunks.prepare` once per loop and signature (a repeated solve asks its Step for nothing)."""
        built = self._known(state).aux
        key = (self.until, self.stop_on_nonfinite, k)
        if key not in built:
            built[key] = super().prepare(state, k, start)
        return built[key]

    def compile(self, state, sizes) -> None:
        for k in sizes:
            self.prepare(state, k)

    def _known(self, state) -> "_Known":
        """What is known of the step at this run's abstract signature (kept with the Step)."""
        if self.known is None:
            self.known = self.step.derived(("minimize", Step._signature(state, self.batch, {})[0]), _Known)
        return self.known

    def _traits(self, state) -> "_Traits":
        known = self._known(state)
        if known.traits is None:      # the step traced as a call traces it (`compiler.trace`), a Dataset served
            plan = self.step._plan(state, self.batch, 0, {})
            known.traits = _Traits.of(plan.traced.module, plan.devices[0].platform)
        return known.traits


class _Traits(NamedTuple):
    """What `minimize`'s choices read of its traced step."""

    per_call: int     # `steps_per_call`
    straight: bool    # no loops or conditionals of its own

    @classmethod
    def of(cls, module, platform: str) -> "_Traits":
        return cls(steps_per_call(module, platform), not own_control_flow(module.operation))


@dataclass
class _Known:
    """What one solve's runs learned of its step at one abstract signature: its traits (traced once) and each
    loop's aux structure (``(until, stop_on_nonfinite, steps)`` -> it, the loop compiled)."""

    traits: _Traits | None = None
    aux: dict = field(default_factory=dict)


def _flag(new_state, aux):
    """One solve's stop: the `until` flag its step computed on the params before its update, an aux leaf a
    loop does not return (its step keeps only the loss, see `stopping`)."""
    return aux["until"]


def _one_step(new_state, aux: dict, stop: Callable | None, stop_on_nonfinite: bool) -> tuple:
    """``(aux history, Stop or None)`` of a one-step chunk from the step's new state and its aux with a [1]
    step axis: the host checks each step's ``stop(new_state, aux)`` (and, watched, its loss)."""
    if stop is None and not stop_on_nonfinite:
        return aux, None
    return {"loss": aux["loss"]}, Stop(1, stop is not None and stop(new_state, aux))


def _with_step_axis(update: Callable) -> Callable:
    """`update` with its aux as a one-step history ([1] leading axis), like a loop of one step."""
    def one_step(state, batch):
        state, aux = update(state, batch)
        return state, jax.tree_util.tree_map(lambda x: x[None], aux)
    return one_step
