"""Ensembles over 4 CPU devices, for test_ensemble.py's multi-device tests, run in a fresh process.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python tests/py/ensemble_multidevice_check.py

(jax fixes its device count at its first import.) Prints one JSON object of facts: whether each run
over the devices is bitwise the single-device run, where its members live, the errors raised.
"""
import json
import os
import sys
import traceback

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import CompiledLoop, Ensemble, per_member  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ensemble import ROSENBROCK_STARTS, below, quadratic, quadratics, rosenbrock  # noqa: E402
from problems import batch, mlp_params, stack_trees, train_step  # noqa: E402


def same(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


def spread(x) -> int:
    """On how many devices `x`'s shards hold distinct members."""
    return len({tuple(s.index[0].indices(x.shape[0])) for s in x.addressable_shards})


def check_minimize() -> dict:
    x0, h = quadratics(n=16)
    kwargs = dict(optimizer=optax.sgd(1.0), steps=240, until=below(1e-6), ensemble=Ensemble(tile=2))
    one = loopfuse.minimize(quadratic, x0, per_member(h), backend=CompiledLoop(steps=64), **kwargs)
    four = loopfuse.minimize(quadratic, x0, per_member(h), backend=CompiledLoop(steps=64, devices=jax.devices()), **kwargs)
    return dict(bitwise=same((one.params, one.loss_history, one.steps), (four.params, four.loss_history, four.steps)),
                retcodes_equal=one.retcode.tolist() == four.retcode.tolist(), devices_holding_params=spread(four.params),
                retcodes=sorted(set(four.retcode.tolist())))


def check_lbfgs() -> dict:
    starts = jnp.concatenate([ROSENBROCK_STARTS, ROSENBROCK_STARTS[:2] + 0.1])     # 8 members, 2 per device
    # the same tiles on both (README: bitwise the single-device run of the same tiles); the default tile is
    # read per device's share of the members, so it differs between one device and four
    kwargs = dict(optimizer=optax.lbfgs(), steps=200, until=loopfuse.gtol(1e-4), ensemble=Ensemble(tile=2))
    one = loopfuse.minimize(rosenbrock, starts, **kwargs)
    four = loopfuse.minimize(rosenbrock, starts, backend=CompiledLoop(devices=jax.devices()), **kwargs)
    return dict(bitwise=same((one.params, one.loss_history, one.steps), (four.params, four.loss_history, four.steps)),
                steps=four.steps.tolist(), steps_apart=int(np.max(np.abs(one.steps - four.steps))),
                params_apart=float(np.max(np.abs(np.asarray(one.params) - np.asarray(four.params)))),
                retcodes_equal=one.retcode.tolist() == four.retcode.tolist())


def check_fit() -> dict:
    sweep = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)

    def state():
        params = stack_trees([mlp_params(seed=s) for s in range(8)])
        opt_state = jax.vmap(sweep.init)(params)
        opt_state.hyperparams["learning_rate"] = jnp.asarray([0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0])
        return params, opt_state
    kwargs = dict(chunk=16, progress=False, until=lambda s, aux: aux["loss"] < 0.3, stop_on_nonfinite=True,
                  ensemble=Ensemble(tile=1))
    one = loopfuse.fit(loopfuse.compile_step(train_step(sweep), keep_aux=("loss",)), state(), batch(), 60, **kwargs)
    step = loopfuse.compile_step(train_step(sweep), keep_aux=("loss",), devices=jax.devices())
    four = loopfuse.fit(step, state(), batch(), 60, **kwargs)
    return dict(bitwise=same((one.state, one.history["loss"], one.steps), (four.state, four.history["loss"], four.steps)),
                retcodes_equal=one.retcode.tolist() == four.retcode.tolist(),
                devices_holding_params=spread(jax.tree_util.tree_leaves(four.state)[0]))


def check_errors() -> dict:
    out = {}
    for name, call in {
        "uneven": lambda: loopfuse.minimize(quadratic, jnp.zeros((6, 2)), jnp.ones(2), steps=2, ensemble=True,
                                            backend=CompiledLoop(devices=jax.devices())),
        "sharding": lambda: loopfuse.minimize(quadratic, jnp.zeros((8, 2)), jnp.ones(2), steps=2, ensemble=True,
                                              backend=CompiledLoop(devices=jax.devices(), sharding="data")),
    }.items():
        try:
            call()
            out[name] = None
        except Exception as e:        # noqa: BLE001  (the test asserts on the message)
            out[name] = f"{type(e).__name__}: {e}"
    return out


def main() -> None:
    facts = {"device_count": jax.device_count()}
    for name, check in (("minimize", check_minimize), ("lbfgs", check_lbfgs), ("fit", check_fit),
                        ("errors", check_errors)):
        try:
            facts[name] = check()
        except Exception:             # noqa: BLE001  (reported, the test fails on it)
            facts[name] = {"exception": traceback.format_exc()}
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
