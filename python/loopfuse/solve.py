"""minimize: an Optimization.jl-style solve, the same optax step run by any backend."""
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import validate
from .backends import Backend, CompiledLoop, CompiledStep, GradOnly
from .data import Dataset
from .step import compile_step


@dataclass(frozen=True, eq=False)
class Solution:
    """What `minimize` found.

    params:           the parameters after the last step.
    loss_history:     float array [steps]; entry i is the loss at step i, before that step's update.
    steps_per_second: steps / wall time of the solve loop: from the first step's dispatch until the
                      final params are ready and the loss history is on the host, with every executable
                      already built (see compile_seconds).
    compile_seconds:  wall time before the loop spent building executables (for GradOnly: one
                      discarded warm-up step, which compiles the derivative and the eager ops).
    backend:          the backend that ran it.
    """

    params: Any
    loss_history: np.ndarray
    steps_per_second: float
    compile_seconds: float
    backend: Backend


def minimize(loss: Callable, params, data=None, optimizer: optax.GradientTransformation = optax.adam(1e-3),
             steps: int = 1000, backend: Backend = CompiledLoop(), progress: bool = False) -> Solution:
    """Minimize `loss` from `params` with `steps` updates of `optimizer`, run by `backend`.

    loss: ``loss(params, batch)``, or ``loss(params)`` when `data` is None; a real scalar.
    data: None, a fixed batch pytree, or a `Dataset` (step i sees ``data.batch(i)``).
    Every backend runs the same step: value and gradient by ``backend.ad``, then
    ``optimizer.update`` and ``optax.apply_updates``. The caller's `params` are copied, never donated.
    """
    if not callable(loss):
        raise TypeError(f"loss must be callable, got {loss!r}")
    validate.steps(steps)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    if not isinstance(backend, (GradOnly, CompiledStep, CompiledLoop)):
        raise TypeError(f"backend must be GradOnly(), CompiledStep() or CompiledLoop(), got {backend!r}")
    if isinstance(data, Dataset):
        data.validate()
    batch = () if data is None else data
    objective = loss if data is not None else (lambda p, _: loss(p))
    value_and_grad = backend.ad.value_and_grad(objective)
    state = jax.tree_util.tree_map(jnp.copy, (params, optimizer.init(params)))
    if isinstance(backend, GradOnly):
        runner = _Eager(_update(jax.jit(value_and_grad), optimizer), batch)
    else:
        runner = _Compiled(backend, _update(value_and_grad, optimizer), batch, steps)

    t0 = time.perf_counter()
    runner.compile(state)
    compile_seconds = time.perf_counter() - t0

    bar = _bar(steps) if progress else None
    losses, done = [], 0
    t0 = time.perf_counter()
    while done < steps:
        k = min(runner.chunk, steps - done)
        state, loss_k = runner.run(state, done, k)
        losses.append(loss_k)
        done += k
        if bar is not None:
            bar.update(k)
            bar.set_postfix(loss=f"{float(jnp.ravel(loss_k)[-1]):.4g}")
    jax.block_until_ready(state)
    history = np.concatenate([np.atleast_1d(np.asarray(x)) for x in losses])
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return Solution(state[0], history, steps / seconds, compile_seconds, backend)


def _update(value_and_grad: Callable, optimizer: optax.GradientTransformation) -> Callable:
    """The step every backend runs: ``((params, opt_state), batch) -> (new state, {"loss": loss})``."""
    def update(state, batch):
        params, opt_state = state
        value, grads = value_and_grad(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}
    return update


class _Eager:
    """GradOnly: a jitted derivative inside an eager Python step, one step per `run`."""

    chunk = 1

    def __init__(self, update: Callable, batch):
        self.update, self.batch = update, batch

    def compile(self, state) -> None:
        self.run(state, 0, 1)  # compiles the derivative and warms up the eager ops; nothing is donated

    def run(self, state, start: int, k: int):
        batch = self.batch.batch(np.int32(start)) if isinstance(self.batch, Dataset) else self.batch
        new_state, aux = self.update(state, batch)
        return new_state, aux["loss"]


class _Compiled:
    """CompiledStep (one step per call) or CompiledLoop (device loops of `backend.steps` steps)."""

    def __init__(self, backend: CompiledStep | CompiledLoop, update: Callable, batch, steps: int):
        options = backend.compile_options() if isinstance(backend, CompiledLoop) else {}
        step = compile_step(update, keep_aux=("loss",), **options)
        self.batch = batch
        if isinstance(backend, CompiledStep):
            self.chunk, self.steps = 1, {1: step}
        else:
            self.chunk = min(backend.steps, steps)
            self.steps = {k: step.loop(k) for k in {self.chunk, steps % self.chunk} if k}

    def compile(self, state) -> None:
        for step in self.steps.values():
            step.compiled(state, self.batch)

    def run(self, state, start: int, k: int):
        new_state, aux = self.steps[k](state, self.batch, start=start)
        return new_state, aux["loss"]


def _bar(total: int):
    from tqdm.auto import tqdm
    return tqdm(total=total, unit="step")
