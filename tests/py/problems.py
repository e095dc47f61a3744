"""Small training problems shared by the tests (an MLP regression with any optax optimizer, a
least-squares fit for `minimize`, a slow step to interrupt) and the tree comparisons they assert with:
`assert_trees_equal` (bitwise) and `assert_trees_close`; `stack_trees`; `interrupted_runs`, runs a real SIGINT ends;
`progress_bar_updates`, what a tqdm bar showed; `policy_work`, the member steps an ensemble's tiles compute."""
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import loopfuse
from loopfuse.passes import ModulePass
from loopfuse.passes.functions import last_op, main_func
from loopfuse import MemoryStats


# jaxlib 0.11+ ships an XLA that compiles some steps inside a loop to other last bits than 0.10's
NEWER_XLA = tuple(map(int, jax.__version__.split(".")[:2])) >= (0, 11)
# jaxlib 0.12.1's XLA:CPU compiles a while loop whose iteration reads and writes under 1 KiB as one kernel
# (SmallWhileLoopHoistingPass), summing reductions otherwise than the kernels of a lone step or of a larger loop
SMALL_LOOP_KERNELS = tuple(map(int, jax.__version__.split(".")[:3])) >= (0, 12, 1)

class Layer(NamedTuple):
    w: jax.Array
    b: jax.Array


def mlp_params(sizes=(4, 8, 1), seed=0):
    """Nested pytree: {"layers": [Layer(w, b), ...], "scale": (array,)}."""
    rng = np.random.default_rng(seed)
    layers = [Layer(jnp.asarray(rng.normal(size=(a, b)).astype(np.float32) / np.sqrt(a)), jnp.zeros((b,), jnp.float32))
              for a, b in zip(sizes[:-1], sizes[1:])]
    return {"layers": layers, "scale": (jnp.ones((), jnp.float32),)}


def mlp_loss(params, batch):
    h = batch["x"]
    for i, layer in enumerate(params["layers"]):
        h = h @ layer.w + layer.b
        if i < len(params["layers"]) - 1:
            h = jnp.tanh(h)
    return jnp.mean((params["scale"][0] * h - batch["y"]) ** 2)


def batch(n=16, d_in=4, d_out=1, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, d_in)).astype(np.float32), "y": rng.normal(size=(n, d_out)).astype(np.float32)}


def train_step(opt: optax.GradientTransformation, loss=mlp_loss):
    """fn(state, batch) -> ((params, opt_state), {"loss", "grads"})."""
    def step(state, batch):
        params, opt_state = state
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value, "grads": grads}
    return step


def fori_solve(loss, opt: optax.GradientTransformation, steps: int):
    """The hand-written reference of a `minimize` solve: jax.jit of a lax.fori_loop of `steps` steps of `opt` on
    ``loss(params, data)``, ``(params, data) -> (params, loss history)``, the data an argument."""
    @jax.jit
    def run(params, data):
        def body(i, carry):
            p, s, history = carry
            value, grads = jax.value_and_grad(loss)(p, data)
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s, history.at[i].set(value)
        p, _, history = jax.lax.fori_loop(0, steps, body, (params, opt.init(params), jnp.zeros(steps)))
        return p, history
    return run


def init_state(opt, params=None):
    params = mlp_params() if params is None else params
    return params, opt.init(params)


def lsq_data(n=64, d=3, seed=0):
    """(x, y) of a linear regression with 3 features and an offset of 0.5."""
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n, d))
    return x, x @ jax.random.normal(kw, (d,)) + 0.5


def lsq_loss(p, batch):
    x, y = batch
    return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)


LSQ_PARAMS = {"w": jnp.zeros(3), "b": jnp.zeros(())}


def between(losses, n):
    """A threshold that the loss of step n (1-based) is the first to go below, with a wide margin."""
    return float(losses[n - 2] + losses[n - 1]) / 2


def slow_step(state, batch):
    """A few ms per step, so that a chunk is in flight most of the time."""
    w, x = state
    for _ in range(4):
        x = jnp.tanh(x @ w + batch)
    return (w, x), {"s": jnp.sum(x)}


def slow_state():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(128, 128)).astype(np.float32) / 12), jnp.ones((128, 128), jnp.float32))


def interrupted_runs(run, rounds: int, seed: int):
    """``run(10**4, state)`` from a fresh `slow_state` `rounds` times, each with a real SIGINT (os.kill
    from a timer thread) at a random moment within the time of 60 steps: yields each FitResult (one
    that landed before the first chunk ran is a result of 0 steps with the state passed in). Needs
    SIGINT to raise KeyboardInterrupt (the `sigint_raises` fixture)."""
    run(60, slow_state())              # compiles
    t0 = time.perf_counter()
    run(60, slow_state())
    window = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        state = slow_state()
        timer = threading.Timer(rng.uniform(0, window), os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            result = run(10**4, state)
        except KeyboardInterrupt:      # landed before the first chunk ran: then nothing may be consumed
            result = loopfuse.FitResult(state, None, 0, "interrupted")
        timer.join()
        yield result


def vmapped_in_tiles(fn, members, data, own: bool, tile: int | None = None):
    """``jax.jit(jax.vmap(fn))(members, data)``, `tile` members at a time (all at once without one): the
    ensembles' references. `members`' leaves lead with the member axis, `data`'s too when `own`; the
    tiles' outputs are concatenated on the host."""
    n = jax.tree_util.tree_leaves(members)[0].shape[0]
    tile = tile or n
    go = jax.jit(jax.vmap(fn, in_axes=(0, 0 if own else None)))
    rows = lambda tree, a: jax.tree_util.tree_map(lambda x: x[a:a + tile], tree)  # noqa: E731
    parts = [go(rows(members, a), rows(data, a) if own else data) for a in range(0, n, tile)]
    return jax.tree_util.tree_map(lambda *x: np.concatenate(x), *parts)


def policy_work(steps, tile: int) -> int:
    """The member steps the tiles compute (the stopped ones too) for members that run `steps`: each step
    ``ceil(live / tile)`` tiles, `live` the members running at the last compaction, which runs after a
    step when the running members fit in fewer tiles (`loopfuse.drivers.ensemble`'s policy, written again)."""
    steps, live, work = np.asarray(steps), len(steps), 0
    for i in range(steps.max()):
        tiles = -(-live // tile)
        work += tiles * tile
        running = int((steps > i + 1).sum())
        if -(-running // tile) < tiles:
            live = running
    return work


def stack_trees(trees):
    """Alike pytrees as one, each leaf the trees' leaves stacked along a new leading axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def fresh(tree):
    """A deep device copy (so a donating call cannot consume the original)."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def assert_trees_equal(a, b):
    """`a` and `b` have the same tree structure and bitwise the same leaves (dtype, shape and bytes:
    NaN payloads and the sign of zero count)."""
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, f"tree structures differ: {ta} vs {tb}"
    for (path, x), y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        where = jax.tree_util.keystr(path) or "leaf"
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f"{where}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        assert x.tobytes() == y.tobytes(), f"{where} differs bitwise:\n{x}\nvs\n{y}"


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    """`a` and `b` have the same tree structure and leaves equal within `rtol`/`atol` (a failure names the leaf)."""
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, f"tree structures differ: {ta} vs {tb}"
    for (path, x), y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def adam_mlp_8x1024(with_grads: bool = False):
    """The memory benchmarks' problem, abstract (to compile, never run): 8 x 1024x1024 tanh layers,
    Adam, batch 64. Aux is the loss, or ``{"loss", "grads"}`` with `with_grads`."""
    opt = optax.adam(1e-3)

    def fn(state, b):
        params, opt_state = state

        def loss(p):
            h = b["x"]
            for w in p[:-1]:
                h = jnp.tanh(h @ w)
            return jnp.mean((h @ p[-1] - b["y"]) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value, "grads": grads} if with_grads else value

    params = [jax.ShapeDtypeStruct((1024, 1024), jnp.float32) for _ in range(8)]
    state = (params, jax.eval_shape(opt.init, params))
    b = {"x": jax.ShapeDtypeStruct((64, 1024), jnp.float32), "y": jax.ShapeDtypeStruct((64, 1024), jnp.float32)}
    return fn, state, b


def jit_memory(fn, *args):
    """The compiled memory of undonated ``jax.jit(fn)`` on `args`, as loopfuse reports its own."""
    return MemoryStats.from_analysis(jax.jit(fn).lower(*args).compile().memory_analysis())


def progress_bar_updates(err: str, total: int) -> list[tuple[int, str]]:
    """(steps done, postfix) of each distinct refresh of a tqdm bar over `total` steps in stderr `err` (tqdm
    pads a refresh shorter than the one before with spaces)."""
    updates = re.findall(rf"(\d+)/{total} \[[^,\]]*, [^,\]]*step/s(?:, ([^\]]*))?\] *(?=[\r\n]|$)", err)
    return list(dict.fromkeys((int(n), postfix) for n, postfix in updates))


@dataclass(frozen=True)
class NegateFirstResult(ModulePass):
    """A deliberately wrong pass: @main returns the negation of its first result."""

    name = "negate-first-result"
    summary = "wrong on purpose (tests only)"

    def apply(self, module_op) -> None:
        ret = last_op(main_func(module_op).body.blocks[0])
        with ir.InsertionPoint(ret), ret.location:
            ret.operands[0] = stablehlo.NegOp(ret.operands[0]).result
