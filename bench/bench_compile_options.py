"""XLA compile time with loopfuse's default XLA options (copy-free loop carry) vs without them (figure "compile_options").

    python bench/bench_compile_options.py [--leaves 100] [--rounds 3] [--json PATH]    # ~3 min on 2 cores

The Adam step over `--leaves` parameter leaves of bench_compile.py is traced and run through
loopfuse's passes once, as a step and as `.loop(10)`; then each final module is compiled by XLA
with loopfuse's options and with the copy-free option turned off, in interleaved rounds. Reports
the median (min-max) XLA compile CPU seconds of this process (robust on a shared machine) and the
ratio of medians (target: <= 1.2x), and the temp bytes of each executable.
"""
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
from bench_compile import problem  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse.compile import xla  # noqa: E402
from loopfuse.run import runtime  # noqa: E402

OFF = {"xla_cpu_copy_insertion_use_region_analysis": False}
TARGET = 1.2


def main() -> None:
    ap = harness.parser(__doc__, rounds=3)
    ap.add_argument("--leaves", type=int, default=100)
    ns = ap.parse_args()
    if ns.quick:
        ns.leaves, ns.rounds = 10, 2
    out = harness.Report("compile_options", ns)
    fn, state, batch = problem(ns.leaves)
    step = loopfuse.compile_step(fn)
    devices = [jax.devices()[0]]
    steps = {"step": step, "loop(10)": step.loop(10)}
    texts = {k: s.lower(state, batch)["final"] for k, s in steps.items()}
    chosen = {k: harness.loopfuse_options(s, state, batch) for k, s in steps.items()}
    temp = {}

    def compile_once(kind, label, options):
        def run():
            wall, cpu = harness.clocked(lambda: temp.__setitem__(
                (kind, label), runtime.MemoryStats.of(xla.compile_module(
                    texts[kind], devices, xla.compile_options(devices, options, shardy=False))).temp))
            return cpu
        return run
    variants = {(k, label): compile_once(k, label, o) for k in texts
                for label, o in (("defaults", chosen[k]), ("off", {**chosen[k], **OFF}))}
    cpu = harness.interleave(variants, ns.rounds)
    rows, lines = [], [f"Adam step over {ns.leaves} parameter leaves, XLA compile only (same module text; process CPU s, "
                       f"median (min–max)), {ns.rounds} interleaved rounds", "",
                       "| executable | XLA CPU s, defaults | XLA CPU s, copy-free off | defaults / off, ratio of medians "
                       "| target | temp, defaults | temp, off |", "|---|---:|---:|---:|---|---:|---:|"]
    for kind in texts:
        on, off = cpu[kind, "defaults"], cpu[kind, "off"]
        c = harness.compare(off, on, higher_is_better=False)
        cost = c["ratio"]  # median defaults / median off: > 1, the defaults compile slower
        rows.append(dict(kind=kind, defaults=harness.summary(on), off=harness.summary(off), cost=cost, **c,
                         temp_defaults=temp[kind, "defaults"], temp_off=temp[kind, "off"]))
        result = (f"{'PASS' if cost <= TARGET else 'MISS'} (<= {TARGET}x)")
        lines.append(f"| {kind} | {statistics_text(on)} | {statistics_text(off)} | {cost:.2f}x"
                     + ("" if c["measured"] else f", {harness.ratio_text(c)}") + f" | {result} | "
                     f"{harness.mib(temp[kind, 'defaults'])} MiB | {harness.mib(temp[kind, 'off'])} MiB |")
    out.section("\n".join(lines) + "\n", rows=rows)
    out.write()


def statistics_text(values) -> str:
    s = harness.summary(values)
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"


if __name__ == "__main__":
    main()
