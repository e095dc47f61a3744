"""Stacks of blocks written the way their libraries teach them (issue 38's models), for roll-layers.

Each builder returns ``(step, state, batch)``: an optax step on ``(params, opt_state)`` (AdamW unless
given), the data an argument of the step.

* `linen_gpt`: a flax linen GPT; its blocks are ``@nn.compact`` submodules, so its parameters are
  ``Block_0`` .. ``Block_{L-1}`` (dict keys carrying the index, not a list).
* `eqx_mlp`: an equinox residual MLP, a list of modules; the first block reads the batch (its input
  has no gradient); with `norm`, each block's input through ``eqx.nn.LayerNorm`` first.
* `tied_mlp`: a residual MLP whose every block also applies one matrix all blocks share (its gradient
  is a sum over the layers).
* `haiku_mlp`: residual blocks under haiku's module names (``block/layer_norm``, ``block_1/layer_norm``, ..:
  haiku numbers a name's modules from the second), the parameter dict ``hk.transform(f).init`` returns.
* `two_stacks`: an encoder's residual blocks, then a decoder's (their products alike).
* `linen_batch_norm_mlp`: flax linen residual blocks ``x + relu(BatchNorm(Dense(x)))``, their running
  statistics part of the state.
* `rms_mlp`: residual blocks through an RMS norm (Llama's MLP block), the first reading the data.
* `lora_mlp`: residual blocks fine-tuned with low-rank adapters, the base weights frozen.
* `bfloat16_mlp`: residual blocks computed in bfloat16 from float32 params (mixed precision), or the same
  blocks as a ``lax.scan``.
* `normed_mlp`: residual blocks ``x + act(layer_norm(x) w)``, the first reading the batch, the last
  block of another activation (a head block).
* `gpt_variant`: transformer.py's GPT with an unlike first block (a stem without its residual), an
  unlike last block (an MLP of another activation), a per-layer residual scale ``1 / sqrt(2 (i + 1))``
  (depth-scaled residuals), or its blocks held in other containers (a tuple, nested lists, a dict
  ``h_0`` .. , keys ``w1, w2 ..`` with no container, a dict of names that say nothing of the order,
  read in a list's order or iterated).
"""
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import transformer


# ---- flax linen ------------------------------------------------------------------------------------
class _LinenBlock(nn.Module):
    width: int
    heads: int

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(x), mask=mask)
        return x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))


class _LinenGPT(nn.Module):
    layers: int
    width: int
    heads: int
    vocab: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        for _ in range(self.layers):
            x = _LinenBlock(self.width, self.heads)(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def linen_gpt(layers: int, width: int, heads: int, seq: int, batch: int, vocab: int, opt=None):
    model = _LinenGPT(layers, width, heads, vocab)
    tokens = transformer.tokens(seq, batch, vocab)
    params = jax.jit(model.init)(jax.random.key(0), tokens[:, :-1])     # eager, each op of it compiles apart

    def loss(p, t):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, t[:, :-1]), t[:, 1:]).mean()

    opt = opt or optax.adamw(3e-4)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), tokens


# ---- equinox -------------------------------------------------------------------------------------
class _EqxBlock(eqx.Module):
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    norm: eqx.nn.LayerNorm | None

    def __init__(self, width: int, hidden: int, key, norm: bool):
        k1, k2 = jax.random.split(key)
        self.up, self.down = eqx.nn.Linear(width, hidden, key=k1), eqx.nn.Linear(hidden, width, key=k2)
        self.norm = eqx.nn.LayerNorm(width) if norm else None

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(x if self.norm is None else self.norm(x))))


class _EqxMLP(eqx.Module):
    layers: list

    def __init__(self, layers: int, width: int, hidden: int, key, norm: bool):
        self.layers = [_EqxBlock(width, hidden, k, norm) for k in jax.random.split(key, layers)]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def eqx_mlp(layers: int, width: int, hidden: int, batch: int, opt=None, norm: bool = False):
    params = eqx.filter(_EqxMLP(layers, width, hidden, jax.random.key(0), norm), eqx.is_array)
    rng = np.random.default_rng(1)
    data = {"x": rng.normal(size=(batch, width)).astype(np.float32),
            "y": rng.normal(size=(batch, width)).astype(np.float32)}

    def loss(p, d):
        return jnp.mean((jax.vmap(p)(d["x"]) - d["y"]) ** 2)

    opt = opt or optax.adamw(3e-4)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


class _EqxConvNet(eqx.Module):
    stem: eqx.nn.Conv2d
    blocks: list
    head: eqx.nn.Linear

    def __init__(self, layers: int, channels: int, key):
        keys = jax.random.split(key, layers + 2)
        self.stem = eqx.nn.Conv2d(3, channels, 3, padding=1, key=keys[0])
        self.blocks = [eqx.nn.Conv2d(channels, channels, 3, padding=1, key=k) for k in keys[1:-1]]
        self.head = eqx.nn.Linear(channels, 10, key=keys[-1])

    def __call__(self, x):
        h = jax.nn.relu(self.stem(x))
        for block in self.blocks:
            h = h + jax.nn.relu(block(h))
        return self.head(h.mean(axis=(1, 2)))


def conv_resnet(layers: int, channels: int, size: int, batch: int, opt=None):
    """An equinox residual conv net: a stem ``Conv2d(3, C)``, `layers` blocks ``h + relu(conv(h))`` (3 x 3,
    C channels), mean-pooled into a linear head; softmax cross-entropy on 10 classes of `size` x `size` images."""
    params = eqx.filter(_EqxConvNet(layers, channels, jax.random.key(0)), eqx.is_array)
    rng = np.random.default_rng(1)
    data = {"x": rng.normal(size=(batch, 3, size, size)).astype(np.float32), "y": rng.integers(0, 10, batch)}

    def loss(p, d):
        logits = jax.vmap(p)(d["x"])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), d["y"][:, None], 1))

    opt = opt or optax.adamw(1e-3)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


# ---- a leaf every block reads ------------------------------------------------------------------
def tied_mlp(layers: int, width: int, batch: int, opt=None):
    """x + tanh(x w_l) tied per block, ``tied`` one matrix every block reads (ALBERT-style sharing)."""
    rng = np.random.default_rng(0)
    params = {"layers": [{"w": jnp.asarray(rng.normal(size=(width, width)) / width ** 0.5, jnp.float32)}
                         for _ in range(layers)],
              "tied": jnp.asarray(rng.normal(size=(width, width)) / width, jnp.float32)}

    def loss(p, x):
        for layer in p["layers"]:
            x = x + jnp.tanh(x @ layer["w"]) @ p["tied"]
        return jnp.mean(x ** 2)
    opt = opt or optax.adamw(1e-3)
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), x


# ---- haiku's module names ---------------------------------------------------------------------------
def haiku_mlp(layers: int, width: int, batch: int, opt=None, blocks: bool = True):
    """``x + gelu(layer_norm(x) w + b)`` per block, a linear head: the parameters as haiku names them (dm-haiku
    0.0.17), one flat dict of module paths. With `blocks`, a ``Block`` module (an ``hk.LayerNorm`` and an
    ``hk.Linear``) created once per layer: ``block/linear``, ``block_1/linear``, .., the head ``linear``; without,
    the two modules created in the loop itself: ``layer_norm``, ``linear``, ``layer_norm_1``, ``linear_1``, ..,
    the head ``linear_{layers}`` (each layer's two modules are runs of their own)."""
    rng = np.random.default_rng(0)

    def numbered(name: str, l: int) -> str:
        return name if l == 0 else f"{name}_{l}"

    def named(module: str, l: int) -> str:
        return f"{numbered('block', l)}/{module}" if blocks else numbered(module, l)
    params = {}
    for l in range(layers):
        params[named("layer_norm", l)] = {"offset": jnp.zeros(width), "scale": jnp.ones(width)}
        params[named("linear", l)] = {"b": jnp.zeros(width),
                                      "w": jnp.asarray(rng.normal(size=(width, width)) / width ** 0.5, jnp.float32)}
    head = "linear" if blocks else numbered("linear", layers)
    params[head] = {"b": jnp.zeros(1), "w": jnp.asarray(rng.normal(size=(width, 1)), jnp.float32)}

    def loss(p, d):
        x = d["x"]
        for l in range(layers):
            norm, linear = p[named("layer_norm", l)], p[named("linear", l)]
            mean = x.mean(-1, keepdims=True)
            normed = (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
            x = x + jax.nn.gelu((normed * norm["scale"] + norm["offset"]) @ linear["w"] + linear["b"])
        return jnp.mean((x @ p[head]["w"] + p[head]["b"] - d["y"]) ** 2)
    opt = opt or optax.adamw(1e-3)
    data = {"x": jnp.asarray(rng.normal(size=(batch, width)), jnp.float32),
            "y": jnp.asarray(rng.normal(size=(batch, 1)), jnp.float32)}
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


# ---- two stacks, one after the other -------------------------------------------------------------
def two_stacks(layers: int, width: int, batch: int, opt=None, decoder: int | None = None, cross: bool = False):
    """An encoder's `layers` blocks ``x + tanh(x e_l)``, the first reading the batch, then a decoder's
    `decoder` (default: as many) ``x + sin(x d_l + c_l)``: the products of both stacks are alike ops, so the
    shift map's chains run on from one stack into the other. `cross`: each decoder block reads the encoder's
    output m, as cross-attention does, ``y + sin(y d_l + m v_l)``, from the batch's rows reversed (a target
    of its own); m's gradient is the sum of every decoder layer's term."""
    rng = np.random.default_rng(0)

    def matrix():
        return jnp.asarray(rng.normal(size=(width, width)) / width ** 0.5, jnp.float32)
    def decoder_block():        # reading the encoder's output through v, or adding a bias b
        return {"w": matrix(), "v": matrix()} if cross else {"w": matrix(), "b": jnp.zeros(width)}
    params = {"enc": [{"w": matrix()} for _ in range(layers)],
              "dec": [decoder_block() for _ in range(layers if decoder is None else decoder)]}

    def loss(p, x):
        y = x[::-1]
        for block in p["enc"]:
            x = x + jnp.tanh(x @ block["w"])
        for block in p["dec"]:
            if cross:
                y = y + jnp.sin(y @ block["w"] + x @ block["v"])
            else:
                x = x + jnp.sin(x @ block["w"] + block["b"])
        return jnp.mean((y if cross else x) ** 2)
    opt = opt or optax.adam(1e-2)
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), x


def autoencoder(encoder: int, decoder: int, width: int, batch: int, opt=None):
    """Two stacks of the same block ``x + gelu(x w_l + b_l)``, `encoder` then `decoder` of them, the loss the
    reconstruction's error: the stacks' leaves have the same types, under ``['enc']`` and ``['dec']``."""
    rng = np.random.default_rng(0)

    def block():
        return {"w": jnp.asarray(rng.normal(size=(width, width)) / width ** 0.5, jnp.float32), "b": jnp.zeros(width)}
    params = {"enc": [block() for _ in range(encoder)], "dec": [block() for _ in range(decoder)]}

    def loss(p, x):
        h = x
        for b in p["enc"] + p["dec"]:
            h = h + jax.nn.gelu(h @ b["w"] + b["b"])
        return jnp.mean((h - x) ** 2)
    opt = opt or optax.adamw(1e-2)
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), x


# ---- layer-normed blocks before a head block ---------------------------------------------------------
def normed_mlp(layers: int, width: int, batch: int, head=lambda h: h, opt=None, target: bool = False):
    """``x + tanh(layer_norm(x, s_l) w_l)`` per block, `head` instead of tanh in the last; the first block
    reads the batch, so its input has no gradient: the ops that compute it in the others are missing there.
    The loss ``mean(x ** 2)``, or with `target` the squared error against the batch's ``y``, whose gradient
    ``2 (x - y)`` is alike to the layer norm's ``2 (x - mean)``."""
    rng = np.random.default_rng(0)
    params = {"blocks": [{"w": jnp.asarray(rng.normal(size=(width, width)) / width ** 0.5, jnp.float32),
                          "s": jnp.asarray(1.0 + 0.1 * rng.normal(size=width), jnp.float32)} for _ in range(layers)]}

    def forward(p, x):
        for l, block in enumerate(p["blocks"]):
            mean = x.mean(-1, keepdims=True)
            normed = (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * block["s"]
            x = x + (head if l == layers - 1 else jnp.tanh)(normed @ block["w"])
        return x
    opt = opt or optax.adamw(1e-3)
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    if not target:
        return transformer.optax_step(lambda p, x: jnp.mean(forward(p, x) ** 2), opt), (params, opt.init(params)), x
    data = {"x": x, "y": jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)}
    return (transformer.optax_step(lambda p, d: jnp.mean((forward(p, d["x"]) - d["y"]) ** 2), opt),
            (params, opt.init(params)), data)


class _LinenNormedBlock(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        return x + nn.relu(nn.BatchNorm(use_running_average=False)(nn.Dense(self.width)(x)))


class _LinenNormedMLP(nn.Module):
    layers: int
    width: int

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.width)(x)
        for _ in range(self.layers):
            x = _LinenNormedBlock(self.width)(x)
        return nn.Dense(1)(x)


def linen_batch_norm_mlp(layers: int, width: int, batch: int, opt=None):
    """A flax linen residual MLP whose blocks are ``x + relu(BatchNorm(Dense(x)))``, trained on its batch
    statistics: the state is ``(params, batch_stats, opt_state)``, the new running statistics computed in the
    forward pass. The norm takes each feature's mean out, so the gradient of the Dense bias before it is
    rounding noise, which AdamW (eps 1e-8) turns into a step of about its learning rate either way."""
    model = _LinenNormedMLP(layers, width)
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(batch, 8)).astype(np.float32), "y": rng.normal(size=(batch, 1)).astype(np.float32)}
    variables = model.init(jax.random.key(0), data["x"])
    opt = opt or optax.adamw(1e-3)

    def step(state, batch):
        params, stats, opt_state = state

        def loss(p):
            out, new = model.apply({"params": p, "batch_stats": stats}, batch["x"], mutable=["batch_stats"])
            return jnp.mean((out - batch["y"]) ** 2), new["batch_stats"]
        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), stats, opt_state), {"loss": value}
    params = variables["params"]
    return step, (params, variables["batch_stats"], opt.init(params)), data


def rms_mlp(layers: int, width: int, batch: int, opt=None, frozen: int = 0):
    """Residual blocks ``x + silu(rms_norm(x, g_l) w1_l + b1_l) w2_l`` (a Llama-style MLP block), the first reading
    the data, then a linear head: the gradient of a block's input through its RMS norm reads the input itself,
    and the first block computes none. The first `frozen` blocks are read through ``lax.stop_gradient`` (a
    fine-tuning idiom), after a trained input projection ``inp``: every block computes its input's gradient,
    only the others their weights'."""
    rng = np.random.default_rng(0)
    params = {"layers": [{"w1": rng.normal(size=(width, 4 * width)).astype(np.float32) / 16,
                          "b1": np.zeros(4 * width, np.float32),
                          "w2": rng.normal(size=(4 * width, width)).astype(np.float32) / 32,
                          "g": np.ones(width, np.float32)} for _ in range(layers)],
              "head": rng.normal(size=(width, 1)).astype(np.float32) / 16}
    if frozen:
        params["inp"] = rng.normal(size=(width, width)).astype(np.float32) / 8
    data = {"x": rng.normal(size=(batch, width)).astype(np.float32), "y": rng.normal(size=(batch, 1)).astype(np.float32)}

    def loss(p, d):
        x = d["x"] @ p["inp"] if frozen else d["x"]
        for i, b in enumerate(p["layers"]):
            b = jax.lax.stop_gradient(b) if i < frozen else b
            normed = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * b["g"]
            x = x + jax.nn.silu(normed @ b["w1"] + b["b1"]) @ b["w2"]
        return jnp.mean((x @ p["head"] - d["y"]) ** 2)
    opt = opt or optax.adamw(1e-3)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


def lora_mlp(layers: int, width: int, batch: int, rank: int = 4, eps: float = 1e-8):
    """Residual blocks ``x + tanh(x (w_l + a_l b_l))`` fine-tuned with low-rank adapters (LoRA): the base weights
    ``w`` frozen (``optax.set_to_zero``), ``a`` and ``b`` trained by AdamW, whose moments are kept for them only."""
    rng = np.random.default_rng(0)
    params = {"layers": [{"w": rng.normal(size=(width, width)).astype(np.float32) / 8,
                          "a": rng.normal(size=(width, rank)).astype(np.float32) / 8,
                          "b": np.zeros((rank, width), np.float32)} for _ in range(layers)],
              "head": rng.normal(size=(width, 1)).astype(np.float32) / 8}
    data = {"x": rng.normal(size=(batch, width)).astype(np.float32), "y": rng.normal(size=(batch, 1)).astype(np.float32)}

    def loss(p, d):
        x = d["x"]
        for b in p["layers"]:
            x = x + jnp.tanh(x @ (b["w"] + b["a"] @ b["b"]))
        return jnp.mean((x @ p["head"] - d["y"]) ** 2)

    def labels(p):
        return {k: [{"w": "frozen", "a": "train", "b": "train"} for _ in v] if k == "layers"
                else jax.tree.map(lambda _: "train", v) for k, v in p.items()}
    opt = optax.multi_transform({"frozen": optax.set_to_zero(), "train": optax.adamw(1e-3, eps=eps)}, labels)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


def bfloat16_mlp(layers: int, width: int, batch: int, opt=None, scan: bool = False):
    """Residual blocks ``x + gelu((x s_l) w1_l) w2_l`` computed in bfloat16 from float32 params (mixed
    precision: each block casts its leaves), the loss in float32; `scan`: the same blocks as a ``lax.scan``
    over the leaves stacked (a list of one stacked block)."""
    rng = np.random.default_rng(0)
    blocks = [{"w1": rng.normal(size=(width, 4 * width)).astype(np.float32) / 16,
               "w2": rng.normal(size=(4 * width, width)).astype(np.float32) / 32,
               "s": np.ones(width, np.float32)} for _ in range(layers)]
    data = {"x": rng.normal(size=(batch, width)).astype(np.float32), "y": rng.normal(size=(batch, width)).astype(np.float32)}

    def block(x, b):
        return x + jax.nn.gelu((x * b["s"].astype(jnp.bfloat16)) @ b["w1"].astype(jnp.bfloat16)) @ b["w2"].astype(jnp.bfloat16)

    def loss(p, d):
        x = d["x"].astype(jnp.bfloat16)
        if scan:
            x, _ = jax.lax.scan(lambda x, b: (block(x, b), None), x, p["blocks"][0])
        else:
            for b in p["blocks"]:
                x = block(x, b)
        return jnp.mean((x.astype(jnp.float32) - d["y"]) ** 2)
    params = {"blocks": [jax.tree_util.tree_map(lambda *a: np.stack(a), *blocks)] if scan else blocks}
    opt = opt or optax.adamw(1e-3)
    return transformer.optax_step(loss, opt), (params, opt.init(params)), data


# ---- transformer.py's GPT, varied ----------------------------------------------------------------
def _stem(p: dict, x, heads: int):
    """transformer.block without its residuals: an unlike first block."""
    b, s, w = x.shape
    h = transformer.layer_norm(x, p["ln1_s"], p["ln1_b"]) @ p["qkv"] + p["qkv_b"]
    q, k, v = (t[:, :, 0].transpose(0, 2, 1, 3) for t in jnp.split(h.reshape(b, s, 3, heads, w // heads), 3, axis=2))
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), q @ k.transpose(0, 1, 3, 2) / np.sqrt(w // heads), -1e9)
    x = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, w) @ p["proj"] + p["proj_b"]
    return jax.nn.gelu(transformer.layer_norm(x, p["ln2_s"], p["ln2_b"]) @ p["up"] + p["up_b"]) @ p["down"] + p["down_b"]


def _scaled(p: dict, x, heads: int, scale: float):
    """transformer.block with each residual branch scaled by `scale` (a per-layer constant)."""
    return x + scale * (transformer.block(p, x, heads) - x)


VARIANTS = ("stem_and_last", "depth_scaled", "tuple", "nested", "dict_h", "numbered_keys", "named")
NAMES = ("cedar", "alder", "birch", "elm", "fir", "dogwood", "gum", "hazel")   # layer order, not key order


def gpt_variant(variant: str, layers: int, width: int, heads: int, seq: int, batch: int, vocab: int, opt=None):
    """transformer.gpt's model and values with its blocks varied (see the module docstring)."""
    p = transformer.params(layers, width, heads, seq, vocab)
    blocks = p.pop("blocks")
    if variant == "tuple":
        p["blocks"] = tuple(blocks)
    elif variant == "nested":       # blocks of two blocks
        p["blocks"] = [blocks[i:i + 2] for i in range(0, layers, 2)]
    elif variant == "dict_h":
        p["blocks"] = {f"h_{i}": b for i, b in enumerate(blocks)}
    elif variant == "numbered_keys":
        p.update({f"block{i + 1}": b for i, b in enumerate(blocks)})
    elif variant in ("named", "named_iterated"):   # no index anywhere: the leaves' uses propose the run
        p["blocks"] = {NAMES[i]: b for i, b in enumerate(blocks)}
    else:
        p["blocks"] = blocks

    def order(p):
        if variant == "nested":
            return [b for pair in p["blocks"] for b in pair]
        if variant == "dict_h":
            return [p["blocks"][f"h_{i}"] for i in range(layers)]
        if variant == "numbered_keys":
            return [p[f"block{i + 1}"] for i in range(layers)]
        if variant == "named":
            return [p["blocks"][NAMES[i]] for i in range(layers)]
        if variant == "named_iterated":      # the dict as jax gives it: its keys in sorted order
            return list(p["blocks"].values())
        return list(p["blocks"])

    def loss(p, t):
        x = p["tok"][t[:, :-1]] + p["pos"]
        for i, b in enumerate(order(p)):
            if variant == "stem_and_last" and i == 0:
                x = _stem(b, x, heads)
            elif variant == "stem_and_last" and i == layers - 1:
                x = transformer.block(b, x, heads, act=jax.nn.relu)
            elif variant == "depth_scaled":
                x = _scaled(b, x, heads, 1 / np.sqrt(2 * (i + 1)))
            else:
                x = transformer.block(b, x, heads)
        return transformer._head(p, x, t)

    opt = opt or optax.adamw(3e-4)
    return transformer.optax_step(loss, opt), (p, opt.init(p)), transformer.tokens(seq, batch, vocab)


def frozen_first(frozen: int, inner: optax.GradientTransformation, key: str = "layers") -> optax.GradientTransformation:
    """`inner` on every leaf but the first `frozen` layers of ``params[key]``, which stay as they are (fine-tuning
    the last layers: ``optax.multi_transform`` with ``optax.set_to_zero``): `inner`'s state holds moments for
    the trained layers only, from ``[key][frozen]`` on."""
    def labels(p):
        return {k: [jax.tree.map(lambda _: "frozen" if i < frozen else "train", layer) for i, layer in enumerate(v)]
                if k == key else jax.tree.map(lambda _: "train", v) for k, v in p.items()}
    return optax.multi_transform({"frozen": optax.set_to_zero(), "train": inner}, labels)


def layer_wise_rates(layers: int, key: str = "layers", rate: float = 1e-3, decay: float = 0.8,
                     eps: float = 1e-8, per: int = 1) -> optax.GradientTransformation:
    """AdamW with a learning rate per layer of the list ``params[key]`` (layer-wise rate decay, as fine-tuning
    writes it with ``optax.multi_transform``: a label per layer, ``l0`` .. ``l{layers-1}``, or per group of
    `per` layers, and ``rest``): layer 3's moments are kept under ``['l3']`` (``per=2``: ``['l1']``) and
    ``[key][3]`` both, the other layers masked out of the label's state."""
    def labels(p):
        return {k: [jax.tree.map(lambda _: f"l{i // per}", layer) for i, layer in enumerate(v)] if k == key
                else jax.tree.map(lambda _: "rest", v) for k, v in p.items()}
    rates = {f"l{g}": optax.adamw(rate * decay ** (layers // per - g), eps=eps) for g in range(-(-layers // per))}
    return optax.multi_transform({**rates, "rest": optax.adamw(rate, eps=eps)}, labels)
