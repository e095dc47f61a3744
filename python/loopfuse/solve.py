"""minimize: an Optimization.jl-style solve, the same optax step run by any backend."""
import functools
import inspect
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import stopping, validate
from .backends import Backend, CompiledLoop, CompiledStep, GradOnly
from .checkpoint import Checkpoints
from .chunks import LoopChunks, Stop, check_checkpoint_options, chunk_sizes, drive
from .data import Dataset
from .ensemble import (PerMember, check_data, config as ensemble_config, mesh_options, minimize_step, one_member,
                       share, size, sole, sole_data, solution, start)
from .results import Solution
from .step import Step, compile_step

RETCODES = {"until": "converged", "max_steps": "max_steps", "non_finite": "non_finite"}   # the driver's: minimize's


def minimize(loss: Callable, params, data=None, optimizer: optax.GradientTransformation = optax.adam(1e-3),
             steps: int = 1000, backend: Backend = CompiledLoop(), progress: bool = False,
             until: Callable | None = None, stop_on_nonfinite: bool = True,
             checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int | None = None,
             keep: int | None = 3, ensemble=False) -> Solution:
    """Minimize `loss` from `params` with `steps` updates of `optimizer`, run by `backend`.

    loss: ``loss(params, batch)``, or ``loss(params)`` when `data` is None; a real scalar.
    params: the initial params pytree, or a `Solution` to continue from: its params, with a fresh
    optimizer state (Adam for 500 steps, then L-BFGS: ``minimize(loss, minimize(loss, p0, ...), ...)``).
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
    device loop, the other backends after every step: CompiledStep and CompiledLoop compute bitwise the
    same steps and stop at the same one, GradOnly rounds its eager update otherwise and may stop at
    another (see `backends`). A predicate that
    takes the keyword ``grad`` also gets the gradient at `params`, one that takes ``previous_loss``
    the loss of the step before (+inf at the first; it is then carried in the state). Ready-made:
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
    if isinstance(params, Solution):
        params = params.params
    members = ensemble_config(ensemble)
    if members is not None:
        check_data(data, size(params, "params"))
        if size(params, "params") == 1:
            return one_member(minimize(loss, sole(params), sole_data(data), optimizer, steps, backend, progress, until,
                                       stop_on_nonfinite, checkpoint_dir, checkpoint_every, keep))
    elif isinstance(data, PerMember):
        raise TypeError("per_member data gives each member of an ensemble its own data: pass ensemble=True")
    validate.steps(steps)
    stopping.check(until, stop_on_nonfinite, steps)
    check_checkpoint_options(checkpoint_dir, checkpoint_every, keep)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    if not isinstance(backend, (GradOnly, CompiledStep, CompiledLoop)):
        raise TypeError(f"backend must be GradOnly(), CompiledStep() or CompiledLoop(), got {backend!r}")
    if isinstance(data, Dataset):
        data.validate()
    batch = () if data is None else data
    t0 = time.perf_counter()
    watch = None if members is None else stop_on_nonfinite    # an ensemble watches each member's loss itself
    init, program = _program(loss, data is not None, optimizer, backend, until, watch)
    state = init(params)
    if until is not None and "previous_loss" in _keywords(until, _UNTIL_KEYWORDS):
        first = data.batch(np.int32(0)) if isinstance(data, Dataset) else batch
        value = jax.eval_shape(_member_objective(loss, data is not None, members, batch), params,
                               first.data if isinstance(first, PerMember) else first)
        state += (jnp.full(value.shape, jnp.inf, value.dtype),)
    if members is not None:
        devices, n = share(size(params, "params"), getattr(backend, "devices", None))
        state = start(state, n if isinstance(backend, GradOnly) else members.tile_size(n, until is not None), devices)
    flagged, stop_on_nonfinite = until is not None or members is not None, stop_on_nonfinite and members is None
    if isinstance(backend, GradOnly):
        runner: _Eager | _Stepped | _Loop = _Eager(program, batch, stop_on_nonfinite)
    else:
        assert isinstance(program, Step)
        runner = (_Loop(program, backend.steps, batch, flagged, stop_on_nonfinite)
                  if isinstance(backend, CompiledLoop) else _Stepped(program, batch, stop_on_nonfinite))
    chunk = min(runner.chunk, steps)
    every = (checkpoint_every or chunk) if checkpoint_dir is not None else None
    runner.compile(state, chunk_sizes(0, steps, chunk, every))
    compile_seconds = time.perf_counter() - t0

    checkpoints = Checkpoints(checkpoint_dir, keep) if checkpoint_dir is not None else None
    t0 = time.perf_counter()
    result = drive(runner, state, steps, chunk=chunk, progress=progress, checkpoints=checkpoints, every=every,
                   pipelined=True)    # a Ctrl-C raises KeyboardInterrupt here either way
    if result.interrupted:
        raise KeyboardInterrupt
    jax.block_until_ready(result.state)
    seconds = time.perf_counter() - t0
    if members is not None:
        return solution(result, backend, compile_seconds, seconds)
    steps = int(result.steps)                # one solve's: an int (an ensemble's are per member)
    return Solution(result.state[0], result.history["loss"], steps, RETCODES[str(result.retcode)],
                    (steps - result.resumed_from) / seconds, compile_seconds, backend)


def _program(loss: Callable, has_data: bool, optimizer: optax.GradientTransformation, backend: Backend,
             until: Callable | None, watch: bool | None = None) -> tuple[Callable, Callable | Step]:
    """``(init, run)``: `init(params)` is the initial state ``(copy of params, optimizer state)`` in one
    jitted call; `run` runs the steps: GradOnly's eager update, or the compiled backends' `Step` (which
    caches its executables by abstract signature). `watch`: None for one solve; for an ensemble, whether
    a non-finite loss stops a member (init and the step are then the ensemble's, see `ensemble`). Kept
    for the last `_PROGRAMS` combinations of these objects (by identity, as jax.jit keys its function),
    so repeating a solve compiles nothing."""
    try:
        hash((loss, optimizer, backend, until))
    except TypeError:    # an unhashable loss, optimizer or predicate: built anew, never cached
        return _build_program(loss, has_data, optimizer, backend, until, watch)
    return _cached_program(loss, has_data, optimizer, backend, until, watch)


def _build_program(loss, has_data, optimizer, backend, until, watch=None):
    member_init = lambda params: jax.tree_util.tree_map(jnp.copy, (params, optimizer.init(params)))  # noqa: E731
    init = jax.jit(member_init if watch is None else jax.vmap(member_init))
    options = {} if isinstance(backend, GradOnly) else backend.compile_options()
    if watch is not None:                    # an ensemble: its members over the devices
        options = mesh_options(options)
    batched = (lambda update: update) if watch is None else (  # noqa: E731
        lambda update: minimize_step(update, watch, options.get("devices")))
    objective = _objective(loss, has_data)
    value_and_grad = backend.ad.value_and_grad(objective)
    if isinstance(backend, GradOnly):
        return init, batched(_update(jax.jit(value_and_grad), objective, optimizer, until, jit_line_search=True))
    update = batched(_update(value_and_grad, objective, optimizer, until))
    if isinstance(backend, CompiledLoop):    # the `until` flag is computed for the loop's stop, never returned
        return init, compile_step(update, keep_aux=("loss",), **options)
    return init, compile_step(_with_step_axis(update), **options)


_PROGRAMS = 64
_cached_program = functools.lru_cache(maxsize=_PROGRAMS)(_build_program)


def _objective(loss: Callable, has_data: bool) -> Callable:
    """``objective(params, batch)``: `loss`, or for a loss of params only, `loss` ignoring the batch."""
    return loss if has_data else (lambda p, _: loss(p))


def _member_objective(loss: Callable, has_data: bool, members, batch) -> Callable:
    """`_objective`, of every member of an ensemble (vmapped; per-member data unwrapped) when `members`."""
    objective = _objective(loss, has_data)
    return objective if members is None else jax.vmap(objective, in_axes=(0, 0 if isinstance(batch, PerMember) else None))


def _update(value_and_grad: Callable, objective: Callable, optimizer: optax.GradientTransformation,
            until: Callable | None, jit_line_search: bool = False) -> Callable:
    """The step every backend runs: ``(state, batch) -> (new state, {"loss": loss})``, the state being
    ``(params, opt_state)``, plus the loss of the step before when `until` takes ``previous_loss``.
    An update that takes ``value``/``grad``/``value_fn`` (`_OPTIMIZER_KEYWORDS`) gets them; with `until`,
    the aux also holds ``"converged": until(params, loss, ...)``, the flag of the params before the update
    (a loop stops on it through `_flag`, the host backends read it after each step).
    `jit_line_search` (GradOnly's eager step): an update that takes ``value_fn`` evaluates the loss (a
    line search), so it runs as one `jax.jit` with the batch as an argument; eagerly, jax would compile
    its while loop again at every step, as the loop body is a new closure each time."""
    wanted = _keywords(until, _UNTIL_KEYWORDS) if until is not None else ()
    given = _keywords(optimizer.update, _OPTIMIZER_KEYWORDS)

    def optimizer_update(grads, opt_state, params, batch, value):
        offered = {"value": value, "grad": grads, "value_fn": lambda p: objective(p, batch)}
        return optimizer.update(grads, opt_state, params, **{k: offered[k] for k in given})
    if jit_line_search and "value_fn" in given:
        optimizer_update = jax.jit(optimizer_update)

    def update(state, batch):
        params, opt_state, *previous = state
        value, grads = value_and_grad(params, batch)
        try:
            updates, opt_state = optimizer_update(grads, opt_state, params, batch, value)
        except TypeError as e:
            if "keyword" not in str(e):
                raise
            raise TypeError(f"the optimizer's update needs arguments minimize cannot supply ({e}); minimize "
                            f"passes {', '.join(_OPTIMIZER_KEYWORDS)} (the loss of this step's batch) to an "
                            "update that takes them") from None
        new_state = (optax.apply_updates(params, updates), opt_state, *([value] if previous else []))
        if until is None:
            return new_state, {"loss": value}
        known = {"grad": grads, "previous_loss": previous[0] if previous else None}
        flag = stopping.predicate(until(params, value, **{k: known[k] for k in wanted}),
                                  "until=lambda params, loss: loss < 1e-6")
        return new_state, {"loss": value, "converged": flag}
    return update


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


class _Eager:
    """GradOnly: a jitted derivative inside an eager Python step, one step per `run`."""

    chunk, chains = 1, False

    def __init__(self, update: Callable, batch, stop_on_nonfinite: bool):
        self.update, self.batch, self.stop_on_nonfinite = update, batch, stop_on_nonfinite

    def compile(self, state, sizes) -> None:
        self.run(state, 0, 1)  # compiles the derivative and warms up the eager ops; nothing is donated

    def prepare(self, state, k: int, start: int = 0):
        return _HISTORY

    def run(self, state, start: int, k: int, after=None):
        batch = self.batch.batch(np.int32(start)) if isinstance(self.batch, Dataset) else self.batch
        new_state, aux = self.update(state, batch)
        return new_state, *_one_step(jax.tree_util.tree_map(lambda x: x[None], aux), self.stop_on_nonfinite)


class _Stepped:
    """CompiledStep: one call of the compiled `step` per step."""

    chunk, chains = 1, False

    def __init__(self, step: Step, batch, stop_on_nonfinite: bool):
        self.step, self.batch, self.stop_on_nonfinite = step, batch, stop_on_nonfinite

    def compile(self, state, sizes) -> None:
        self.step.compiled(state, self.batch)

    def prepare(self, state, k: int, start: int = 0):
        return _HISTORY

    def run(self, state, start: int, k: int, after=None):
        state, aux = self.step(state, self.batch, start=start)
        return state, *_one_step(aux, self.stop_on_nonfinite)


class _Loop(LoopChunks):
    """CompiledLoop: device loops of `steps` steps of `step`, each ending after a step whose `until` flag
    (with `flagged`) is true: the loop's own stop, which `_flag` reads from the step's aux inside it."""

    def __init__(self, step: Step, steps: int, batch, flagged: bool, stop_on_nonfinite: bool):
        super().__init__(step, batch, _flag if flagged else None, stop_on_nonfinite)
        self.chunk = steps

    def compile(self, state, sizes) -> None:
        for k in sizes:
            self.prepare(state, k)


def _flag(new_state, aux):
    """The `until` of minimize's loops: the flag the step computed on the params before its update, an aux
    leaf the loop does not return (its step keeps only the loss, see `stopping`)."""
    return aux["converged"]


def _one_step(aux: dict, stop_on_nonfinite: bool) -> tuple:
    """``(aux history, Stop or None)`` of a one-step chunk from the step's aux with a [1] step axis: the
    host checks each step, reading the step's `until` flag ("converged") when it has one."""
    if "converged" not in aux and not stop_on_nonfinite:
        return aux, None
    return {"loss": aux["loss"]}, Stop(1, "converged" in aux and aux["converged"][0])


def _with_step_axis(update: Callable) -> Callable:
    """`update` with its aux as a one-step history ([1] leading axis), like a loop of one step."""
    def one_step(state, batch):
        state, aux = update(state, batch)
        return state, jax.tree_util.tree_map(lambda x: x[None], aux)
    return one_step
