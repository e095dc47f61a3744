"""Micro-batches and rolled layers together on the models people write (issue 38 with issue 39's slices):
the temporaries of one step on bench_roll_models' models (figure "roll_micro_batch").

    python bench/bench_roll_micro_batch.py [--models linen,eqx,...] [--slices 4] [--quick]   # ~6 min on 2 cores

Per model (full size; ``--quick``: tiny), XLA's compiled temporaries of one donated step: jax.jit's as written,
and loopfuse's with ``memory_budget=0.0`` (rolled), ``micro_batches=m`` (sliced), and both, each on the state
given leaf by leaf (pytree) and packed with its layers stacked (``loopfuse.pack(state, layers=True)``, the layout
`fit` carries where layers roll). Memory only: the figures are exact, nothing is timed.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "py"))
import harness  # noqa: E402
import bench_roll_models as models  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402

MODELS = ("linen", "eqx", "gpt", "nnx31", "stem", "tied")


def temps(name: str, size: dict, slices: int) -> dict:
    """{variant: temporaries in bytes} of model `name`."""
    step, state, batch = models.MODELS[name](size)
    out = {"jax.jit": models.jit_temp(step, state, batch)}
    variants = {"rolled": dict(memory_budget=0.0), "sliced": dict(micro_batches=slices),
                "both": dict(memory_budget=0.0, micro_batches=slices)}
    for label, options in variants.items():
        call = loopfuse.compile_step(step, keep_aux=("loss",), **options)
        for layout in ("pytree", "packed"):
            s = loopfuse.pack(fresh(state), layers=True) if layout == "packed" else fresh(state)
            out[f"{label}, {layout}"] = call.memory_stats(s, batch).temp
    return out


def main() -> None:
    ap = harness.parser(__doc__, rounds=1)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(models.MODELS))
    ap.add_argument("--slices", type=int, default=4, help="micro-batches (the batch must divide into them)")
    ns = ap.parse_args()
    size = models.TINY if ns.quick else models.GPT
    slices = 2 if ns.quick else ns.slices
    out = harness.Report("roll_micro_batch", ns)
    found = {name: temps(name, size, slices) for name in ns.models.split(",")}
    columns = [k for k in next(iter(found.values())) if k != "jax.jit"]
    rows = [f"Temporaries, MiB (vs jax.jit's); {slices} slices; rolled: memory_budget=0.0", "",
            "| model | jax.jit | " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) + 1)]
    for name, t in found.items():
        ref = t["jax.jit"]
        rows.append(f"| {name} | {harness.mib(ref)} | " + " | ".join(f"{harness.mib(t[k])} ({t[k] / ref:.2f}x)"
                                                                      for k in columns) + " |")
    out.section("\n".join(rows), temps=found)
    out.write()


if __name__ == "__main__":
    main()
