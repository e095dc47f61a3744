"""One process of a two-process `jax.distributed` run on 127.0.0.1, for test_multihost.py.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
        python tests/py/multihost_worker.py PROCESS_ID NUM_PROCESSES PORT train|hold

Every process initializes jax.distributed (gloo CPU collectives, fail-fast timeouts), builds its
global arrays from its own shards (each process gives only its devices' batch rows), and trains
through loopfuse and through `jax.jit` with the same shardings. ``train`` prints one JSON line of
facts: per check and leaf, whether this process's shards of the two results are bitwise equal
(the two processes together cover every shard), and the loss history and (replicated) params for
the test to compare with a single-process run. Nothing here asserts. ``hold`` prints ``running``
after its first loop call and keeps training until a peer dies (test_multihost kills one), or
exits after HOLD_S. Exit status 77 with ``SKIP: <reason>`` on stdout: this platform has no gloo CPU collectives.

The training problem is defined at module level (importing this module touches no device), so
the test builds its single-process reference from the same definitions.
"""
import json
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax

HEARTBEAT_S = 5           # a peer silent this long is declared dead (jax's default: 100 s)
SHUTDOWN_S = 5            # how long exit waits for the other processes (default: 300 s)
INIT_S = 60               # how long initialize waits for every process to join (default: 300 s)
HOLD_S = 300              # `hold` gives up (exit status 1) if no peer has died by then: no orphans
SKIP_STATUS = 77

K = 3                     # steps per loop call
N = 16                    # global batch rows, split over the 4 global devices
DATA_SHAPE = (4, 16)      # (inputs, hidden units) for sharding="data"
PARAMS_SHAPE = (256, 1024)  # w is (256, 1024) f32 = 1 MiB: sharding="params" splits it
# eps keeps each update continuous in a near-zero gradient, whose sign the all-reduce order can flip
OPT = optax.adam(1e-3, eps=1e-3)


def train_step(state, batch):
    def loss_fn(p):
        h = jnp.tanh(batch["x"] @ p["w"] + p["b"])
        return jnp.mean((h @ p["v"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPT.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}


def host_state(shape) -> dict:
    """The same host values on every process (one seed)."""
    d_in, d_hidden = shape
    rng = np.random.default_rng(0)
    params = {"w": (rng.normal(size=(d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32),
              "b": np.zeros(d_hidden, np.float32),
              "v": (rng.normal(size=(d_hidden, 2)) / np.sqrt(d_hidden)).astype(np.float32)}
    return {"params": params, "opt": jax.tree_util.tree_map(np.asarray, OPT.init(params))}


def host_batch(shape) -> dict:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, shape[0])).astype(np.float32)
    return {"x": x, "y": np.sin(x[:, :2])}


def initialize(process_id: int, num_processes: int, port: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                               process_id=process_id, coordinator_bind_address=f"127.0.0.1:{port}",
                               initialization_timeout=INIT_S, heartbeat_timeout_seconds=HEARTBEAT_S,
                               shutdown_timeout_seconds=SHUTDOWN_S)
    try:
        jax.devices()  # creates the CPU client and its gloo collectives
    except Exception as e:
        if "gloo" not in str(e).lower():
            raise
        print(f"SKIP: no gloo CPU collectives on this platform: {e}", flush=True)
        sys.exit(SKIP_STATUS)


def leaves(tree) -> dict:
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shards_equal(a, b) -> dict:
    """Per leaf path: same sharding, and this process's shards of `a` and `b` are bitwise equal."""
    def equal(x, y) -> bool:
        if x.sharding != y.sharding:
            return False
        xs, ys = (sorted(t.addressable_shards, key=lambda s: s.device.id) for t in (x, y))
        return all(np.array_equal(np.asarray(s.data), np.asarray(t.data)) for s, t in zip(xs, ys))
    b = leaves(b)
    return {path: equal(x, b[path]) for path, x in leaves(a).items()}


class Run:
    """The global mesh over every process's devices, and global arrays built from local shards."""

    def __init__(self):
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        self.devices = jax.devices()      # every process's devices, in the same order everywhere
        mesh = Mesh(np.array(self.devices), ("data",))
        self.replicated, self.split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def batch(self, batch: dict):
        """Each process contributes only the rows of its own devices."""
        rows = N // jax.process_count()
        mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        return jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(self.split, a[mine]), batch)

    def state_shardings(self, state, mode: str):
        """loopfuse's placement rule: "params" splits leaves of >= 1 MiB along a divisible leading axis."""
        def one(a):
            big = a.nbytes >= 1 << 20 and a.ndim and a.shape[0] % len(self.devices) == 0
            return self.split if mode == "params" and big else self.replicated
        return jax.tree_util.tree_map(one, state)

    @staticmethod
    def state(state, shardings):
        """Each process fills only its addressable shards."""
        return jax.tree_util.tree_map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]),
                                      state, shardings)

    def jit_steps(self, state, batch, shardings, k: int):
        """`k` calls of jax.jit(train_step) with the same shardings: (state, stacked losses)."""
        step = jax.jit(train_step, in_shardings=(shardings, self.split), out_shardings=(shardings, self.replicated))
        losses = []
        for _ in range(k):
            state, aux = step(state, batch)
            losses.append(aux["loss"])
        return state, jnp.stack(losses)


def check_steps(run: Run, mode: str, shape, single_steps: bool = True, fit_steps: int = 0) -> dict:
    """loop(K) (and optionally K single steps and fit) against calls of jax.jit, shard by shard."""
    import loopfuse
    host, batch = host_state(shape), run.batch(host_batch(shape))
    shardings = run.state_shardings(host, mode)
    ref_state, ref_losses = run.jit_steps(run.state(host, shardings), batch, shardings, K)
    step = loopfuse.compile_step(train_step, devices=run.devices, sharding=mode)
    loop_state, loop_aux = step.loop(K)(run.state(host, shardings), batch)
    facts = {"loop": shards_equal(loop_state, ref_state), "loop_loss": shards_equal(loop_aux["loss"], ref_losses),
             "specs": {p: str(x.sharding.spec) for p, x in leaves(loop_state).items()},
             "fully_addressable": [p for p, x in leaves(loop_state).items() if x.is_fully_addressable],
             "losses": np.asarray(loop_aux["loss"]).tolist(),     # replicated: every process holds it
             "params": {p: np.asarray(x).tolist() for p, x in leaves(loop_state["params"]).items()
                        if x.is_fully_replicated}}
    if single_steps:
        state, losses = run.state(host, shardings), []
        for _ in range(K):
            state, aux = step(state, batch)
            losses.append(aux["loss"])
        facts["step"] = shards_equal(state, ref_state)
        facts["step_loss"] = shards_equal(jnp.stack(losses), ref_losses)
    if fit_steps:  # whole chunks of K: fit reuses loop(K)'s executable
        ref_state, ref_losses = run.jit_steps(run.state(host, shardings), batch, shardings, fit_steps)
        result = loopfuse.fit(step, run.state(host, shardings), batch, fit_steps, chunk=K, progress=False)
        facts["fit"] = shards_equal(result.state, ref_state)
        facts["fit_history"] = bool(np.array_equal(result.history["loss"], np.asarray(ref_losses)))
        facts["fit_steps"] = result.steps
    return facts


def train(run: Run) -> dict:
    facts = {"process_index": jax.process_index(), "process_count": jax.process_count(),
             "device_count": jax.device_count(), "local_device_count": jax.local_device_count()}
    checks = {"data": lambda: check_steps(run, "data", DATA_SHAPE, fit_steps=2 * K),
              "params": lambda: check_steps(run, "params", PARAMS_SHAPE, single_steps=False)}
    for name, check in checks.items():
        try:
            facts[name] = check()
        except Exception as e:  # reported, asserted on by the test
            facts[name] = {"exception": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
    return facts


def quadratic(x, h):
    return 0.5 * jnp.sum(h * x * x)


def converged(params, loss):
    return loss < 1e-6


def ensemble(run: Run) -> dict:
    """minimize(ensemble=True) with 8 members split over the 4 devices of both processes (each compacting
    its 2), against the same ensemble run by this process alone on one of its devices."""
    import loopfuse
    from loopfuse import CompiledLoop, Ensemble, per_member
    from jax.experimental import multihost_utils
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(8, 4)).astype(np.float32)
    h = (np.geomspace(0.01, 1.0, 8)[:, None] * np.ones((1, 4))).astype(np.float32)
    kwargs = dict(optimizer=optax.sgd(1.0), steps=1000, until=converged, ensemble=Ensemble(tile=1))
    split = run.state(x0, run.split)                       # each process fills its devices' members
    sol = loopfuse.minimize(quadratic, split, per_member(run.state(h, run.replicated)),
                            backend=CompiledLoop(steps=100, devices=run.devices), **kwargs)
    alone = loopfuse.minimize(quadratic, x0, per_member(h), backend=CompiledLoop(steps=100, devices=jax.local_devices()[:1]),
                              **kwargs)
    params = np.asarray(multihost_utils.process_allgather(sol.params, tiled=True))
    return {"steps": sol.steps.tolist(), "alone_steps": alone.steps.tolist(), "retcode": sol.retcode.tolist(),
            "params_bitwise": params.tobytes() == np.asarray(alone.params).tobytes(),
            "history_bitwise": sol.loss_history.tobytes() == alone.loss_history.tobytes(),
            "history_rel": float(np.nanmax(np.abs(sol.loss_history - alone.loss_history)
                                           / np.nanmax(np.abs(alone.loss_history), axis=1, keepdims=True))),
            "fully_addressable": sol.params.is_fully_addressable}


def hold(run: Run) -> None:
    import loopfuse
    host = host_state(DATA_SHAPE)
    shardings = run.state_shardings(host, "data")
    state, batch = run.state(host, shardings), run.batch(host_batch(DATA_SHAPE))
    loop = loopfuse.compile_step(train_step, devices=run.devices, sharding="data").loop(10)
    state, _ = loop(state, batch)
    jax.block_until_ready(state)
    print("running", flush=True)
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        state, _ = loop(state, batch)
        jax.block_until_ready(state)
    sys.exit(f"no peer died within {HOLD_S} s")


def main(process_id: int, num_processes: int, port: int, mode: str) -> None:
    initialize(process_id, num_processes, port)
    run = Run()
    if mode == "hold":
        hold(run)
    elif mode == "ensemble":
        try:
            print(json.dumps(ensemble(run)), flush=True)
        except Exception as e:  # reported, asserted on by the test
            print(json.dumps({"exception": type(e).__name__, "traceback": traceback.format_exc()}), flush=True)
    else:
        print(json.dumps(train(run)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
