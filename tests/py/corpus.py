"""A differential corpus: small programs that real users run, each a training step
``fn(state, batch) -> (new_state, aux)`` (state updated by an optax optimizer, aux holds "loss").

`PROGRAMS` maps a name to a builder (nothing heavy runs at import); a builder returns a `Program`
that also records the reference its ``loop(K)`` must equal bitwise: K ``jax.jit`` steps, or where
XLA compiles the loop body differently from a lone step, ``jax.jit`` of a hand-written ``lax.scan``.
`DEFAULT` names the programs the opt-in options' corpus tests run by default (`marked`).
`REGION_ANALYSIS_UNSAFE` names the programs whose ``jax.jit`` result XLA changes under forced
region-analysis copy insertion (``xla_cpu_copy_insertion_use_region_analysis``), and
`REGION_ANALYSIS_UNSAFE_LOOPS` those whose loop it changes: the programs the copy-free loop carry must
not reach. `region_analysis_triggers` are the smallest such programs found.
"""
from typing import Any, Callable, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimistix as optx
import pytest
from jax import lax

from problems import NEWER_XLA, init_state, train_step


class Program(NamedTuple):
    fn: Callable
    state: Any
    batch: Any
    loop_reference: str = "steps"   # "steps": K jax.jit steps; "scan": jax.jit of a hand-written lax.scan


def _rng(seed=0):
    return np.random.default_rng(seed)


def _normal(rng, *shape, scale=1.0):
    return jnp.asarray((scale * rng.normal(size=shape)).astype(np.float32))


def _fit(loss, params, batch, opt=None, **kw) -> Program:
    """A `Program` stepping `params` by `opt` (default Adam 1e-2) on ``loss(params, batch)``."""
    opt = optax.adam(1e-2) if opt is None else opt
    return Program(train_step(opt, loss), init_state(opt, params), batch, **kw)


# --- diffrax: the Lotka-Volterra parameter fit of issue 20, in its variants ---------------------

def _lotka_volterra(t, y, th):
    a, b, c, d = jnp.exp(th)
    x, z = y
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


def _lv_fit(saveat, controller=None, solver=diffrax.Tsit5(), adjoint=None, **kw) -> Program:
    extra = {} if adjoint is None else {"adjoint": adjoint}

    def solve(th):
        return diffrax.diffeqsolve(diffrax.ODETerm(_lotka_volterra), solver, 0.0, 2.0, 0.25,
                                   jnp.array([1.0, 1.0]), args=th, saveat=saveat, max_steps=16, throw=False,
                                   stepsize_controller=controller or diffrax.ConstantStepSize(), **extra).ys

    def loss(th, data):
        return jnp.mean((solve(th) - data) ** 2)

    data = solve(jnp.log(jnp.array([1.5, 1.0, 3.0, 1.0])))
    return _fit(loss, jnp.log(jnp.array([1.2, 0.8, 2.8, 0.8])), data, **kw)


def diffrax_pid_saveat_ts() -> Program:
    """Tsit5 + PIDController + SaveAt(ts): the issue's reproducer, shortened."""
    return _lv_fit(diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)), diffrax.PIDController(rtol=1e-4, atol=1e-4))


def diffrax_constant_saveat_ts() -> Program:
    """Tsit5, constant step, SaveAt(ts)."""
    return _lv_fit(diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)))


def diffrax_saveat_t1() -> Program:
    """Euler (cheaper to compile than Tsit5), constant step, SaveAt(t1=True): no save loop."""
    return _lv_fit(diffrax.SaveAt(t1=True), solver=diffrax.Euler())


def diffrax_backsolve() -> Program:
    """Heun + PIDController, SaveAt(t1=True), gradients by BacksolveAdjoint (an adjoint solve)."""
    return _lv_fit(diffrax.SaveAt(t1=True), diffrax.PIDController(rtol=1e-4, atol=1e-4), diffrax.Heun(),
                   diffrax.BacksolveAdjoint(), loop_reference="scan")


# --- optimistix inside a loss -------------------------------------------------------------------

def optimistix_root_find() -> Program:
    """Fit `p` so that the root of ``y**3 + p0*y - p1`` (Newton) matches targets."""
    def loss(p, target):
        fn = lambda y, args: y ** 3 + args[0] * y - args[1]
        root = optx.root_find(fn, optx.Newton(rtol=1e-5, atol=1e-5), jnp.ones(3), args=p, max_steps=16,
                              throw=False).value
        return jnp.mean((root - target) ** 2)
    return _fit(loss, jnp.array([1.0, 2.0]), jnp.array([0.5, 0.8, 1.1]), loop_reference="scan")


def optimistix_minimise() -> Program:
    """Fit `p` so that the minimiser (BFGS) of a shifted quadratic-plus-quartic matches targets."""
    def loss(p, target):
        fn = lambda y, args: jnp.sum((y - args) ** 2 + 0.1 * y ** 4)
        y = optx.minimise(fn, optx.BFGS(rtol=1e-5, atol=1e-5), jnp.zeros(3), args=p, max_steps=32,
                           throw=False).value
        return jnp.mean((y - target) ** 2)
    return _fit(loss, jnp.array([0.3, -0.2, 0.5]), jnp.array([0.5, 0.8, 1.1]))


# --- loops ----------------------------------------------------------------------------------------

def loops_dynamic_update_slice() -> Program:
    """scan, fori_loop and while_loop each writing rows of a buffer with dynamic_update_slice (the
    while_loop on stop_gradient(w): reverse mode does not go through a while_loop)."""
    def loss(w, x):
        def rows(w):
            return lambda i, buf: lax.dynamic_update_slice(buf, jnp.tanh(x[i] @ w)[None], (i, 0))
        a = lax.fori_loop(0, x.shape[0], rows(w), jnp.zeros((x.shape[0], w.shape[1])))
        b = lax.while_loop(lambda c: c[0] < x.shape[0], lambda c: (c[0] + 1, rows(lax.stop_gradient(w))(*c)),
                           (0, jnp.zeros_like(a)))[1]
        c = lax.scan(lambda buf, i: (rows(w)(i, buf), None), jnp.zeros_like(a), jnp.arange(x.shape[0]))[0]
        return jnp.mean(a * b + c ** 2)
    rng = _rng(1)
    return _fit(loss, _normal(rng, 4, 3), _normal(rng, 6, 4), loop_reference="scan")


def nested_scans() -> Program:
    """An inner scan reads the outer scan's carry `h` while the outer body also computes the next
    `h` from it: the structure of `region_analysis_triggers`."""
    def loss(w, x):
        def outer(carry, xs):
            h, total = carry
            inner, _ = lax.scan(lambda a, xi: (a + jnp.sum(jnp.tanh(h * xi)), None), 0.0, xs)
            return (jnp.tanh(h @ w + xs.sum(0)), total + inner), None
        (h, total), _ = lax.scan(outer, (jnp.zeros(w.shape[0]), 0.0), x)
        return jnp.sum(h ** 2) + total
    rng = _rng(2)
    return _fit(loss, _normal(rng, 4, 4, scale=0.5), _normal(rng, 3, 5, 4))


def cond_switch() -> Program:
    def loss(w, x):
        branches = [lambda v: jnp.sin(v @ w), lambda v: jnp.tanh(v @ w), lambda v: (v @ w) ** 2]
        per_row = jax.vmap(lambda v, i: lax.switch(i, branches, v))(x, jnp.arange(x.shape[0]) % 3)
        scale = lax.cond(jnp.sum(w) > 0, lambda: 1.0 + jnp.sum(w ** 2), lambda: 1.0 - jnp.sum(w))
        return jnp.mean(per_row) * scale
    rng = _rng(3)
    return _fit(loss, _normal(rng, 4, 2), _normal(rng, 6, 4), loop_reference="scan")


def sort_top_k() -> Program:
    def loss(w, x):
        h = x @ w
        top, _ = lax.top_k(h, 3)
        return jnp.mean(top ** 2) + jnp.mean(jnp.sort(h, axis=0)[:2])
    rng = _rng(4)
    return _fit(loss, _normal(rng, 4, 8), _normal(rng, 6, 4))


def segment_sum_scatter_add() -> Program:
    def loss(table, batch):
        ids, seg, y = batch
        emb = table[ids]                                              # gather; its gradient is a scatter-add
        pooled = jax.ops.segment_sum(emb, seg, num_segments=3)
        hist = jnp.zeros(3).at[seg].add(jnp.sum(emb, axis=1))         # explicit scatter-add
        return jnp.mean((pooled.sum(axis=1) + hist - y) ** 2)
    rng = _rng(5)
    ids = jnp.array([0, 3, 3, 7, 1, 2, 7, 5], jnp.int32)
    seg = jnp.array([0, 0, 1, 1, 1, 2, 2, 2], jnp.int32)
    # jaxlib 0.12.1's XLA:CPU compiles a loop whose iteration reads and writes under 1 KiB as one kernel
    # (SmallWhileLoopHoistingPass), which sums the loss's reductions otherwise than a lone step's kernels:
    # the loop, jax's scan as loopfuse's, is 1 ulp off K jitted steps
    return _fit(loss, _normal(rng, 8, 4), (ids, seg, _normal(rng, 3)), loop_reference="scan")


@jax.custom_vjp
def _clipped_square(x):
    return x ** 2


_clipped_square.defvjp(lambda x: (x ** 2, x), lambda x, g: (jnp.clip(2 * x * g, -1.0, 1.0),))


def custom_vjp() -> Program:
    def loss(w, x):
        return jnp.mean(_clipped_square(x @ w - 1.0))
    rng = _rng(6)
    return _fit(loss, _normal(rng, 4, 3), _normal(rng, 6, 4))


def rnn() -> Program:
    """An Elman RNN over a short sequence (lax.scan), last hidden state regressed on a target."""
    def loss(p, batch):
        xs, y = batch
        h, _ = lax.scan(lambda h, x: (jnp.tanh(h @ p["wh"] + x @ p["wx"] + p["b"]), None), jnp.zeros((2, 8)), xs)
        return jnp.mean((h @ p["wo"] - y) ** 2)
    rng = _rng(7)
    params = {"wh": _normal(rng, 8, 8, scale=0.3), "wx": _normal(rng, 3, 8, scale=0.5), "b": jnp.zeros(8),
              "wo": _normal(rng, 8, 1, scale=0.3)}
    return _fit(loss, params, (_normal(rng, 5, 2, 3), _normal(rng, 2, 1)), loop_reference="scan")


def transformer_adamw() -> Program:
    """A decoder-only transformer (2 layers, width 32, 2 heads, causal attention, tied embeddings)
    trained with optax.adamw on next-token prediction."""
    vocab, width, heads, seq = 16, 32, 2, 8
    rng = _rng(8)

    def layer():
        return {"qkv": _normal(rng, width, 3 * width, scale=width ** -0.5),
                "out": _normal(rng, width, width, scale=width ** -0.5),
                "up": _normal(rng, width, 2 * width, scale=width ** -0.5),
                "down": _normal(rng, 2 * width, width, scale=(2 * width) ** -0.5),
                "ln1": jnp.ones(width), "ln2": jnp.ones(width)}

    def norm(x, g):
        return g * (x - x.mean(-1, keepdims=True)) * lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)

    def loss(p, tokens):
        x = p["embed"][tokens[:, :-1]] + p["pos"]
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        for l in p["layers"]:
            q, k, v = jnp.split(norm(x, l["ln1"]) @ l["qkv"], 3, axis=-1)
            split = lambda t: t.reshape(*t.shape[:-1], heads, width // heads)
            att = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / np.sqrt(width // heads)
            att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", att, split(v)).reshape(x.shape) @ l["out"]
            x = x + jax.nn.gelu(norm(x, l["ln2"]) @ l["up"]) @ l["down"]
        logits = x @ p["embed"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    params = {"embed": _normal(rng, vocab, width, scale=0.1), "pos": _normal(rng, seq, width, scale=0.1),
              "layers": [layer(), layer()]}
    tokens = jnp.asarray(rng.integers(0, vocab, size=(4, seq + 1)).astype(np.int32))
    return _fit(loss, params, tokens, optax.adamw(1e-2, weight_decay=1e-2), loop_reference="scan")


def batchnorm_state() -> Program:
    """An MLP with batch normalisation whose running mean and variance live in the state pytree
    (updated by the step beside the optax update), aux holds "loss" and the batch statistics."""
    opt = optax.sgd(0.1, momentum=0.9)

    def forward(w, x):
        h = x @ w["w1"]
        return h, h.mean(0), h.var(0)

    def step(state, batch):
        params, opt_state, running = state
        x, y = batch

        def loss(w):
            h, mean, var = forward(w, x)
            h = jnp.tanh((h - mean) * lax.rsqrt(var + 1e-5))
            return jnp.mean((h @ w["w2"] - y) ** 2), (mean, var)
        (value, (mean, var)), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        running = jax.tree_util.tree_map(lambda r, s: 0.9 * r + 0.1 * s, running, {"mean": mean, "var": var})
        return (optax.apply_updates(params, updates), opt_state, running), {"loss": value, "mean": mean}

    rng = _rng(9)
    params = {"w1": _normal(rng, 4, 6), "w2": _normal(rng, 6, 1, scale=0.4)}
    state = (params, opt.init(params), {"mean": jnp.zeros(6), "var": jnp.ones(6)})
    return Program(step, state, (_normal(rng, 8, 4), _normal(rng, 8, 1)))


def in_place_update() -> Program:
    """A step that updates a tensor in place (a dynamic_update_slice) and also reduces it, beside an integer, a
    bool and a scalar leaf (found by a random-program fuzzer): under forced region analysis, jaxlib 0.10's XLA
    compiles its loop to other last bits than both K jitted steps and jax.jit's scan (the gate:
    `control_flow.own_in_place_updates`)."""
    def step(state, b):
        a, w, m, s = state
        i3 = a * 3
        v = i3.astype(jnp.float32) * jnp.mean(w * s) * w
        out = lax.dynamic_update_slice(v, v[:1] * 3, (jnp.sum(i3),))
        return (a + i3, w * 0.5 + b * 0.5, m ^ m, s * 0.5 + jnp.sum(v) * 0.5), {"loss": jnp.sum(out)}
    state = (jnp.array([39, 7, 29], jnp.int32), jnp.array([-0.9799137711524963, -0.20811158418655396, 2.203967332839966],
                                                          jnp.float32),
             jnp.array([False, True, False, False]), jnp.float32(1.1225545406341553))
    return Program(step, state, jnp.float32(0.3817202150821686), loop_reference="scan")


def region_analysis_triggers() -> dict:
    """The smallest programs found whose ``jax.jit`` result XLA:CPU changes under forced
    ``xla_cpu_copy_insertion_use_region_analysis``: name -> ``(fn, args, donate_argnums, expected)``
    with `expected` what ``fn(*args)`` computes (with the option: the read sees ``i + 1``).

    The structure: a while loop reads a value `i` that it does not change (carried through, here
    into its condition) while the enclosing computation overwrites `i`'s buffer in place with a new
    value (``i + 1``): an element of an enclosing loop's carry that the enclosing body updates
    ("nested"), or a donated parameter whose buffer holds an output ("donated"). Region analysis
    drops the copy of `i` into the inner loop and instead orders the in-place write after the loop
    with a control dependency; XLA:CPU's SmallWhileLoopHoistingPass then outlines the (small) loop
    into a ``call`` tagged ``xla_cpu_small_call`` and drops that control dependency
    (``SafelyDropAllControlDependencies``), so the write may be scheduled before the loop runs and
    the loop reads ``i + 1``. Scans and fori_loops (while loops) nested in a while or a scan do the
    same; a cond/switch in a loop does not; a loop too large to be outlined keeps its ordering.
    diffrax's solve is the nested case: its save loop and its Runge-Kutta stage loop (small while
    loops) read the step loop's old `y` and `t`, which the step loop's body also updates."""
    def nested(n):
        def body(carry):
            i, _ = carry
            return i + 1, lax.while_loop(lambda j: j < i, lambda j: j + 1, 0)
        return lax.while_loop(lambda carry: carry[0] < n, body, (0, 0))[1]

    def donated(i):
        return i + 1, lax.while_loop(lambda j: j < i, lambda j: j + 1, 0)

    return {"nested": (nested, (5,), (), 4), "donated": (donated, (5,), (0,), (6, 5))}


# nested_scans has the trigger's structure too; jaxlib 0.10's XLA miscompiles it under the option, later
# ones happen to schedule it safely (the gate turns the option off for it on every version).
REGION_ANALYSIS_UNSAFE = ("diffrax_pid_saveat_ts", "diffrax_constant_saveat_ts") + (
    () if NEWER_XLA else ("nested_scans",))
# the programs whose loop(K), not one step, the forced option changes (jaxlib 0.10's XLA)
REGION_ANALYSIS_UNSAFE_LOOPS = () if NEWER_XLA else ("in_place_update",)

PROGRAMS: dict[str, Callable[[], Program]] = {f.__name__: f for f in [
    diffrax_pid_saveat_ts, diffrax_constant_saveat_ts, diffrax_saveat_t1, diffrax_backsolve,
    optimistix_root_find, optimistix_minimise, loops_dynamic_update_slice, nested_scans, cond_switch,
    sort_top_k, segment_sum_scatter_add, custom_vjp, rnn, transformer_adamw, batchnorm_state, in_place_update]}

# The programs the opt-in options' corpus tests run by default: cheap, and between them a scan, a sort, a
# scatter and a cond/switch; the others (the diffrax fits take seconds each) run with -m slow. sort_top_k
# and rnn are programs whose packed loops XLA compiles to other last bits (test_pack_state's CORPUS_RTOL):
# they stay here, so the default run holds that tolerance.
DEFAULT = ("rnn", "sort_top_k", "segment_sum_scatter_add", "cond_switch")


def marked(names=tuple(PROGRAMS), slow=()) -> list:
    """`names` as pytest parameters, marked slow: the corpus programs not in `DEFAULT`, and `slow`."""
    return [pytest.param(n, marks=pytest.mark.slow if n in slow or (n in PROGRAMS and n not in DEFAULT) else ())
            for n in names]
