"""Which programs keep the copy-free loop carry, and what forcing it does (figure "gate").

    python bench/bench_gate.py [--json PATH]       # ~3 min on 2 cores

For every program of the differential corpus (tests/py/corpus.py) and bench_loop's medium Adam MLP:
the XLA options loopfuse chose for its step and its `loop(3)` (from the executables), the
control flow and in-place updates that decided it, and whether one step and `loop(3)` compiled with the
option forced on (`xla_options={COPY_FREE: True}`) still equal `jax.jit` and loopfuse's `loop(3)` without
it, bitwise. Exact (no timing).
"""
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "py"))
import bench_loop  # noqa: E402
import harness  # noqa: E402
from corpus import PROGRAMS  # noqa: E402
from problems import fresh  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.compile import xla  # noqa: E402
from loopfuse.passes.control_flow import own_control_flow, own_in_place_updates  # noqa: E402

OPTION = xla.COPY_FREE[jax.devices()[0].platform]


def same(a, b) -> bool:
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def main() -> None:
    ap = harness.parser(__doc__, rounds=1)
    ns = ap.parse_args()
    out = harness.Report("gate", ns)
    size = bench_loop.SIZES["medium"]
    mlp = (bench_loop.train_step, bench_loop.init_state(size["layers"]), bench_loop.make_batch(size["layers"], size["batch"]))
    programs = {"MLP (bench_loop medium)": lambda: mlp, **PROGRAMS}
    names = list(programs)[:3] if ns.quick else list(programs)
    lines = ["| program | own control flow and in-place updates (traced) | step: copy-free | loop(3): copy-free | "
             "forced on: step equals jax.jit | forced on: loop(3) equals the default's |", "|---|---|---|---|---|---|"]
    rows = []
    for name in names:
        fn, state, batch = programs[name]()[:3]
        step = loopfuse.compile_step(fn)
        ops = {}
        module = step.compiled(state, batch).module.operation
        for op in own_control_flow(module) + own_in_place_updates(module):
            ops[op.name] = ops.get(op.name, 0) + 1
        on = {k: OPTION in s.compiled(state, batch).xla_options for k, s in (("step", step), ("loop", step.loop(3)))}
        expected = jax.jit(fn)(fresh(state), batch)
        forced = loopfuse.compile_step(fn, xla_options={OPTION: True})(fresh(state), batch)
        exact = same(forced, expected)
        loop_exact = same(loopfuse.compile_step(fn, xla_options={OPTION: True}).loop(3)(fresh(state), batch),
                          step.loop(3)(fresh(state), batch))
        changes = "**no: the option changes the result**"
        lines.append(f"| {name} | {', '.join(f'{n} x{c}' for n, c in sorted(ops.items())) or 'none'} | "
                     f"{'on' if on['step'] else 'off'} | {'on' if on['loop'] else 'off'} | "
                     f"{'yes' if exact else changes} | {'yes' if loop_exact else changes} |")
        rows.append(dict(program=name, control_flow=ops, step=on["step"], loop=on["loop"], forced_exact=exact,
                         forced_loop_exact=loop_exact))
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


if __name__ == "__main__":
    main()
