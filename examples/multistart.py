"""Fit the Lotka-Volterra parameters from 64 starting points in one call: Adam, then L-BFGS, per member.

A non-convex fit started from one point can end in a local minimum. The multistart recipe
(Optimization.jl's multistart tutorial, MultistartOptimization.jl's TikTak) starts it from many
points and keeps the best. `minimize(..., ensemble=True)` runs the 64 solves as one compiled loop:
the two phases of examples/lotka_volterra.py, each member stopping on its own (L-BFGS's `ftol`, a
non-finite loss) and a stopped member costing no more work; `Solution.best` is the member with the
lowest loss.

A wild trial point of a line search can make the ODE too stiff for `max_steps`: the loss is then
+inf (diffrax's ``throw=False``) instead of an error that would end every member's solve, and the
line search backs off.

Tiles (see `loopfuse.drivers.ensemble`): Adam runs every member every step (no `until`), as one batch of 64
that XLA vectorizes. L-BFGS's line search and the adaptive ODE solver, vmapped, run until a batch's
slowest member is done; on a CPU one member per tile (``Ensemble(tile=1)``) costs less than any batch.

    python examples/multistart.py
"""
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lotka_volterra as lv  # noqa: E402  (the model, its data and its optimizers)

STARTS = 64
ADAM_STEPS, LBFGS_STEPS = 300, 100
LBFGS_TILES = loopfuse.Ensemble(tile=1)


def starts(n: int = STARTS, seed: int = 0) -> jax.Array:
    """`n` log-parameter starts, each rate log-uniform within a factor of 2 of the initial guess `lv.START`."""
    rng = np.random.default_rng(seed)
    return jnp.asarray(np.log(lv.START) + rng.uniform(-np.log(2), np.log(2), (n, 4)), jnp.float32)


def loss(log_theta, data):
    """`lv.loss`, +inf where the ODE solve fails (a zero gradient there)."""
    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(lv.vector_field), diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.05, y0=jnp.array([1.0, 1.0]),
        args=log_theta, saveat=diffrax.SaveAt(ts=lv.TIMES),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6), max_steps=4096, throw=False)
    ok = solution.result == diffrax.RESULTS.successful
    return jnp.where(ok, jnp.mean((jnp.where(ok, solution.ys, 0.0) - data) ** 2), jnp.inf)


def fit(n: int = STARTS, adam_steps: int = ADAM_STEPS, lbfgs_steps: int = LBFGS_STEPS) -> dict:
    """Adam, then L-BFGS continuing from Adam's `Solution`, every member at once."""
    data = lv.observations()
    t0 = time.perf_counter()
    adam = loopfuse.minimize(loss, starts(n), data=data, optimizer=lv.ADAM, steps=adam_steps, ensemble=True)
    lbfgs = loopfuse.minimize(loss, adam, data=data, optimizer=lv.LBFGS, steps=lbfgs_steps, until=lv.UNTIL,
                              ensemble=LBFGS_TILES)
    seconds = time.perf_counter() - t0
    return {"theta": np.exp(np.asarray(lbfgs.params[lbfgs.best])), "adam": adam, "lbfgs": lbfgs, "seconds": seconds}


def final_losses(solution: loopfuse.Solution) -> np.ndarray:
    """Each member's last recorded loss."""
    return solution.loss_history[np.arange(len(solution.steps)), solution.steps - 1]


def main() -> dict:
    found = fit()
    adam, lbfgs = found["adam"], found["lbfgs"]
    losses = final_losses(lbfgs)
    near = np.isclose(losses, losses[lbfgs.best], rtol=0.01)
    print(f"Adam:   {len(adam.steps)} members x {adam.steps.max()} steps (compiled in {adam.compile_seconds:.1f} s)")
    print(f"L-BFGS: {dict(zip(*np.unique(lbfgs.retcode, return_counts=True)))}, steps {lbfgs.steps.min()}.."
          f"{lbfgs.steps.max()} (median {np.median(lbfgs.steps):.0f}; compiled in {lbfgs.compile_seconds:.1f} s)")
    print(f"{near.sum()} of {len(losses)} starts reach the best loss {losses[lbfgs.best]:.3g}; the others stop at "
          f"{', '.join(f'{x:.3g}' for x in np.unique(np.round(losses[~near], 2)))}")
    print(f"{'parameter':>16} {'truth':>6} {'found':>8} {'error':>7}   (member {lbfgs.best})")
    for name, truth, value in zip(lv.NAMES, lv.TRUTH, found["theta"]):
        print(f"{name:>16} {truth:6.2f} {value:8.4f} {abs(value / truth - 1):7.2%}")
    print(f"total {found['seconds']:.1f} s (compiles included)")
    return found


if __name__ == "__main__":
    main()
