"""memory_limit: the remat budget and the micro-batch count whose compiled peak fits a memory limit.

**The peak** of a call is what the device must hold while it runs, by XLA's compiled figures: arguments +
outputs - aliased + temporaries (`runtime.MemoryStats.peak`; per device on a mesh). A limit is compared with
that, never with a run: nothing executes while a plan is chosen.

**Plans.** A plan is a `memory_budget` b (roll-layers; 1.0 the step as traced, then `BUDGETS`) and a
micro-batch count m (1, then every count the batch's rows divide into), in order of preference: the fewest
slices first (m from low to high), then the least recompute (b from high to low); an option given beside
the limit is kept as given. Slices before recompute: budget 0 recomputes each layer's forward once (at most
a third of a step's work), while each slice reads every parameter again and runs every kernel on 1/m of
the batch (on issue 31's GPT at batch 128 under 512 MiB, bench_memory_limit: the plan chosen, budget 0.25
in 4 slices, is the fastest that fits, 6.8 CPU seconds a step; the least recompute first chose the unrolled
step in 16 slices, 13.0). A plan whose program is an earlier plan's (a pass that declined: batch norm
refuses micro-batches, a run of layers not worth rolling; two budgets that save the same values) is that
plan, and the report says why, with the pass's own words (the op and its line).

**The model** predicts a plan's peak from programs compiled before it, so that a few compiles choose:

* the arguments, outputs and aliases are those of the program it is predicted from (plans do not change
  the calling convention);
* temporaries of the step rolled at budget b: those of the anchor a, the first rolled plan in order of
  preference (compiled when the choice reaches it, whatever the limit), plus the bytes b's loops hold
  beyond a's, ``T(b) = T(a) + W(b) - W(a)``, where W is the bytes of every
  ``stablehlo.while``'s results in the lowered program (what a forward loop saves per layer for the
  backward loop; measured on issue 31's GPT at batch 16: budget 0.25 and 0.5 predicted +48 and +80 MiB
  over budget 0, compiled +48 and +78);
* temporaries in m slices: the whole batch's beside its loops over m, plus the bytes the program's loops
  hold in slices (the micro-batch loop's accumulators, and a rolled plan's saved layers, now a slice's),
  ``T(b, m) = (T(b) - W(b)) / m + W(b, m)`` (the same GPT: 322.2, 173.7, 99.5 MiB predicted for m = 2, 4,
  8, compiled 322.2, 174.0, 92.2). A plan that rolls and slices is predicted low: the state-sized
  temporaries (the gradients, the update's) do not shrink with the slices (at batch 128: budget 0.5 in 4
  slices predicted 412 MiB, compiled 520): an estimate below the compiled figure costs compiles, never a plan.

W is read from the lowered program's types, the global shapes: on a mesh, where a loop's values are split
over the devices, it overstates a device's share, and the compiles confirm what the model leaves open.

**The choice**: the plans in order of preference; one predicted over the limit by more than `CLOSE` is
rejected uncompiled (in m slices, on the bound ``(T(b) - W(b)) / m`` where the pass is known to apply, so
that counts far off are not even lowered); any other is compiled (the step as traced and the anchor, which have
no prediction, too), and the first whose compiled peak fits is chosen. When none fits, the floor is the
least compiled peak among the plans predicted within `CLOSE` of the least prediction: chosen if it fits,
else `MemoryLimitError` names it and the buffers live at its peak. The choice is the program's, never a timing's: the same on every run.

**Why the peak never rises as the limit falls.** A plan's prediction does not depend on the limit (it is
made from the same anchors whatever the limit), so the plans that pass at a lower limit (predicted within
`CLOSE` of it, compiled within it) are among those that pass at a higher one. The most preferred of them
is the plan chosen at the higher limit if that one still passes, else a plan whose peak is within the lower
limit, below the one chosen before; the floor is one plan, whatever the limit.

`batch_fit.largest_batch` asks the same question of batch sizes: the largest that some plan fits, by a binary
search over powers of two on compiled figures.
"""
from dataclasses import dataclass, replace
from typing import Callable

from jaxlib.mlir import ir

from ..compile import compiler, pipeline
from ..compile.executable import Executable
from ..compile.options import StepOptions
from ..errors import MemoryLimitError
from ..passes.dataflow import tensor_bytes
from ..passes.module_pass import reports
from ..run.runtime import MemoryStats
from . import memory_report
from .memory_report import size_text

BUDGETS = (0.75, 0.5, 0.25, 0.0)    # the remat budgets tried below 1.0, the least recompute first
CLOSE = 0.10                        # a plan predicted within this share over the limit is compiled to see
DEVICE_MARGIN = 0.10                # memory_limit="device": this share of the device's memory is left free
FLOOR_BUFFERS = 5                   # the buffers a MemoryLimitError names
REPORT_FILE = "memory-limit.txt"    # the choice, in the chosen program's dump folder


def limit_bytes(limit: int | str, devices) -> int:
    """`limit` (`validate.memory_limit`'s form) in bytes on `devices`: ``"device"`` is the least
    ``bytes_limit`` of their `jax.Device.memory_stats` (what XLA's allocator may use) less `DEVICE_MARGIN`
    (the allocator's fragmentation and the arrays outside the call, which the compiled figures do not
    count); a device that reports none (a CPU) is a ValueError."""
    if limit != "device":
        return int(limit)
    found = []
    for d in devices:
        stats = d.memory_stats()
        if not stats or "bytes_limit" not in stats:
            raise ValueError(f"memory_limit=\"device\": {d.platform} device {d.id} reports no memory limit (its "
                             "memory_stats() has no bytes_limit, as on a CPU, whose memory is the host's); pass "
                             "the bytes instead, e.g. memory_limit=\"8GiB\"")
        found.append(stats["bytes_limit"])
    return int(min(found) * (1 - DEVICE_MARGIN))


@dataclass(frozen=True)
class Candidate:
    """One plan: roll-layers' `budget` (1.0: no rolling) and the micro-batch count `slices` (1: the whole
    batch)."""

    budget: float
    slices: int

    def options(self, base: StepOptions) -> StepOptions:
        """`base` under this plan (no memory limit left to plan)."""
        return replace(base, memory_budget=None if self.budget >= 1.0 else self.budget,
                       micro_batches=None if self.slices == 1 else self.slices, memory_limit=None)

    def __str__(self) -> str:
        parts = ([f"memory_budget={self.budget:g}"] if self.budget < 1.0 else []) + (
            [f"micro_batches={self.slices}"] if self.slices > 1 else [])
        return ", ".join(parts) or "as traced"


TRACED = Candidate(1.0, 1)


def preferred(c: Candidate) -> tuple:
    """`candidates`' order: the fewest slices, then the least recompute."""
    return c.slices, -c.budget


def candidates(options: StepOptions, counts: list[int]) -> list[Candidate]:
    """The plans, most preferred first (the fewest slices, then the least recompute): `options`' budget and
    micro-batches where given, else every count (1, `counts`) and budget (1.0, `BUDGETS`)."""
    budgets = [1.0, *BUDGETS] if options.memory_budget is None else [options.memory_budget]
    slices = [options.micro_batches] if options.micro_batches is not None else [1, *counts]
    return [Candidate(b, m) for m in slices for b in budgets]


class Programs:
    """The programs of one traced step under each plan: lowered (the passes) and compiled (XLA, or the
    compile cache) on demand, each once, and the peaks predicted from those compiled (the module docstring's
    model)."""

    def __init__(self, base: compiler.Plan):
        self.base = base
        self._lowered: dict = {}       # Candidate -> compiler.Lowered
        self._body: dict = {}          # Candidate -> the text of its lowered program's functions (`_body`)
        self._alike: dict = {}         # the text of a lowered program's functions -> the Candidates with it
        self._compiled: dict = {}      # Candidate -> Executable
        self._loops: dict = {}         # Candidate -> `_loop_bytes`
        self.anchor: Candidate | None = None     # the rolled one-slice plan the others are predicted from
        self.compiles = 0              # executables built (compiled by XLA or loaded from the compile cache)

    @classmethod
    def traced(cls, fn: Callable, options: StepOptions, state, batch, static: dict) -> "Programs":
        """The programs of ``fn(state, batch, **static)`` traced once under `options` (its limit left out)."""
        return cls(compiler.trace(fn, replace(options, memory_limit=None), state, batch, static))

    def lowered(self, c: Candidate) -> compiler.Lowered:
        if c not in self._lowered:
            self._lowered[c] = compiler.lower(compiler.replan(self.base, c.options(self.base.options)))
            self._body[c] = _body(self._lowered[c].text)
            self._alike.setdefault(self._body[c], []).append(c)
        return self._lowered[c]

    def is_lowered(self, c: Candidate) -> bool:
        return c in self._lowered

    def _alike_to(self, c: Candidate) -> list[Candidate]:
        """The plans lowered so far to `c`'s program (the text of its functions), `c` among them."""
        self.lowered(c)
        return self._alike[self._body[c]]

    def same_as(self, c: Candidate) -> Candidate | None:
        """The more preferred plan (`preferred`) lowered to the same program as `c` (the text of its functions), or
        None: whatever order plans were lowered in, a program is named after the plan `choose` would try first."""
        first = min(self._alike_to(c), key=preferred)
        return None if first == c else first

    def compiled(self, c: Candidate) -> Executable:
        """`c`'s executable: compiled once per program (a plan of the same program and XLA options as one compiled
        shares it)."""
        if c not in self._compiled:
            options = dict(self.lowered(c).xla.values)
            same = [p for p in self._alike_to(c)
                    if p in self._compiled and dict(self.lowered(p).xla.values) == options]
            if same:
                self._compiled[c] = self._compiled[same[0]]
            else:
                lowered = self.lowered(c)
                self._compiled[c] = compiler.compile(lowered.plan, lowered)
                self.compiles += 1
        return self._compiled[c]

    def peak(self, c: Candidate) -> int | None:
        """`c`'s compiled peak, None where it is not compiled yet."""
        return self._compiled[c].memory.peak if c in self._compiled else None

    def predicted(self, c: Candidate, *, bound: bool = False) -> int | None:
        """`c`'s peak by the model (the module docstring's), None where a program it is predicted from is not
        compiled yet; the step as traced and the anchor are their own compiled figures. With `bound`, a lower
        bound that needs no lowering of `c` (its loops' bytes left out) where `c` is sliced. A prediction
        never reads `c`'s own compile (so it is the same whatever was compiled before)."""
        figures = self._figures(c, bound)
        return None if figures is None else sum(figures)

    def _figures(self, c: Candidate, bound: bool = False) -> tuple[int, int] | None:
        """(arguments + outputs - aliased, temporaries) of `c` by the model."""
        if c == TRACED or c == self.anchor:
            if c not in self._compiled:
                return None
            m = self._compiled[c].memory
            return m.argument + m.output - m.alias, m.temp
        if c.slices == 1:
            anchor = None if self.anchor is None else self._figures(self.anchor)
            if anchor is None or c.budget >= 1.0:
                return None
            assert self.anchor is not None
            return anchor[0], anchor[1] + self._loop_bytes(c) - self._loop_bytes(self.anchor)
        one = Candidate(c.budget, 1)
        whole = self._figures(one)
        if whole is None:
            return None
        beside = max(whole[1] - self._loop_bytes(one), 0) // c.slices
        return whole[0], beside + (0 if bound else self._loop_bytes(c))

    def _loop_bytes(self, c: Candidate) -> int:
        """W: the bytes of the results of every ``stablehlo.while`` in `c`'s lowered program."""
        if c not in self._loops:
            self._loops[c] = _loop_bytes(self.lowered(c).module)
        return self._loops[c]


def _loop_bytes(module: ir.Module) -> int:
    """The bytes of the results of every ``stablehlo.while`` in `module`."""
    total = 0

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal total
        if op.name == "stablehlo.while":
            total += sum(tensor_bytes(r.type) for r in op.results)
        return ir.WalkResult.ADVANCE

    with module.context:
        module.operation.walk(visit)
    return total


def _body(text: str) -> str:
    """A lowered module's text less its first line (the module's attributes, which hold the passes'
    reports): two plans whose bodies are equal are one program."""
    return text.split("\n", 1)[-1]


@dataclass(frozen=True)
class Considered:
    """One plan as the choice saw it: its predicted and compiled peaks (None: not made) and the verdict."""

    plan: Candidate
    predicted: int | None
    compiled: int | None
    verdict: str


@dataclass(frozen=True)
class MemoryPlan:
    """The plan chosen under a memory limit (``Executable.reports["memory-limit"]``, `Step.memory_report`):
    `limit` in bytes, the `chosen` plan (``chosen.options(step_options)``), its `stats` (compiled) and `predicted` peak, the
    peak of the step as traced (`traced_peak`, where it was compiled), every plan `considered` up to the
    chosen one and the `compiles` the choice took."""

    limit: int
    chosen: Candidate
    stats: MemoryStats
    predicted: int | None
    traced_peak: int | None
    considered: tuple[Considered, ...]
    compiles: int

    def summary(self) -> str:
        """One line: the plan and its peak against the limit."""
        predicted = "" if self.predicted is None else f", predicted {size_text(self.predicted)}"
        traced = "" if self.traced_peak is None else f"; the step as traced: {size_text(self.traced_peak)}"
        return (f"memory_limit {size_text(self.limit)}: {self.chosen}, compiled peak {size_text(self.stats.peak)}"
                f"{predicted}{traced}")

    def __str__(self) -> str:
        return _table(self.summary(), self.considered, self.compiles)


def _table(head: str, considered, compiles: int) -> str:
    rows = [(str(c.plan), "-" if c.predicted is None else size_text(c.predicted),
             "-" if c.compiled is None else size_text(c.compiled), c.verdict) for c in considered]
    rows.insert(0, ("plan", "predicted", "compiled", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head, "peak: XLA's compiled arguments + outputs - aliased + temporaries; plans most preferred first "
             "(the fewest slices, then the least recompute):"]
    lines += ["  " + "  ".join(r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i]) for i in range(3))
              + "  " + r[3] for r in rows]
    lines.append(f"{compiles} program(s) compiled to choose")
    return "\n".join(lines)


@dataclass(frozen=True)
class Floor:
    """No plan fits the limit: the least peak of any plan (`plan`, `stats`) and what was considered."""

    limit: int
    plan: Candidate
    stats: MemoryStats
    considered: tuple[Considered, ...]
    compiles: int

    def error(self, programs: Programs) -> MemoryLimitError:
        """The error that names the floor and the buffers live at its peak (`memory_report`: one compile more)."""
        lowered = programs.lowered(self.plan)
        plan = lowered.plan
        report = memory_report.compile_report(lowered.module, plan.devices, lowered.xla.values,
                                              host_callbacks=plan.traced.effects.host_callbacks,
                                              batch_paths=plan.batch_paths, top=FLOOR_BUFFERS)
        buffers = "\n".join(f"  {size_text(b.bytes)} {b.shape} {b.kind} {b.what}" + (f" at {b.source}" if b.source else "")
                            for b in report.buffers)
        limit, floor = size_text(self.limit), size_text(self.stats.peak)
        if limit == floor:                    # a limit just under the floor: the bytes tell them apart
            limit, floor = f"{self.limit:,} B", f"{self.stats.peak:,} B"
        head = (f"memory_limit {limit} is below the floor of this step: the least peak of any plan is "
                f"{floor} ({self.plan}: {size_text(self.stats.argument)} arguments + "
                f"{size_text(self.stats.output)} outputs - {size_text(self.stats.alias)} aliased + {size_text(self.stats.temp)} "
                f"temporaries); the {len(report.buffers)} largest buffers live at its peak:\n{buffers}")
        return MemoryLimitError(_table(head, self.considered, self.compiles), floor=self.stats.peak,
                                plan=str(self.plan))


def choose(programs: Programs, limit: int, plans: list[Candidate]) -> MemoryPlan | Floor:
    """The most preferred of `plans` whose compiled peak fits `limit` (see the module docstring), or the
    `Floor` where none does."""
    seen: list[Considered] = []
    declined: set[float] = set()              # the budgets whose micro-batches the pass declined
    live: list[Candidate] = []                # plans with programs of their own, in order
    for c in plans:
        if c.slices > 1 and c.budget in declined:
            continue
        sliced_before = any(p.budget == c.budget and p.slices > 1 for p in live)   # its pass applies to that budget
        bound = programs.predicted(c, bound=True) if sliced_before else None
        if bound is not None and bound > limit * (1 + CLOSE):
            live.append(c)
            seen.append(Considered(c, bound, None, "over the limit (predicted at least), not compiled"))
            continue
        same = programs.same_as(c)
        if same is not None and same in plans:        # (a program no plan given has is this plan's own)
            why = _declined(programs, c, same)
            if why and c.slices > 1:
                declined.add(c.budget)
                alike = [p.slices for p in plans if p.budget == c.budget and p.slices > c.slices]
                why += f" (so with {alike[0]} to {alike[-1]} slices)" if alike else ""
            seen.append(Considered(c, None, None, why or f"the program of {same}"))
            continue
        live.append(c)
        if programs.anchor is None and c.budget < 1.0 and c.slices == 1:
            programs.anchor = c            # the first rolled plan, whatever the limit: compiled, then predicts
        predicted = programs.predicted(c)
        if predicted is not None and predicted > limit * (1 + CLOSE):
            seen.append(Considered(c, predicted, programs.peak(c), "over the limit, not compiled"
                                   if programs.peak(c) is None else "over the limit"))
            continue
        peak = programs.compiled(c).memory.peak
        if peak <= limit:
            seen.append(Considered(c, predicted, peak, "chosen"))
            return _chosen(programs, limit, c, predicted, seen)
        seen.append(Considered(c, predicted, peak, "over the limit"))
    return _floor(programs, limit, live, seen)


def _declined(programs: Programs, c: Candidate, same: Candidate) -> str:
    """Why `c`'s program is `same`'s where a pass of `c` declined (its report: the op and its line), else ""."""
    said = reports(programs.lowered(c).module.operation)
    if c.slices > 1 and same.slices == 1:
        return "declined: " + said.get("micro-batch", "")
    if c.budget < 1.0 and same.budget >= 1.0:
        return "declined: " + said.get("roll-layers", "")
    return ""


def _chosen(programs: Programs, limit: int, c: Candidate, predicted, seen) -> MemoryPlan:
    return MemoryPlan(limit, c, programs.compiled(c).memory, predicted,
                      programs.peak(TRACED), tuple(seen), programs.compiles)


def _floor(programs: Programs, limit: int, live: list[Candidate], seen: list) -> MemoryPlan | Floor:
    """After no plan fit: the plan of the least compiled peak among those predicted within `CLOSE` of the
    least prediction, chosen if it fits. A plan rejected on a lower bound is lowered for its prediction where
    the bound is within reach of the least."""
    exact: dict[Candidate, int] = {}
    for c in live:
        p = programs.predicted(c) if programs.is_lowered(c) else None
        if p is not None:
            exact[c] = p
    for c in sorted((c for c in live if c not in exact), key=lambda c: programs.predicted(c, bound=True) or 0):
        if (programs.predicted(c, bound=True) or 0) <= min(exact.values()) * (1 + CLOSE):
            exact[c] = programs.predicted(c) or 0
    least = min(exact.values())
    near = [c for c in live if c in exact and exact[c] <= least * (1 + CLOSE)]
    floor = min(near, key=lambda c: (programs.compiled(c).memory.peak, near.index(c)))
    stats = programs.compiled(floor).memory
    fits = stats.peak <= limit
    row = Considered(floor, exact[floor], stats.peak, "chosen: the least peak of all plans" if fits else
                     "the floor: over the limit")
    seen = [row if s.plan == floor else s for s in seen] + ([] if any(s.plan == floor for s in seen) else [row])
    if fits:
        return _chosen(programs, limit, floor, exact[floor], seen)
    return Floor(limit, floor, stats, tuple(seen), programs.compiles)


def build(fn: Callable, options: StepOptions, state, batch, static: dict) -> Executable:
    """The executable of ``fn(state, batch, **static)`` under `options`' memory limit: the plan chosen
    (`choose`) over one trace, its `MemoryPlan` on the executable; a `MemoryLimitError` where none fits."""
    programs = Programs.traced(fn, options, state, batch, static)
    plans = candidates(options, compiler.slice_counts(batch, options.placement))
    assert options.memory_limit is not None
    found = choose(programs, limit_bytes(options.memory_limit, programs.base.devices), plans)
    if isinstance(found, Floor):
        raise found.error(programs)
    dump = programs.lowered(found.chosen).plan.dump
    if dump is not None:
        pipeline.write_dump(dump, REPORT_FILE, str(found) + "\n")
    return replace(programs.compiled(found.chosen), memory_plan=found)



