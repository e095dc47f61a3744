"""GPT-style models written the way people write them, and a hand-written rolled twin.

`gpt(...)`: token and position embeddings, `layers` pre-LayerNorm blocks (causal multi-head
attention, a 4x GELU MLP, every dense layer with a bias) applied by a Python ``for`` loop over a
list of parameter dicts, a final LayerNorm and a linear head; next-token cross-entropy, AdamW; the
state ``(params, opt_state)``. `gpt_scan(...)`: the same model and initial values with the blocks'
parameters stacked (``[layers, ...]`` per leaf) and applied by ``lax.scan`` over
``jax.checkpoint(block, policy=...)``: the rewrite users make by hand to save activation memory.
`nnx_gpt(...)`: a flax nnx model (``nnx.MultiHeadAttention``, ``nnx.LayerNorm``, ``nnx.Linear``), its
blocks an ``nnx.List``, its state the nnx parameter ``State`` and the optax state (bench_gpt.py's);
`nnx_gpt_scan(...)`: the same model and values, its blocks' states stacked and scanned as in `gpt_scan`.
Each returns ``(step, state, tokens)``; the data are an argument of the step.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from problems import stack_trees

ISSUE = dict(layers=8, width=256, heads=8, seq=128, batch=16, vocab=512)   # the model of issue 31
TINY = dict(layers=3, width=16, heads=2, seq=8, batch=2, vocab=32)


def params(layers: int, width: int, heads: int, seq: int, vocab: int, seed: int = 0) -> dict:
    keys = iter(jax.random.split(jax.random.key(seed), 4 * layers + 3))

    def normal(*shape):
        return jax.random.normal(next(keys), shape) * 0.02

    blocks = [dict(ln1_s=jnp.ones(width), ln1_b=jnp.zeros(width), qkv=normal(width, 3 * width),
                   qkv_b=jnp.zeros(3 * width), proj=normal(width, width), proj_b=jnp.zeros(width),
                   ln2_s=jnp.ones(width), ln2_b=jnp.zeros(width), up=normal(width, 4 * width),
                   up_b=jnp.zeros(4 * width), down=normal(4 * width, width), down_b=jnp.zeros(width))
              for _ in range(layers)]
    return dict(tok=normal(vocab, width), pos=normal(seq, width), blocks=blocks, ln_s=jnp.ones(width),
                ln_b=jnp.zeros(width), head=normal(width, vocab))


def layer_norm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale + bias


def block(p: dict, x, heads: int, act=jax.nn.gelu):
    b, s, w = x.shape
    h = layer_norm(x, p["ln1_s"], p["ln1_b"]) @ p["qkv"] + p["qkv_b"]
    q, k, v = (t[:, :, 0].transpose(0, 2, 1, 3) for t in jnp.split(h.reshape(b, s, 3, heads, w // heads), 3, axis=2))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(w // heads)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    attention = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, w)
    x = x + attention @ p["proj"] + p["proj_b"]
    return x + act(layer_norm(x, p["ln2_s"], p["ln2_b"]) @ p["up"] + p["up_b"]) @ p["down"] + p["down_b"]


def optax_step(loss, opt):
    """``step((params, opt_state), batch) -> (new state, {"loss": loss})``: `opt` on the gradient of `loss`."""
    def step(state, batch):
        params, opt_state = state
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}
    return step


def _head(p: dict, x, tokens):
    logits = layer_norm(x, p["ln_s"], p["ln_b"]) @ p["head"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def tokens(seq: int, batch: int, vocab: int, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (batch, seq + 1), 0, vocab)


def gpt(layers: int, width: int, heads: int, seq: int, batch: int, vocab: int, opt=None, onehot: bool = False):
    """The model as written: a Python loop over `layers` blocks (see the module docstring). `onehot`:
    the token embedding as a product with one-hot rows, not a gather (whose gradient is a scatter,
    which the StableHLO reference interpreter computes wrongly when its zero operand has other uses)."""
    opt = opt or optax.adamw(3e-4)

    def loss(p, t):
        x = (jax.nn.one_hot(t[:, :-1], vocab) @ p["tok"] if onehot else p["tok"][t[:, :-1]]) + p["pos"]
        for b in p["blocks"]:
            x = block(b, x, heads)
        return _head(p, x, t)

    p = params(layers, width, heads, seq, vocab)
    return optax_step(loss, opt), (p, opt.init(p)), tokens(seq, batch, vocab)


def gpt_scan(layers: int, width: int, heads: int, seq: int, batch: int, vocab: int, opt=None,
             policy=jax.checkpoint_policies.nothing_saveable):
    """The same model and values, its blocks stacked and scanned over ``jax.checkpoint(block, policy)``
    (policy None: no checkpoint)."""
    opt = opt or optax.adamw(3e-4)
    one = (lambda p, x: block(p, x, heads))
    one = one if policy is None else jax.checkpoint(one, policy=policy)

    def loss(p, t):
        x = p["tok"][t[:, :-1]] + p["pos"]
        x, _ = lax.scan(lambda x, b: (one(b, x), None), x, p["blocks"])
        return _head(p, x, t)

    p = params(layers, width, heads, seq, vocab)
    p["blocks"] = stack_trees(p["blocks"])
    return optax_step(loss, opt), (p, opt.init(p)), tokens(seq, batch, vocab)


def stacked(state):
    """A `gpt` state (params, opt_state) with its blocks' leaves stacked as `gpt_scan` holds them."""
    def stack(tree):
        if isinstance(tree, dict) and isinstance(tree.get("blocks"), list):
            return {**tree, "blocks": stack_trees(tree["blocks"])}
        return tree
    return jax.tree_util.tree_map(stack, state, is_leaf=lambda t: isinstance(t, dict) and "blocks" in t)


class NnxBlock(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attention(self.ln1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class NnxGPT(nnx.Module):
    def __init__(self, layers: int, width: int, heads: int, seq: int, vocab: int, rngs: nnx.Rngs):
        self.tokens, self.positions = nnx.Embed(vocab, width, rngs=rngs), nnx.Embed(seq, width, rngs=rngs)
        self.blocks = nnx.List([NnxBlock(width, heads, rngs) for _ in range(layers)])
        self.ln, self.head = nnx.LayerNorm(width, rngs=rngs), nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def nnx_gpt(layers: int, width: int, heads: int, seq: int, vocab: int, batch: int, opt=None):
    """(step, state, tokens): the AdamW step on (nnx params State, optax state), a token batch."""
    graphdef, p = nnx.split(NnxGPT(layers, width, heads, seq, vocab, nnx.Rngs(0)))
    opt = opt or optax.adamw(3e-4)

    def loss(p, t):
        logits = nnx.merge(graphdef, p)(t[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, t[:, 1:]).mean()

    return optax_step(loss, opt), (p, opt.init(p)), tokens(seq, batch, vocab)


def nnx_gpt_scan(layers: int, width: int, heads: int, seq: int, vocab: int, batch: int, opt=None,
                 policy=jax.checkpoint_policies.nothing_saveable):
    """`nnx_gpt`'s model and values, its blocks' states stacked and applied by ``lax.scan`` over
    ``jax.checkpoint(block, policy)``; the state ``((model without blocks, stacked blocks), optax state)``."""
    model = NnxGPT(layers, width, heads, seq, vocab, nnx.Rngs(0))
    parts = [nnx.split(b) for b in model.blocks]
    block_def, blocks = parts[0][0], stack_trees([s for _, s in parts])
    model.blocks = nnx.List([])
    outer_def, outer = nnx.split(model)
    opt = opt or optax.adamw(3e-4)
    one = jax.checkpoint(lambda b, x, mask: nnx.merge(block_def, b)(x, mask), policy=policy)

    def loss(p, t):     # NnxGPT.__call__ with its loop over the blocks as a scan
        m, inputs = nnx.merge(outer_def, p[0]), t[:, :-1]
        x = m.tokens(inputs) + m.positions(jnp.arange(inputs.shape[-1]))
        mask = nnx.make_causal_mask(inputs)
        x, _ = lax.scan(lambda x, b: (one(b, x, mask), None), x, p[1])
        return optax.softmax_cross_entropy_with_integer_labels(m.head(m.ln(x)), t[:, 1:]).mean()

    p = (outer, blocks)
    return optax_step(loss, opt), (p, opt.init(p)), tokens(seq, batch, vocab)
