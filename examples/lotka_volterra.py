"""Recover the four Lotka-Volterra parameters from noisy observations: Adam, then L-BFGS.

The SciML parameter-estimation recipe: simulate the ODE with diffrax (Tsit5, adaptive steps,
saved at the observation times), fit the log-parameters by least squares with Adam to get close,
then L-BFGS to converge: two `minimize` calls, the second continuing from the first's `Solution`.
Every step (the ODE solve, its gradient, the optimizer, L-BFGS's line search, the convergence
test) runs inside loopfuse's compiled device loop.

    python examples/lotka_volterra.py
"""
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import loopfuse

NAMES = ("prey growth", "predation", "predator death", "predator growth")
TRUTH = np.array([1.5, 1.0, 3.0, 1.0])
START = np.array([1.2, 0.8, 2.8, 0.8])
TIMES = jnp.linspace(0.0, 10.0, 101)
ADAM = optax.adam(2e-2)
LBFGS = optax.lbfgs()
# float32 and an adaptive solver leave gradients of ~1e-4 at the optimum: stop when the loss stops changing
UNTIL = loopfuse.ftol(rtol=1e-6)


def vector_field(t, y, log_theta):
    a, b, c, d = jnp.exp(log_theta)            # fitted in log space: the rates stay positive
    prey, predator = y
    return jnp.stack([a * prey - b * prey * predator, -c * predator + d * prey * predator])


def simulate(log_theta):
    """Prey and predator populations at `TIMES`, shape [101, 2]."""
    return diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field), diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.05, y0=jnp.array([1.0, 1.0]),
        args=log_theta, saveat=diffrax.SaveAt(ts=TIMES),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6), max_steps=4096).ys


def observations(noise: float = 0.01, seed: int = 0):
    """The true trajectory plus Gaussian noise."""
    clean = simulate(jnp.log(TRUTH))
    return clean + noise * jax.random.normal(jax.random.key(seed), clean.shape)


def loss(log_theta, data):
    return jnp.mean((simulate(log_theta) - data) ** 2)


def estimate(adam_steps: int = 300, lbfgs_steps: int = 100) -> dict:
    """Fit the log-parameters from `START`: Adam, then L-BFGS continuing from Adam's `Solution`."""
    data = observations()
    t0 = time.perf_counter()
    adam = loopfuse.minimize(loss, jnp.log(START), data=data, optimizer=ADAM, steps=adam_steps)
    lbfgs = loopfuse.minimize(loss, adam, data=data, optimizer=LBFGS, steps=lbfgs_steps, until=UNTIL)
    seconds = time.perf_counter() - t0
    return {"theta": np.exp(np.asarray(lbfgs.params)), "adam": adam, "lbfgs": lbfgs, "seconds": seconds}


def main() -> dict:
    found = estimate()
    adam = found["adam"]
    print(f"Adam:   {adam.steps} steps, loss {adam.loss_history[0]:.3g} -> {adam.loss_history[-1]:.3g} "
          f"({adam.steps_per_second:.0f} steps/s, compiled in {adam.compile_seconds:.1f} s)")
    lbfgs = found["lbfgs"]
    print(f"L-BFGS: {lbfgs.steps} steps ({lbfgs.retcode}), loss {lbfgs.loss_history[0]:.3g} -> "
          f"{lbfgs.loss_history[-1]:.3g} (compiled in {lbfgs.compile_seconds:.1f} s)")
    print(f"{'parameter':>16} {'truth':>6} {'start':>6} {'found':>8} {'error':>7}")
    for name, truth, start, value in zip(NAMES, TRUTH, START, found["theta"]):
        print(f"{name:>16} {truth:6.2f} {start:6.2f} {value:8.4f} {abs(value / truth - 1):7.2%}")
    print(f"total {found['seconds']:.1f} s (compiles included)")
    return found


if __name__ == "__main__":
    main()
