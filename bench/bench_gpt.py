"""A flax nnx GPT-style model with many small leaves: loop(K) with and without pack-state against a
hand-written donated ``lax.scan`` of the same step (figure "gpt").

    python bench/bench_gpt.py [--layers 12] [--width 256] [--loop 5] [--rounds 5]   # ~1 min on 2 cores

The model: token and position embeddings, `--layers` pre-LayerNorm blocks (nnx.MultiHeadAttention
with a causal mask, a 4x GELU MLP; every Linear with a bias), a final LayerNorm and a linear head;
next-token cross-entropy, AdamW. Its state is the nnx parameter `State` (split once) and the optax
state: per block 12 parameter leaves, 8 of them biases and LayerNorm scales/biases of <= 4 x width
elements, which pack-state (default threshold 4,096 elements) carries in one flat buffer with their
moments, while the weight matrices stay separate.

Each variant is compiled once, after one untimed trace of the step (wall time from nothing to a
loaded executable: trace, passes and XLA for loopfuse, lower and compile for the scan; each in turn,
so it carries whatever load the machine had then); its first call's state is compared bitwise with the scan's; then interleaved rounds
(bench/harness.py) of one call of K steps each, the state chained: medians and ratios of steps/s.
"""
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

import loopfuse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

PACKED = ["pack-state"]


class Block(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attention(self.ln1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class GPT(nnx.Module):
    def __init__(self, layers: int, width: int, heads: int, seq: int, vocab: int, rngs: nnx.Rngs):
        self.tokens, self.positions = nnx.Embed(vocab, width, rngs=rngs), nnx.Embed(seq, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(layers)])
        self.ln, self.head = nnx.LayerNorm(width, rngs=rngs), nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def problem(layers: int, width: int, heads: int, seq: int, vocab: int, batch: int):
    """(step, state, batch): the AdamW step on (nnx params State, optax state), a token batch."""
    graphdef, params = nnx.split(GPT(layers, width, heads, seq, vocab, nnx.Rngs(0)))
    opt = optax.adamw(3e-4)

    def loss(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(state, tokens):
        params, opt_state = state
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}

    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    return step, (params, opt.init(params)), tokens


def fresh(state):
    return jax.tree_util.tree_map(jnp.copy, state)


def builders(step, k: int) -> dict:
    """name -> build(state, batch) -> (call, compile seconds)."""
    def scan(state, tokens):
        return lax.scan(lambda c, _: step(c, tokens), state, None, length=k)

    def jit_scan(state, tokens):
        t0 = time.perf_counter()
        call = jax.jit(scan, donate_argnums=0).lower(state, tokens).compile()
        return call, time.perf_counter() - t0

    def with_loopfuse(passes):
        def build(state, tokens):
            t0 = time.perf_counter()
            loop = loopfuse.compile_step(step, passes=passes).loop(k)
            loop.compiled(state, tokens)
            return loop, time.perf_counter() - t0
        return build

    return {"lax.scan (jax.jit, donated)": jit_scan, "loopfuse loop": with_loopfuse(None),
            "loopfuse loop + pack-state": with_loopfuse(PACKED)}


def bitwise(a, b) -> bool:
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def main() -> None:
    ap = harness.parser(__doc__, rounds=5)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--loop", type=int, default=5, help="K of loop(K) and of the scan")
    ns = ap.parse_args()
    if ns.quick:
        ns.layers, ns.width, ns.heads, ns.seq, ns.vocab, ns.batch, ns.loop, ns.rounds = 1, 16, 2, 8, 32, 2, 2, 2
    out = harness.Report("gpt", ns)
    step, state, tokens = problem(ns.layers, ns.width, ns.heads, ns.seq, ns.vocab, ns.batch)
    leaves = jax.tree_util.tree_leaves(state)
    small = sum(1 for x in leaves if x.ndim and x.size <= 4096)

    jax.eval_shape(step, state, tokens)   # a first trace warms flax's and jax's caches for every variant alike
    built, finals = {}, {}
    for name, build in builders(step, ns.loop).items():
        call, seconds = build(fresh(state), tokens)
        finals[name] = call(fresh(state), tokens)[0]
        built[name] = (call, seconds)
    names, reference = list(built), next(iter(built))
    states = {name: fresh(state) for name in names}

    def one_call(name):
        def run():
            t0 = time.perf_counter()
            states[name], _ = built[name][0](states[name], tokens)
            jax.block_until_ready(states[name])
            return ns.loop / (time.perf_counter() - t0)
        return run
    rates = harness.interleave({name: one_call(name) for name in names}, ns.rounds)

    compile_ref = built[reference][1]
    lines = [f"{ns.layers} layers, width {ns.width}, {ns.heads} heads, {ns.batch} x {ns.seq} tokens, vocab {ns.vocab}, "
             f"AdamW: {len(leaves)} state leaves, {small} of them tensors of <= 4,096 elements; loop({ns.loop}); "
             f"steps/s: medians (min–max) of {ns.rounds} interleaved rounds of one call", "",
             "| variant | compile s | vs scan | steps/s | vs scan | final state bitwise = scan |",
             "|---|---:|---:|---:|---:|---|"]
    rows = {}
    for name in names:
        c = harness.compare(rates[name], rates[reference], higher_is_better=True)
        exact = bitwise(finals[name], finals[reference])
        lines.append(f"| {name} | {built[name][1]:.1f} | {built[name][1] / compile_ref:.2f}x | "
                     f"{np.median(rates[name]):.1f} ({harness.spread_text(rates[name], '{:.1f}')}) | "
                     f"{'—' if name == reference else harness.ratio_text(c)} | {exact} |")
        rows[name] = dict(compile_s=built[name][1], steps_per_s=harness.summary(rates[name]), bitwise_vs_scan=exact)
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
