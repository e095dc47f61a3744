"""Ready-made `until` predicates for `minimize`: stop when the gradient or the loss change is small.

`minimize` calls ``until(params, loss)``, adding the keywords the predicate names among
``grad`` (the gradient at `params`) and ``previous_loss`` (the loss of the step before; +inf at
the first step), all on the params before the step's update. Every reduction is over all the
leaves of the params pytree. Each is a frozen dataclass: predicates of equal tolerances are equal, so
``until=loopfuse.gtol(1e-6)`` written inline in a loop of solves is one program (minimize keeps its
programs per `until` object, `solve._program`), compiled once.
"""
from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class gtol:
    """Converged when the largest gradient entry is small: ``max_i |grad_i| <= atol`` (the infinity
    norm over all leaves, Optim.jl's ``g_tol``).

    Examples:
        >>> import jax.numpy as jnp, optax, loopfuse
        >>> sol = loopfuse.minimize(lambda w: jnp.sum((w - 3.0) ** 2), jnp.zeros(2), optimizer=optax.sgd(0.25),
        ...                         steps=100, until=loopfuse.gtol(1e-3))
        >>> sol.retcode, sol.steps
        ('converged', 14)
        >>> loopfuse.gtol(1e-3) == loopfuse.gtol(1e-3)      # the same program
        True
    """

    atol: float

    def __post_init__(self) -> None:
        _check(self)

    def __call__(self, params, loss, *, grad):
        return jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)])) <= self.atol


@dataclass(frozen=True)
class ftol:
    """Converged when the loss stopped changing: ``|previous_loss - loss| <= atol + rtol * |loss|``
    (``loss`` at the params before this step's update, ``previous_loss`` the step before's; never at
    the first step). Like optimistix's `rtol`/`atol` on the loss, Optim.jl's ``f_abstol``/``f_reltol``.

    Examples:
        >>> import jax.numpy as jnp, optax, loopfuse
        >>> sol = loopfuse.minimize(lambda w: jnp.sum((w - 3.0) ** 2), jnp.zeros(2), optimizer=optax.sgd(0.25),
        ...                         steps=100, until=loopfuse.ftol(atol=1e-4))
        >>> sol.retcode, sol.steps, sol.loss_history[-2:].tolist()
        ('converged', 11, [6.866455078125e-05, 1.71661376953125e-05])
    """

    rtol: float = 0.0
    atol: float = 0.0

    def __post_init__(self) -> None:
        _check(self)

    def __call__(self, params, loss, *, previous_loss):
        return jnp.abs(previous_loss - loss) <= self.atol + self.rtol * jnp.abs(loss)


def _check(predicate) -> None:
    for key, value in vars(predicate).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{type(predicate).__name__}({key}=...) must be a non-negative number, got {value!r}")
