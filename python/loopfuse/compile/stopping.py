"""Stopping a device loop early: ``Step.loop(K, until=pred, stop_on_nonfinite=True)``.

The step traced for such a loop computes one more output, a scalar bool (true = stop after this
step), tagged ``loopfuse.stop``; the ``wrap-loop`` pass carries it and ends the loop after the
first step where it is true, and the call returns the number of steps run and whether the stop
ended the loop (true also when the K-th step asked to) as third and fourth values.

`until` sees the step's whole aux, also the leaves that ``keep_aux`` leaves out: a flag the step
computes itself (on values before its update, as `minimize`'s ``until(params, loss, grad=...)``)
is such a leaf, and ``until=lambda state, aux: aux["flag"]`` stops on it. The leaf is computed
once, for the stop, and never returned (``drop-unused-outputs``).
"""
import functools
import operator
from typing import Callable

import jax
import jax.numpy as jnp


def check(until, stop_on_nonfinite, steps) -> None:
    """Reject options that cannot stop a loop (raised when the Step is made, before any tracing)."""
    if until is not None and not callable(until):
        raise TypeError(f"until must be a function (state, aux) -> scalar bool, got {type(until).__name__}")
    if not isinstance(stop_on_nonfinite, bool):
        raise TypeError(f"stop_on_nonfinite must be a bool, got {stop_on_nonfinite!r}")
    if (until is not None or stop_on_nonfinite) and steps is None:
        raise ValueError("until= and stop_on_nonfinite= stop a device loop: use step.loop(K, until=...)")


def flag(until: Callable | None, stop_on_nonfinite: bool):
    """``stop(new_state, aux, kept) -> scalar bool`` for a stopping loop, None for a plain one.

    `kept` maps the dotted path of every aux leaf the call returns to its value; the non-finite
    check reduces only those of floating (or complex) dtype, never the state.
    """
    if until is None and not stop_on_nonfinite:
        return None

    def stop(new_state, aux, kept: dict) -> jax.Array:
        flags = [predicate(until(new_state, aux))] if until is not None else []
        if stop_on_nonfinite:
            flags.append(nonfinite(kept))
        return functools.reduce(operator.or_, flags)

    return stop


def predicate(value, example: str = "until=lambda state, aux: aux['loss'] < 1e-4") -> jax.Array:
    """The value `until` returned, if it is a scalar bool (else a TypeError naming what it is and
    showing `example`)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(value, bool) or (shape == () and dtype == jnp.bool_):
        return jnp.asarray(value)
    what = f"{dtype}{list(shape)}" if shape is not None and dtype is not None else f"{type(value).__name__} {value!r:.60}"
    raise TypeError(f"until must return a scalar bool, it returned {what}; compare a scalar, e.g. {example}")


def nonfinite(kept: dict) -> jax.Array:
    """Whether any of the floating `kept` aux leaves (dotted path -> value) holds a NaN or Inf."""
    leaves = {p: x for p, x in kept.items() if jnp.issubdtype(x.dtype, jnp.inexact)}
    if not leaves:
        raise ValueError(f"stop_on_nonfinite=True watches the floating aux leaves the call returns, and this "
                         f"step returns none (aux leaves: {sorted(kept) or 'none'}); return the loss as aux "
                         f"or keep it with keep_aux")
    return functools.reduce(operator.or_, [jnp.any(~jnp.isfinite(x)) for x in leaves.values()])
