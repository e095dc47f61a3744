"""The one harness of bench/*.py: arguments, interleaved rounds, statistics, environment line, output.

Every script measures the same way:

* `parser(doc, rounds=...)` gives ``--rounds``, ``--quick`` (a smoke test, not a measurement),
  ``--out`` (folder of NAME.md) and ``--json PATH``.
* `interleave(variants, rounds)` runs every variant once per round, the order alternating round
  by round, so a drift in machine load hits all alike.
* One statistic: per-side medians over rounds with their min-max, and the ratio of the medians
  (`compare`). A ratio whose sides' min-max ranges overlap is not a measured difference: it prints
  as "no difference measured (±N%)", N being the larger half-range of the two sides.
* Compile time (`compile_rounds`): every variant compiled afresh once per interleaved round, after
  an untimed warm-up that pays jax's and XLA's one-time costs; per variant the median (min-max)
  wall seconds, the median of each part (`PARTS`: loopfuse's `Executable.seconds`, jax.jit's lower
  and compile) and the time ratio to the reference as the median of per-round ratios (`paired_ratio`:
  both sides of a ratio compiled in the same round, under the same load). No persistent
  compile cache, loopfuse's or jax's (`no_compile_cache`).
* `Report` starts with the environment line (CPU, cores, load at start and end, versions, date,
  git commit) and writes NAME.md (the markdown pasted into BENCHMARKS.md) and the JSON: `save` as
  results come in (a run cut short keeps them), `write` at the end.
* Same configuration on both sides: `loopfuse_options` is the XLA options loopfuse compiled an
  executable with, and `jit` compiles the `jax.jit` reference with them (or without).

``python bench/harness.py paste BENCHMARKS.md bench/out`` replaces each block between
``<!-- figure: NAME -->`` and ``<!-- /figure -->`` in BENCHMARKS.md with bench/out/NAME.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


# ---- arguments and rounds -------------------------------------------------------------------
def parser(doc: str, rounds: int, compile_rounds: int | None = None) -> argparse.ArgumentParser:
    """The common arguments; ``--compile-rounds`` too when `compile_rounds` (its default) is given."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=rounds, help=f"interleaved rounds (default {rounds})")
    if compile_rounds is not None:
        ap.add_argument("--compile-rounds", type=int, default=compile_rounds,
                        help=f"interleaved rounds of compiling every variant (default {compile_rounds})")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds: a smoke test, not a measurement")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="folder for NAME.md")
    ap.add_argument("--json", type=Path, help="write the results as JSON to this path")
    return ap


def interleave(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list]:
    """{name: [what variants[name]() returned, per round]}: every variant once per round, the
    order alternating (forward on even rounds, reversed on odd ones)."""
    out: dict[str, list] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(variants[name]())
    return out


def step_rates(calls: dict, states: dict, batch, rounds: int, n: int) -> tuple[dict, dict]:
    """({name: steps/s per round}, {name: this process's CPU seconds per step per round}): `rounds`
    interleaved rounds of `n` calls ``states[name], _ = calls[name](states[name], batch)`` each (`states`
    updated in place). The CPU seconds (every XLA thread's) move less than the wall time on a shared machine."""
    def run(name):
        def calls_of():
            for _ in range(n):
                states[name], _ = calls[name](states[name], batch)
            return states[name]
        return lambda: clocked(calls_of)
    timed = interleave({name: run(name) for name in calls}, rounds)
    return ({name: [n / wall for wall, _ in t] for name, t in timed.items()},
            {name: [cpu / n for _, cpu in t] for name, t in timed.items()})


def clocked(fn: Callable[[], object], cpu: Callable[[], float] = time.process_time) -> tuple[float, float]:
    """(wall seconds, CPU seconds by `cpu`: this process's, or ``time.thread_time``, the calling thread's)
    of ``fn()``; jax results are waited for."""
    import jax
    t0, c0 = time.perf_counter(), cpu()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0, cpu() - c0


# ---- statistics -----------------------------------------------------------------------------
def summary(values: list[float]) -> dict:
    """Median and min-max of one side's per-round values."""
    return dict(median=statistics.median(values), min=min(values), max=max(values), rounds=list(values))


def half_range(values: list[float]) -> float:
    """Half the min-max range relative to the median (0.05 = ±5%)."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def compare(x: list[float], ref: list[float], higher_is_better: bool) -> dict:
    """`x` against `ref`: ``ratio`` > 1 means x is better (faster, smaller), from the medians.
    ``measured`` is False when the sides' min-max ranges overlap: the difference is inside the
    spread, ``spread`` (±) being the larger half-range of the two sides."""
    mx, mr = statistics.median(x), statistics.median(ref)
    ratio = mx / mr if higher_is_better else mr / mx
    measured = max(x) < min(ref) or max(ref) < min(x)
    return dict(ratio=ratio, measured=measured, spread=max(half_range(x), half_range(ref)))


def ratio_text(c: dict) -> str:
    """'1.53x' for a measured difference, else 'no difference measured (±N%)'."""
    if c["measured"]:
        return f"{c['ratio']:.2f}x"
    return f"no difference measured (±{100 * c['spread']:.0f}%)"


def spread_text(values: list[float], spec: str = "{:,.0f}") -> str:
    return f"{spec.format(min(values))}–{spec.format(max(values))}"


def ratio_table(values: dict[str, list[float]], reference: str, unit: str, spec: str = "{:,.0f}") -> list[str]:
    """The lines of a markdown table of each variant's per-round `values` in `unit` (median (min–max)) and its
    median over the `reference` variant's."""
    ref = statistics.median(values[reference])
    return [f"| variant | {unit} | vs {reference} |", "|---|---:|---:|",
            *(f"| {name} | {spec.format(statistics.median(v))} ({spread_text(v, spec)}) | "
              f"{statistics.median(v) / ref:.2f}x |" for name, v in values.items())]


def paired_ratio(x: list[float], ref: list[float]) -> dict:
    """`x` against `ref` round by round: the median (min-max) of ``x[i] / ref[i]``, each ratio of two
    values measured in the same round."""
    ratios = [a / b for a, b in zip(x, ref, strict=True)]
    return dict(ratio=statistics.median(ratios), min=min(ratios), max=max(ratios))


def paired_text(c: dict, reference: bool = False) -> str:
    return "1.00x (reference)" if reference else f"{c['ratio']:.2f}x ({c['min']:.2f}–{c['max']:.2f})"


def state_match(a, b) -> dict:
    """State `a` against the reference's `b` (a `loopfuse.PackedState` unpacked; compared as
    `ravel_pytree` flattens them, in leaf order): whether every element has the same bits, and the
    largest absolute and relative difference of an element, |a - b| and |a - b| / |b| (inf where b
    is 0 and a is not)."""
    import numpy as np
    from jax.flatten_util import ravel_pytree
    import loopfuse
    x, y = (np.asarray(ravel_pytree(s.unpack() if isinstance(s, loopfuse.PackedState) else s)[0]) for s in (a, b))
    bitwise = x.dtype == y.dtype and x.tobytes() == y.tobytes()
    x, y = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(x == y, 0.0, np.abs(x - y) / np.abs(y))
    return dict(bitwise_vs_scan=bitwise, max_abs_diff_vs_scan=float(np.nanmax(np.abs(x - y), initial=0.0)),
                max_rel_diff_vs_scan=float(np.nanmax(rel, initial=0.0)))


def match_text(row: dict) -> str:
    """A row's `state_match` as 'True', or 'False (max diff 2.0e-07, relative 1.3e-02)'."""
    return "True" if row["bitwise_vs_scan"] else (f"False (max diff {row['max_abs_diff_vs_scan']:.1e}, relative "
                                                   f"{row['max_rel_diff_vs_scan']:.1e})")


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f}"


# ---- same configuration on both sides --------------------------------------------------------
def loopfuse_options(step, state, batch) -> dict:
    """The non-default XLA options loopfuse compiled `step`'s executable for (state, batch) with."""
    return dict(step.compiled(state, batch).xla_options)


def jit(fn, options: dict | None = None, donate: bool = True):
    """`jax.jit(fn)` donating the state (argument 0) when `donate`, compiled with XLA `options`
    (None: as users write it). Called like any jitted function (same C++ call path)."""
    import jax
    return jax.jit(fn, donate_argnums=0 if donate else (), compiler_options=options)


def jit_memory(jitted, state, batch):
    """MemoryStats of `jitted`'s executable for (state, batch)."""
    from loopfuse import MemoryStats
    return MemoryStats.from_analysis(jitted.lower(state, batch).compile().memory_analysis())


def options_text(options: dict) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in sorted(options.items())) or "none"


# ---- compiled programs ----------------------------------------------------------------------
def optimized_hlo(call, state, batch) -> str:
    """The optimized HLO of what `call` runs for (state, batch): a loopfuse `Step`'s executable, or a
    jitted function's (lowered and compiled again, as its call compiled it)."""
    import loopfuse
    if isinstance(call, loopfuse.Step):
        return call.compiled(state, batch).executable.hlo_modules()[0].to_string()
    return call.lower(state, batch).compile().as_text()


_NO_CODE = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "call")


def distinct_fusions(hlo: str) -> tuple[int, int]:
    """(fusions, distinct fusions) of an optimized HLO module: XLA:CPU compiles a kernel per fusion whose
    computation is unlike every other's (the same ops on the same shapes, names and source lines aside), so
    the distinct ones are what its code generation costs; an unrolled stack of alike layers has many
    fusions and few distinct ones.

    Examples:
        >>> distinct_fusions('''%fused (p: f32[2]) -> f32[2] {
        ...   %p = f32[2]{0} parameter(0)
        ...   ROOT %n = f32[2]{0} negate(%p), metadata={source_line=3}
        ... }
        ... %fused.1 (q: f32[2]) -> f32[2] {
        ...   %q = f32[2]{0} parameter(0)
        ...   ROOT %m = f32[2]{0} negate(%q), metadata={source_line=9}
        ... }
        ... ENTRY %main (a: f32[2]) -> f32[2] {
        ...   %a = f32[2]{0} parameter(0)
        ...   %f = f32[2]{0} fusion(%a), kind=kLoop, calls=%fused
        ...   ROOT %g = f32[2]{0} fusion(%f), kind=kLoop, calls=%fused.1
        ... }''')
        (2, 1)
    """
    bodies = dict(re.findall(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)^}", hlo, re.S | re.M))

    def canonical(body: str) -> str:
        names: dict = {}
        body = re.sub(r", metadata=\{[^}]*\}", "", body)
        return re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m[0], f"%{len(names)}"), body)
    called = re.findall(r" fusion\([^\n]*?calls=%?([\w.\-]+)", hlo)
    return len(called), len({canonical(bodies[name]) for name in called})


def hlo_ops(hlo: str) -> dict[str, dict[str, int]]:
    """The instructions of an optimized HLO module that run code (fusions, copies, custom calls, while
    loops...; not parameters, tuples, bitcasts, constants or calls), counted by opcode: ``"loop body"``
    in the bodies of its while loops, ``"outside"`` in its entry computation; each with the computations
    they `call` (XLA:CPU wraps a small while loop in one).

    Examples:
        >>> hlo_ops('''%body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
        ...   %p = (s32[], f32[2]) parameter(0)
        ...   %f = (s32[], f32[2]{0}) fusion(%p), kind=kLoop, calls=%fused
        ...   ROOT %c = f32[2]{0} copy(%f)
        ... }
        ... %wrapped (t: (s32[], f32[2])) -> (s32[], f32[2]) {
        ...   ROOT %w = (s32[], f32[2]) while(%t), condition=%cond, body=%body
        ... }
        ... ENTRY %main (a: f32[2]) -> f32[2] {
        ...   %call = (s32[], f32[2]) call(%t), to_apply=%wrapped
        ...   ROOT %g = f32[2]{0} get-tuple-element(%call), index=1
        ... }''')
        {'loop body': {'copy': 1, 'fusion': 1}, 'outside': {'while': 1}}
    """
    comps = {name: [(_opcode(rhs), rhs) for rhs in re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+)$", text, re.M)]
             for name, text in re.findall(r"^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)^}", hlo, re.S | re.M)}
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M)

    def count(names) -> dict[str, int]:
        ops: dict[str, int] = {}
        names, seen = list(names), set()
        while names:
            name = names.pop()
            if name in seen:
                continue
            seen.add(name)
            for op, rhs in comps.get(name, []):
                if op == "call":
                    names += re.findall(r"to_apply=%?([\w.\-]+)", rhs)
                elif op is not None and op not in _NO_CODE:
                    ops[op] = ops.get(op, 0) + 1
        return dict(sorted(ops.items()))
    return {"loop body": count(set(re.findall(r"body=%?([\w.\-]+)", hlo))),
            "outside": count([entry.group(1)] if entry else [])}


def _opcode(rhs: str) -> str | None:
    """The opcode of an HLO instruction's right-hand side (its shape, a tuple's in parentheses, comes first)."""
    end = rhs.find(" ")
    if rhs.startswith("("):
        depth = 0
        for end, c in enumerate(rhs):
            depth += (c == "(") - (c == ")")
            if depth == 0:
                break
        end += 1
    m = re.match(r"\s*([\w-]+)\(", rhs[end:])
    return m.group(1) if m else None


def ops_text(ops: dict[str, int]) -> str:
    """'fusion 12, copy 2' (most first), or '—'."""
    return ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])) or "—"


# ---- compile time ---------------------------------------------------------------------------
# The parts of a compile, in seconds: "pack" (`loopfuse.pack`), "trace" (loopfuse's trace to
# StableHLO; for jax.jit, `.lower()`), each loopfuse pass by name, "xla" (XLA; for jax.jit,
# `.compile()`), "other" (the rest of the wall time: Python around them).
PARTS = ("pack", "trace", "xla", "other")


def no_compile_cache() -> None:
    """No compile cache on either side: $LOOPFUSE_CACHE_DIR unset, loopfuse's memory of the executables it
    compiled off (`cache.RECENT`), and jax's persistent cache off, so every timed compile runs XLA."""
    import jax
    from loopfuse.compile import cache
    os.environ.pop(cache.CACHE_ENV, None)
    cache.RECENT.size = 0
    cache.RECENT.clear()
    jax.config.update("jax_enable_compilation_cache", False)


def warm_trace(fn, *args) -> None:
    """Trace and lower `fn` (a fresh function object) for `args`, untimed: jax's caches of the
    functions it calls (traces and lowerings per shape) are then warm for every variant alike."""
    import jax
    jax.jit(fresh_fn(fn)).lower(*args)


def fresh_fn(fn: Callable) -> Callable:
    """A new function object calling `fn`: jax cannot reuse a trace of an earlier one."""
    return lambda *args: fn(*args)


def jit_compile(fn, *args, donate: bool = True):
    """`jax.jit(fn)` (a fresh function object; argument 0 donated when `donate`) lowered and
    compiled for `args`: (the compiled call, {"trace": lower seconds, "xla": compile seconds})."""
    import jax
    t0 = time.perf_counter()
    lowered = jax.jit(fresh_fn(fn), donate_argnums=0 if donate else ()).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, {"trace": t1 - t0, "xla": time.perf_counter() - t1}


def loopfuse_compile(fn, state, batch, *, steps: int, passes=None, pack: dict | None = None):
    """loopfuse's ``loop(steps)`` of `fn` (a fresh function object) compiled for (state, batch), or
    for ``loopfuse.pack(state, **pack)`` when `pack` is given: ((the loop, the state it takes),
    {part: seconds})."""
    import loopfuse
    parts = {}
    if pack is not None:
        t0 = time.perf_counter()
        state = loopfuse.pack(state, **pack)
        parts["pack"] = time.perf_counter() - t0
    loop = loopfuse.compile_step(fresh_fn(fn), passes=passes).loop(steps)
    parts.update(loop.compiled(state, batch).seconds)
    return (loop, state), parts


def compile_rounds(builds: dict, rounds: int) -> dict:
    """Interleaved rounds (`interleave`) of ``builds[name]() -> (built, {part: seconds})``, each a
    compile from nothing, timed whole (wall). {name: {"built": the last round's, "total": [seconds
    per round], "parts": [{part: seconds, "other": the rest of the total} per round]}}."""
    from loopfuse.compile import cache
    last = {}

    def timed(name):
        cache.RECENT.clear()            # a compile from nothing (where `no_compile_cache` was not called)
        t0 = time.perf_counter()
        last[name], parts = builds[name]()
        total = time.perf_counter() - t0
        return total, {**parts, "other": total - sum(parts.values())}
    got = interleave({name: (lambda name=name: timed(name)) for name in builds}, rounds)
    return {name: dict(built=last[name], total=[t for t, _ in got[name]], parts=[p for _, p in got[name]])
            for name in builds}


def compile_stats(timed: dict, reference: dict) -> dict:
    """One variant of `compile_rounds`' result against the reference's: median (min-max) seconds,
    the median of each part, the time ratio (`paired_ratio`, < 1: compiles faster)."""
    names = dict.fromkeys(k for p in timed["parts"] for k in p)
    return dict(seconds=summary(timed["total"]), vs_reference=paired_ratio(timed["total"], reference["total"]),
                parts={k: statistics.median(p.get(k, 0.0) for p in timed["parts"]) for k in names})


PARTS_HEADER = "| compile s | pack s | trace s | passes s | XLA s | other s | passes over 5% of the compile, s |"


def parts_cells(stats: dict) -> str:
    """`PARTS_HEADER`'s cells for one variant's `compile_stats`."""
    parts, total = stats["parts"], stats["seconds"]["median"]
    passes = {k: v for k, v in parts.items() if k not in (*PARTS, "cache")}
    big = ", ".join(f"{k} {v:.2f}" for k, v in sorted(passes.items(), key=lambda kv: -kv[1]) if v > 0.05 * total)
    cell = lambda k: f"{parts[k]:.2f}" if k in parts else "—"  # noqa: E731
    return (f"| {total:.2f} | {cell('pack')} | {cell('trace')} | "
            f"{f'{sum(passes.values()):.2f}' if passes else '—'} | {cell('xla')} | {cell('other')} | {big or '—'} |")


# ---- environment and report -------------------------------------------------------------------
def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def environment() -> dict:
    """CPU model, cores, load average now, versions, date and git commit of this checkout."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), cpu)
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "python", "passes", "bench"]).returncode:
            commit += "+changes"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return dict(cpu=cpu, cores=len(os.sched_getaffinity(0)), load_start=round(os.getloadavg()[0], 2),
                python=platform.python_version(), jax=_version("jax"), jaxlib=_version("jaxlib"),
                optax=_version("optax"), loopfuse=_version("loopfuse"), dispatch=_dispatch(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=commit)


def _dispatch() -> str:
    """The call route loopfuse's steps take here: "private" (jaxlib's C++ dispatcher) or "fallback"."""
    from loopfuse import _jax_compat
    return _jax_compat.status()["dispatch"]


def _shown(argv: list[str]) -> list[str]:
    """The arguments that change a figure (not where its output goes)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith(("--out=", "--json=")):
            skip = False
        elif a in ("--out", "--json"):
            skip = True
        else:
            out.append(a)
    return out


class Report:
    """One script's output: the environment line, markdown sections, JSON results."""

    def __init__(self, name: str, args: argparse.Namespace, command: str | None = None):
        self.name, self.args, self.sections, self.results = name, args, [], {}
        self.env, self.t0 = environment(), time.perf_counter()
        self.command = command or "python " + shlex.join([f"bench/{Path(sys.argv[0]).name}"] + _shown(sys.argv[1:]))

    def section(self, markdown: str, **results) -> None:
        """Add a markdown section (printed at once) and its results."""
        self.sections.append(markdown.rstrip() + "\n")
        self.results.update(results)
        print(markdown, flush=True)

    def env_line(self) -> str:
        e = self.env
        return (f"`{self.command}`: {e['cpu']}, {e['cores']} cores, load {e['load_start']} -> {e['load_end']}, "
                f"{e['wall_s']:.0f} s; python {e['python']}, jax {e['jax']}, jaxlib {e['jaxlib']}, optax {e['optax']}, "
                f"loopfuse {e['loopfuse']} ({e['commit']}, dispatch {e['dispatch']}); {e['date']}"
                + ("; **--quick: a smoke test, not a measurement**" if self.args.quick else ""))

    def save(self) -> str:
        """Write NAME.md (and the JSON) with what the report has so far (a run cut short keeps what
        it saved); returns the markdown."""
        self.env.update(load_end=round(os.getloadavg()[0], 2), wall_s=time.perf_counter() - self.t0)
        text = self.env_line() + "\n\n" + "\n".join(self.sections)
        self.args.out.mkdir(parents=True, exist_ok=True)
        (self.args.out / f"{self.name}.md").write_text(text)
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps(dict(environment=self.env, command=self.command, **self.results),
                                                 indent=2, default=str))
        return text

    def write(self) -> str:
        """`save`, then print the environment line and where the markdown went."""
        text = self.save()
        print(f"\n{self.env_line()}\nwrote {self.args.out / (self.name + '.md')}", flush=True)
        return text


# ---- BENCHMARKS.md ---------------------------------------------------------------------------
FIGURE = re.compile(r"(<!-- figure: (?P<name>[\w-]+) -->\n).*?(<!-- /figure -->)", re.S)


def paste(markdown: str, figures: dict[str, str]) -> str:
    """`markdown` with each figure block replaced by ``figures[name]`` (blocks without one kept)."""
    return FIGURE.sub(lambda m: m.group(1) + figures[m["name"]].rstrip() + "\n" + m.group(3)
                      if m["name"] in figures else m.group(0), markdown)


def main() -> None:
    ap = argparse.ArgumentParser(description="paste bench/out/NAME.md into BENCHMARKS.md's figure blocks")
    ap.add_argument("command", choices=["paste"])
    ap.add_argument("markdown", type=Path)
    ap.add_argument("out", type=Path)
    ns = ap.parse_args()
    figures = {p.stem: p.read_text() for p in ns.out.glob("*.md")}
    text = ns.markdown.read_text()
    missing = sorted(set(m["name"] for m in FIGURE.finditer(text)) - set(figures))
    ns.markdown.write_text(paste(text, figures))
    print(f"pasted {len(figures)} figures into {ns.markdown}" + (f"; no output for {missing}" if missing else ""))


if __name__ == "__main__":
    main()
