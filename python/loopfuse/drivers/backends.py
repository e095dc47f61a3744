"""How `minimize` differentiates and runs a step: AD modes and execution backends (ADTypes-style).

AD modes pick the derivative: `Reverse()` (jax.grad) or `Forward()` (jax.jacfwd). Backends pick
how much of the optimization runs compiled:

* `GradOnly`:     only the derivative is jitted; the optimizer update and the loop run eagerly in
                  Python, one step at a time (what a wrapper around an AD backend does). An update
                  that evaluates the loss (``value_fn``: a line search) is jitted on its own.
* `CompiledStep`: the whole step (loss, gradient, optimizer update) through `compile_step`, one
                  call per step.
* `CompiledLoop`: the whole inner loop through ``compile_step(...).loop(steps)``, one call per
                  chunk of `steps` steps (by default chosen from the program: `chunks.steps_per_call`).

What each computes bit for bit (its reference): `CompiledStep`, ``jax.jit`` of the whole step called
once per step; `CompiledLoop`, those steps in device loops, as measured bitwise what `CompiledStep`
computes, a stop at the same step (XLA may compile a step inside a loop to other last bits);
`GradOnly`, ``jax.jit`` of the derivative with the update run eagerly, which XLA rounds otherwise:
it agrees with the others to rounding, which an ill-conditioned solve (an L-BFGS line search, a
`gtol` stop) carries to other trial points and another stopping step (README, "Backends as a choice").
"""
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from .. import validate
from ..compile.options import FIELDS, Fragment, StepOptions


def _scalar_loss(loss: Callable) -> Callable:
    """`loss`, raising a clear error (while tracing) unless it returns a real scalar."""
    def checked(params, *args):
        value = loss(params, *args)
        if not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value)):
            raise TypeError(
                f"the loss returned a {type(value).__name__}, not a real scalar: minimize differentiates one "
                "number; a loss that returns (value, aux) (as for jax.value_and_grad(has_aux=True)) can drop its "
                "aux: minimize(lambda params, *args: loss(params, *args)[0], ...)")
        shape, dtype = jnp.shape(value), jnp.result_type(value)
        if shape != () or not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"the loss must return a real scalar to be differentiated, got {dtype}{list(shape)}; "
                "reduce it to one number (e.g. jnp.mean or jnp.sum) with a floating dtype")
        return value
    return checked


@dataclass(frozen=True)
class Reverse:
    """Reverse-mode AD (jax.value_and_grad): one backward pass per gradient, whatever the parameter count."""

    def value_and_grad(self, loss: Callable) -> Callable:
        """``(params, *args) -> (loss value, gradient pytree)`` for a scalar `loss(params, *args)`."""
        return jax.value_and_grad(_scalar_loss(loss))


@dataclass(frozen=True)
class Forward:
    """Forward-mode AD (jax.jacfwd over the params pytree).

    It costs one jvp per parameter element, so it is only for small problems.
    """

    def value_and_grad(self, loss: Callable) -> Callable:
        """``(params, *args) -> (loss value, gradient pytree)`` for a scalar `loss(params, *args)`."""
        checked = _scalar_loss(loss)

        def value_and_grad(params, *args):
            value_twice = lambda p: (checked(p, *args),) * 2
            grads, value = jax.jacfwd(value_twice, has_aux=True)(params)
            return value, grads
        return value_and_grad


AD = Reverse | Forward


def _check_ad(owner: str, ad) -> None:
    if not isinstance(ad, (Reverse, Forward)):
        raise TypeError(f"{owner}(ad=...) must be Reverse() or Forward(), got {ad!r}")


@dataclass(frozen=True)
class GradOnly:
    """Jit only ``value_and_grad(loss)``; the optimizer update and the loop run eagerly in Python (an
    update taking ``value_fn``, a line search, is jitted on its own: eagerly, jax would compile its
    while loop at every step)."""

    ad: AD = Reverse()

    def __post_init__(self) -> None:
        _check_ad("GradOnly", self.ad)


@dataclass(frozen=True)
class CompiledStep(Fragment, options=("memory_budget", "micro_batches", "memory_limit")):
    """The whole step (loss, gradient, optimizer update) compiled by `compile_step`, one call per step; the
    keywords below are `compile_step`'s (`fragment`)."""

    ad: AD = Reverse()

    def __post_init__(self) -> None:
        _check_ad("CompiledStep", self.ad)
        self._check_options()

    def compile_options(self) -> dict:
        """The keywords for `compile_step` (only those that are set)."""
        return _set(self.fragment, self.OPTIONS)


@dataclass(frozen=True)
class CompiledLoop(Fragment, options=("devices", "sharding", "memory_budget", "micro_batches", "memory_limit")):
    """The whole inner loop compiled by ``compile_step(...).loop(steps)``, one call per `steps` steps; the
    keywords below are `compile_step`'s (`fragment`).

    steps: the steps of one device call; None (the default): `minimize` chooses them from the program: a run
           the host follows (a progress bar, checkpoints) or on a `Dataset` in calls of `chunks.CHUNK` steps,
           any other in calls of a bounded amount of its step's work (`chunks.steps_per_call`), the whole
           run for a small step (a program per `steps` of minimize, as for a jitted fori_loop). Results are
           the same whatever the calls (bitwise).
    """

    ad: AD = Reverse()
    steps: int | None = None

    def __post_init__(self) -> None:
        _check_ad("CompiledLoop", self.ad)
        if self.steps is not None:
            object.__setattr__(self, "steps", validate.steps(self.steps, "CompiledLoop(steps=...)"))
        self._check_options()

    def compile_options(self) -> dict:
        """The keywords for `compile_step` (only those that are set; devices as a list)."""
        return {k: list(v) if k == "devices" else v for k, v in _set(self.fragment, self.OPTIONS).items()}


def _set(options: StepOptions, names: tuple) -> dict:
    """The options among `names` that differ from their defaults."""
    return {n: getattr(options, n) for n in names if getattr(options, n) != FIELDS[n].default}


Backend = GradOnly | CompiledStep | CompiledLoop
