"""roll-layers on the stacks of blocks people write (issue 38), at full size (figure "roll_models").

    python bench/bench_roll_models.py [--models linen,eqx,...] [--compile-rounds 2] [--devices] [--quick]

Models (tests/py/layered.py, tests/py/transformer.py), AdamW, one step per call, the state donated,
the data an argument:

* ``linen``: a flax linen GPT, 8 blocks of width 256, 8 heads, 128 tokens, batch 16, vocab 512 (its
  blocks ``Block_0`` .. as ``@nn.compact`` submodules);
* ``eqx``: an equinox residual MLP, 12 blocks of 256 -> 1024 -> 256, batch 1024 (the first block reads
  the batch);
* ``gpt``: issue 31's GPT (a list of block dicts), same sizes as ``linen``;
* ``nnx``: bench_layers' flax nnx GPT (an ``nnx.List`` of 8 blocks, width 256, 4 heads, 32 tokens, batch 4);
  ``nnx31``: the same model at ``gpt``'s sizes (8 heads, 128 tokens, batch 16, vocab 512);
* ``stem``: ``gpt`` with an unlike first block (no residual) and an unlike last block (ReLU);
* ``scaled``: ``gpt`` with each residual branch scaled by ``1 / sqrt(2 (i + 1))``;
* ``tied``: a residual MLP of 8 blocks of width 1024, batch 64, each block also applying one matrix
  they all share (`layered.tied_mlp`: its gradient, summed over the layers, is what rolling must keep);
* ``clipped``: ``gpt`` with ``optax.chain(clip_by_global_norm(1.0), adamw)`` (every gradient is
  needed before the update: it runs after the backward loop);
* ``haiku``: residual blocks ``x + gelu(layer_norm(x) w + b)``, 12 of width 512, batch 1024, under haiku's
  module names (`layered.haiku_mlp`: ``block/linear``, ``block_1/linear``, ..; the first block reads the batch);
  ``haiku_flat``: the same, the modules created in the loop itself (``layer_norm_3``, ``linear_3``: two runs
  over the same layers, one layer's modules held apart);
* ``encdec``: two stacks, an encoder's 8 blocks ``x + tanh(x e_l)`` (the first reading the batch), then a
  decoder's 8 ``y + sin(y d_l + m v_l)``, each reading the encoder's output m as cross-attention does,
  width 512, batch 2048, Adam (`layered.two_stacks(cross=True)`: each stack rolls as a run of its own);
* ``autoenc``: an autoencoder, two stacks of the same block ``x + gelu(x w_l + b_l)``, 8 under ``['enc']``
  then 8 under ``['dec']``, width 512, batch 2048 (`layered.autoencoder`);
* ``llrd``: ``gpt`` with layer-wise learning rates, ``optax.multi_transform`` with a label per block (AdamW at
  3e-4 * 0.8 ** (8 - l); `layered.layer_wise_rates`: block l's moments under ``['l<l>']`` and ``['blocks'][l]``);
* ``multisteps``: gradient accumulation, ``optax.MultiSteps(adamw, every_k_schedule=2)`` on an RMS-norm MLP
  of 8 blocks of 256 -> 1024 -> 256, batch 256 (`layered.rms_mlp`; the update in a ``lax.cond`` over the
  whole state, run as selects: `passes/cond_to_select.py`);
* ``eqx_norm``: ``eqx`` with ``eqx.nn.LayerNorm`` before each block's MLP (`layered.eqx_mlp(norm=True)`: its
  ``jnp.var`` lowered in two forms, one at the first block, which reads the batch, and one at the others);
* ``normed_mse``: 8 blocks ``x + tanh(layer_norm(x) w_l)`` of width 512, batch 1024, the first reading the batch,
  the squared error against a target (`layered.normed_mlp(target=True)`: the loss's ``2 (x - y)`` is the op of
  the norm's ``2 (x - mean)``).

Per model: the layers rolled (roll-layers' report); temporaries from the compiled executables of
jax.jit (the step as written, donated) and of loopfuse at ``memory_budget=0.0``: the state as a
pytree (one `compile_step` call stacks it inside the call), the state packed with its layers
stacked (``pack(state, layers=True)``), and the program `fit` runs on a pytree state (its
``loop(2)`` on the state it carries, `chunks.carried`); the loss after 3 steps against jax.jit's,
relative. Compile time: interleaved rounds (harness.compile_rounds, no compile cache), each
compiling from nothing jax.jit's step and the program `fit` runs (trace, passes, XLA); apart from it,
the time `pack(state, layers=True)` takes, which `fit` pays once per call, compiled or cached. ``--devices``: the GPT data-parallel on 4 CPU devices (a subprocess), rolled against
unrolled loopfuse on the same mesh, per device.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import layered  # noqa: E402
import transformer  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.drivers import chunks  # noqa: E402

GPT = transformer.ISSUE
NNX = dict(layers=8, width=256, heads=4, seq=32, vocab=256, batch=4)
TINY = dict(layers=4, width=16, heads=2, seq=8, batch=2, vocab=32)
STEPS = 3
_HAIKU = {True: {"layers": 12, "width": 512, "batch": 1024}, False: {"layers": 4, "width": 8, "batch": 4}}
MODELS = {
    "linen": lambda size: layered.linen_gpt(**size),
    "eqx": lambda size: layered.eqx_mlp(**({"layers": 12, "width": 256, "hidden": 1024, "batch": 1024}
                                           if size is GPT else {"layers": 4, "width": 8, "hidden": 16, "batch": 4})),
    "gpt": lambda size: transformer.gpt(**size),
    "nnx": lambda size: transformer.nnx_gpt(**(NNX if size is GPT else size)),
    "nnx31": lambda size: transformer.nnx_gpt(**size),
    "stem": lambda size: layered.gpt_variant("stem_and_last", **size),
    "scaled": lambda size: layered.gpt_variant("depth_scaled", **size),
    "tied": lambda size: layered.tied_mlp(**({"layers": 8, "width": 1024, "batch": 64} if size is GPT else
                                             {"layers": 4, "width": 8, "batch": 4})),
    "clipped": lambda size: transformer.gpt(**size, opt=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-4))),
    "haiku": lambda size: layered.haiku_mlp(**_HAIKU[size is GPT]),
    "haiku_flat": lambda size: layered.haiku_mlp(**_HAIKU[size is GPT], blocks=False),
    "encdec": lambda size: layered.two_stacks(**({"layers": 8, "width": 512, "batch": 2048} if size is GPT else
                                                 {"layers": 3, "width": 8, "batch": 4}), cross=True),
    "autoenc": lambda size: layered.autoencoder(*((8, 8, 512, 2048) if size is GPT else (3, 3, 8, 4))),
    "llrd": lambda size: transformer.gpt(**size, opt=layered.layer_wise_rates(size["layers"], "blocks", 3e-4)),
    "multisteps": lambda size: layered.rms_mlp(*((8, 256, 256) if size is GPT else (3, 8, 4)),
                                               opt=optax.MultiSteps(optax.adamw(1e-3), every_k_schedule=2)),
    "eqx_norm": lambda size: layered.eqx_mlp(**({"layers": 12, "width": 256, "hidden": 1024, "batch": 1024}
                                                if size is GPT else {"layers": 4, "width": 8, "hidden": 16, "batch": 4}),
                                             norm=True),
    "normed_mse": lambda size: layered.normed_mlp(*((8, 512, 1024) if size is GPT else (4, 8, 4)), head=jnp.tanh,
                                                  target=True),
}


def jit_temp(step, state, batch) -> int:
    return jax.jit(step, donate_argnums=0).lower(fresh(state), batch).compile().memory_analysis().temp_size_in_bytes


def loss_after(call, state, batch) -> float:
    s = fresh(state)
    for _ in range(STEPS):
        s, aux = call(s, batch)
    return float(aux["loss"])


def measure(name: str, size: dict, compile_rounds: int) -> dict:
    step, state, batch = MODELS[name](size)
    call = loopfuse.compile_step(step, keep_aux=("loss",), memory_budget=0.0)
    stacked = loopfuse.pack(fresh(state), layers=True)
    carried, _, _ = chunks.carried(call.loop(2), fresh(state), batch)
    report = call.compiled(stacked, batch).reports["roll-layers"]
    ref = jit_temp(step, state, batch)
    temps = {"pytree": call.memory_stats(fresh(state), batch).temp, "packed": call.memory_stats(stacked, batch).temp,
             "fit": call.loop(2).memory_stats(carried, batch).temp}
    loss, ref_loss = loss_after(call, stacked, batch), loss_after(jax.jit(step), state, batch)

    def jit_build():
        return harness.jit_compile(step, fresh(state), batch)

    def fit_build():        # the program fit runs: its first chunk on the state it carries
        loop = loopfuse.compile_step(harness.fresh_fn(step), keep_aux=("loss",), memory_budget=0.0).loop(2)
        return loop, loop.compiled(stacked, batch).seconds

    def pack():             # not compiling: what fit pays on entry to carry the stacked layout, cached or not
        t0 = time.perf_counter()
        loopfuse.pack(state, layers=True)
        return time.perf_counter() - t0
    harness.warm_trace(step, state, batch)
    timed = harness.compile_rounds({"jax.jit": jit_build, "loopfuse (fit's program)": fit_build}, compile_rounds)
    stats = harness.compile_stats(timed["loopfuse (fit's program)"], timed["jax.jit"])
    return dict(report=_runs(report), jit_temp=ref, temps=temps, loss=loss, ref_loss=ref_loss,
                compile=stats, jit_compile=harness.summary(timed["jax.jit"]["total"]),
                pack=harness.summary([pack() for _ in range(max(compile_rounds, 3))]))


def _runs(report: str) -> str:
    """roll-layers' report in a cell: its line, or of several runs, each run's first leaves and layers."""
    lines = report.splitlines()
    if len(lines) == 1:
        return lines[0]
    return "; ".join(re.sub(r"^(rolled|did not roll) ((?:the update of )?\S+?),? .*?(\[\d+:\d+\]):.*", r"\1 \2 .. \3", line)
                     for line in lines)


def devices_row(quick: bool) -> dict:
    """The GPT on 4 CPU devices (data-parallel), in a subprocess with 4 host devices."""
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'tests' / 'py')!r})
import jax, loopfuse, transformer
from problems import fresh
step, state, tokens = transformer.gpt(**{TINY if quick else GPT!r})
devs = jax.devices()[:4]
out = {{}}
for name, kw, packed in [("unrolled", {{}}, False), ("rolled, pytree", dict(memory_budget=0.0), False),
                         ("rolled, packed", dict(memory_budget=0.0), True)]:
    call = loopfuse.compile_step(step, keep_aux=("loss",), devices=devs, **kw)
    s = loopfuse.pack(fresh(state), layers=True) if packed else fresh(state)
    out[name] = call.memory_stats(s, tokens).temp
print(json.dumps(out))
"""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = harness.parser(__doc__, rounds=1, compile_rounds=2)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--devices", action="store_true", help="also the GPT data-parallel on 4 CPU devices")
    ns = ap.parse_args()
    size = TINY if ns.quick else GPT
    if ns.quick:
        ns.compile_rounds = 1
    out = harness.Report("roll_models", ns)
    harness.no_compile_cache()
    rows = ["| model | rolled | jax.jit temp | pytree | packed | fit's program | loss rel. diff | compile: jax.jit s | "
            "fit's program s | ratio | passes s | pack s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    results = {}
    for name in ns.models.split(","):
        r = results[name] = measure(name, size, ns.compile_rounds)
        ref = r["jit_temp"]
        ratio = lambda n: f"{harness.mib(n)} ({n / ref:.2f}x)"  # noqa: E731
        c = r["compile"]
        passes = sum(v for k, v in c["parts"].items() if k not in ("pack", "trace", "xla", "other", "cache"))
        rows.append(f"| {name} | {r['report'][:90]} | {harness.mib(ref)} | {ratio(r['temps']['pytree'])} | "
                    f"{ratio(r['temps']['packed'])} | {ratio(r['temps']['fit'])} | "
                    f"{abs(r['loss'] - r['ref_loss']) / abs(r['ref_loss']):.1e} | {r['jit_compile']['median']:.2f} | "
                    f"{c['seconds']['median']:.2f} | {harness.paired_text(c['vs_reference'])} | {passes:.2f} | "
                    f"{r['pack']['median']:.2f} |")
        out.section("\n".join(rows[-1:]))
    out.sections.clear()
    out.section("\n".join(rows), models=results)
    if ns.devices:
        d = devices_row(ns.quick)
        out.section("GPT data-parallel on 4 CPU devices, temporaries per device: " + ", ".join(
            f"{k} {harness.mib(v)} ({v / d['unrolled']:.2f}x)" for k, v in d.items()), devices=d)
    out.write()


if __name__ == "__main__":
    main()
