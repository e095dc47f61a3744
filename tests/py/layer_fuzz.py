"""A generator of layered models for roll-layers' differential fuzz (test_roll_layers.py).

`model(seed)` draws a residual network written as a Python loop over L alike blocks of a random op
chain, with the features users write around such a loop, and says which layers must roll:

* the block: 1 to 3 random steps (a dense layer, an activation, a layer norm, a ``lax.cond`` or a
  ``lax.fori_loop`` inside the block, a product with another leaf of the block), with or without its
  residual; a leaf shared by every block (a bias added in each); a per-layer constant (the block's
  output scaled by ``1 / (l + 1)``);
* an unlike first block (a stem: the block without its residual, or another activation) and an
  unlike last block; the first block always reads the data (its input has no gradient);
* a *must-not* layer: one middle block with an extra op (the others lack it), which no rolled run
  may contain (the alike layers on either side of it may roll); but for a block without its residual
  the extra op is the block's last, on its output, where it is as much the next layer's first: a run
  may end with that layer, the op left between the run and the next layer (`Model.may_end`);
* the blocks held as a list or, in 30% of the models, a dict ``h_0``, ``h_1``, .. (half of those of 11
  layers: jax orders the leaves ``h_10`` before ``h_2``, which a packed state's stacks must not follow);
* a random optax optimizer, a memory budget of 0 or 0.5, the state as a pytree or packed; in 70%
  of the models whose blocks have no ``lax.cond`` or loop (which micro-batch does not cut), the batch cut
  into micro-batches (`Model.slices`), the layers rolled inside the micro-batch loop's body.

`Model.alike` lists the longest ranges of alike layers (a rolled run should cover one of them, but
for its first layer where that is the network's first: the data it reads needs no gradient, so jax
traces the first op on it otherwise, a ``jax.nn`` activation as a call of another function; none if
no two layers are alike), `Model.forbidden` the layers no rolled run may contain, `Model.may_end` those
a run may contain only as its last layer (`Model.unlike_rolled`).
"""
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

OPTIMIZERS: dict[str, Callable[[], optax.GradientTransformation]] = {
    "sgd": lambda: optax.sgd(1e-2),
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "adam": lambda: optax.adam(1e-2, eps=1e-5),
    "adamw": lambda: optax.adamw(1e-2, eps=1e-5),
    "rmsprop": lambda: optax.rmsprop(1e-2, eps=1e-5),
    "clipped": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2, eps=1e-5)),
}
ACTIVATIONS = {"tanh": jnp.tanh, "gelu": jax.nn.gelu, "sin": jnp.sin, "softplus": jax.nn.softplus}


@dataclass
class Model:
    seed: int
    step: Callable
    state: Any
    batch: Any
    layers: int
    alike: list                      # ranges of layers, one of which a rolled run should be
    forbidden: set = field(default_factory=set)     # layers no rolled run may contain
    may_end: set = field(default_factory=set)       # ... but as its last layer
    budget: float = 0.0
    packed: bool = False
    slices: int = 1                  # micro-batches: the layers roll inside the micro-batch loop's body
    about: str = ""

    def unlike_rolled(self, run: range) -> bool:
        """Whether a rolled `run` holds a layer it must not."""
        return bool(set(run) & self.forbidden or set(run[:-1]) & self.may_end)


def _layer_norm(x, scale):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * scale


def model(seed: int) -> Model:
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(3, 7))
    held = np.random.default_rng([seed, 1])      # how the blocks are held, drawn apart from the rest
    keyed = bool(held.random() < 0.3)             # a dict ``h_0`` .. instead of a list
    if keyed and held.random() < 0.5:
        layers = 11                               # ``h_10`` sorts before ``h_2``: leaf order is not layer order
    width, batch = 4, 3
    steps = [str(rng.choice(["dense", "act", "norm", "cond", "loop", "gate"])) for _ in range(int(rng.integers(1, 4)))]
    if steps == ["act"] * len(steps):       # a block that reads a leaf of its own
        steps.append("dense")
    act = str(rng.choice(list(ACTIVATIONS)))
    residual = bool(rng.integers(2))
    shared, scaled = bool(rng.random() < 0.3), bool(rng.random() < 0.3)
    stem, head = bool(rng.random() < 0.3), bool(rng.random() < 0.3)
    odd = int(rng.integers(1, layers - 1)) if layers >= 4 and rng.random() < 0.2 else None
    keys = iter(jax.random.split(jax.random.key(seed), 4 * layers + 4))

    def normal(*shape):
        return jax.random.normal(next(keys), shape) * 0.5

    blocks = [{"w": normal(width, width), "b": normal(width), "s": 1.0 + normal(width), "g": normal(width)}
              for _ in range(layers)]
    params = {"blocks": {f"h_{l}": b for l, b in enumerate(blocks)} if keyed else blocks, "head": normal(width, 1)}
    if shared:
        params["shared"] = normal(width)

    def block(p, x, activation, with_residual, odd_one):
        h = x
        for kind in steps:
            if kind == "dense":
                h = h @ p["w"] + p["b"]
            elif kind == "act":
                h = activation(h)
            elif kind == "norm":
                h = _layer_norm(h, p["s"])
            elif kind == "cond":        # a branch chosen by the layer's own values
                h = lax.cond(jnp.sum(h) > 0, lambda v: jnp.tanh(v) * p["s"], lambda v: v, h)
            elif kind == "loop":
                h = lax.fori_loop(0, 2, lambda i, v: v * 0.5 + p["b"], h)
            else:
                h = h * jax.nn.sigmoid(p["g"])
        if odd_one:
            h = jnp.cos(h)              # an op only this layer has
        return x + h if with_residual else h

    def loss(p, data):
        x = data["x"]
        for l, b in enumerate([p["blocks"][f"h_{k}"] for k in range(layers)] if keyed else p["blocks"]):
            first, last = l == 0, l == layers - 1
            activation = ACTIVATIONS["tanh" if act != "tanh" else "sin"] if (first and stem or last and head) \
                else ACTIVATIONS[act]
            x = block(b, x, activation, residual and not (first and stem and "act" not in steps), l == odd)
            if shared:
                x = x + p["shared"]
            if scaled:
                x = x * (1.0 / (l + 1))
        return jnp.mean((x @ p["head"] - data["y"]) ** 2)

    opt_name = str(rng.choice(list(OPTIMIZERS)))
    opt = OPTIMIZERS[opt_name]()

    def step(state, data):
        p, s = state
        value, grads = jax.value_and_grad(loss)(p, data)
        updates, s = opt.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), {"loss": value}

    lo, hi = int(stem and ("act" in steps or residual)), layers - int(head and "act" in steps)
    ranges = [(lo, odd), (odd + 1, hi)] if odd is not None else [(lo, hi)]
    longest = max(b - a for a, b in ranges)
    alike = [range(a, b) for a, b in ranges if b - a == longest and longest >= 2]
    data = {"x": rng.normal(size=(batch, width)).astype(np.float32),
            "y": rng.normal(size=(batch, 1)).astype(np.float32)}
    budget, packed = float(rng.choice([0.0, 0.5])), bool(rng.integers(2))
    cuttable = not {"cond", "loop"} & set(steps)         # micro-batch does not cut a branch or loop on the batch
    slices = batch if cuttable and rng.random() < 0.7 else 1
    about = (f"seed {seed}: {layers} {'keyed ' if keyed else ''}layers of {steps} ({act}, residual {residual}), shared {shared}, scaled "
             f"{scaled}, stem {stem}, head {head}, odd layer {odd}, {opt_name}, {slices} slice(s)")
    odd_layers = {odd} - {None}
    return Model(seed, step, (params, opt.init(params)), data, layers, alike, odd_layers if residual else set(),
                 set() if residual else odd_layers, budget=budget, packed=packed, slices=slices, about=about)


def covers(rolled: range, m: Model) -> bool:
    """Whether a rolled run of layers `rolled` rolls what `m` should: as many layers as its longest alike
    range, or one fewer (the first layer reads the data, which needs no gradient, so jax may trace its
    first op otherwise; a block's boundary op may go with either of its layers, so the run can end a
    layer early), within that range widened by one (the boundary)."""
    return any(len(rolled) >= len(r) - 1 and r.start - 1 <= rolled.start and rolled.stop <= r.stop + 1 for r in m.alike)
