"""Micro-batches (``compile_step(..., micro_batches=m)``): temporaries and step time against the whole
batch at once (figure "micro_batch", or "micro_batch_<model>").

    python bench/bench_micro_batch.py [--model gpt|mlp] [--slices 2 4 8 16] [--rounds 5] [--calls 3] [--quick]

Models: ``gpt`` is issue 31's GPT-style model (tests/py/transformer.py: 8 blocks, width 256, 8 heads,
128 tokens, batch 16, vocab 512, AdamW); ``mlp`` a tanh MLP 64-512-512-512-1 on a batch of 2048,
Adam (the model of test_micro_batch's memory test). Every variant runs one step per call, the state
donated, the batch an argument: jax.jit of the step, and loopfuse with each number of slices.
Temporaries are XLA's (the compiled executables' memory stats). Steps/s: medians (min-max) of
interleaved rounds of `--calls` calls. The loss after 3 steps is compared with jax.jit's, relative.
"""
import sys
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import transformer  # noqa: E402
from problems import fresh, mlp_params, train_step  # noqa: E402

import loopfuse  # noqa: E402

STEPS = 3        # steps before the loss is compared


def model(name: str, quick: bool):
    """(step, state, batch) of model `name`."""
    if name == "gpt":
        return transformer.gpt(**(dict(transformer.TINY, batch=16) if quick else transformer.ISSUE))
    sizes, n = ((8, 32, 1), 64) if quick else ((64, 512, 512, 512, 1), 2048)
    opt = optax.adam(1e-3)
    params = mlp_params(sizes)
    rng = np.random.default_rng(1)
    batch = {"x": rng.normal(size=(n, sizes[0])).astype(np.float32), "y": rng.normal(size=(n, 1)).astype(np.float32)}
    return train_step(opt), (params, opt.init(params)), batch


def loss_after(call, state, batch) -> float:
    s = fresh(state)
    for _ in range(STEPS):
        s, aux = call(s, batch)
    return float(aux["loss"])


def main() -> None:
    ap = harness.parser(__doc__, rounds=5)
    ap.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    ap.add_argument("--slices", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--calls", type=int, default=3, help="calls of one step per round")
    ns = ap.parse_args()
    if ns.quick:
        vars(ns).update(rounds=2, calls=2, slices=[2, 4])
    out = harness.Report("micro_batch" if ns.model == "gpt" else f"micro_batch_{ns.model}", ns)
    harness.no_compile_cache()
    step, state, batch = model(ns.model, ns.quick)

    def keep_loss(fn):
        def only_loss(s, b):
            new, aux = fn(s, b)
            return new, {"loss": aux["loss"]}
        return only_loss

    step = keep_loss(step)
    calls = {"jax.jit": jax.jit(step, donate_argnums=0)}
    calls.update({f"loopfuse micro_batches={m}": loopfuse.compile_step(harness.fresh_fn(step), micro_batches=m)
                  for m in ns.slices})
    temps, seconds = {}, {}
    for n, call in calls.items():
        if isinstance(call, loopfuse.Step):
            compiled = call.compiled(state, batch)
            temps[n], seconds[n] = compiled.memory.temp, compiled.seconds.get("micro-batch", 0.0)
        else:
            temps[n] = call.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    losses = {n: loss_after(c, state, batch) for n, c in calls.items()}
    rates, _ = harness.step_rates(calls, {n: fresh(state) for n in calls}, batch, ns.rounds, ns.calls)
    reference = "jax.jit"
    lines = [f"{ns.model} ({'tiny, --quick' if ns.quick else 'full size'}); one step per call, donated; temporaries "
             f"from the compiled executables; steps/s: medians (min–max) of {ns.rounds} interleaved rounds of "
             f"{ns.calls} calls; loss after {STEPS} steps relative to jax.jit's", "",
             "| variant | temporaries MiB | vs jax.jit | steps/s | vs jax.jit | loss rel. diff | micro-batch pass s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    rows = {}
    for n in calls:
        c = harness.compare(rates[n], rates[reference], higher_is_better=True)
        diff = abs(losses[n] - losses[reference]) / abs(losses[reference])
        rows[n] = dict(temp=temps[n], steps_per_s=harness.summary(rates[n]), loss=losses[n], loss_rel_diff=diff)
        lines.append(f"| {n} | {harness.mib(temps[n])} | {temps[n] / temps[reference]:.2f}x | "
                     f"{np.median(rates[n]):.2f} ({harness.spread_text(rates[n], '{:.2f}')}) | "
                     f"{'—' if n == reference else harness.ratio_text(c)} | {diff:.1e} | "
                     f"{f'{seconds[n]:.2f}' if n in seconds else '—'} |")
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
