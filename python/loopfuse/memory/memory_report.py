"""Where a compiled program's peak memory comes from: the buffers live at its peak, each with the
line of the user's code that made it, and the live bytes over the program's schedule.

`compile_report` compiles the program once more, apart from the executable that calls run (the
normal compile path and its executable are untouched): with the module printed with its source
locations, and with XLA's dump options (``xla_dump_to`` a temporary folder, deleted before it
returns, and ``xla_dump_hlo_as_text``) added to the program's own XLA options. It reads XLA's
buffer assignment, live ranges and optimized HLO from the dump (see `xla_dump`). Without the live
ranges or the buffer assignment there is no report (`MemoryReportError` says what XLA wrote);
without the HLO or its source frames the report has no op names or source lines (its `notes` say so).

The text loopfuse normally hands XLA is printed without locations (XLA then sees the text's own line
numbers). With them the executable computes the same (measured: the same memory figures and
bitwise the same results on the corpus's transformer, RNN and diffrax programs, as fast to compile)
but XLA names some kernels differently, so its bits differ: the normal compile keeps the text as it
was, and only this report's compile prints the locations.

Live bytes at a position of the schedule are the bytes of the argument, output and temporary
allocations that hold a buffer live there (a buffer is live from the instruction that writes it to
the last one that reads it; one updated in place shares its operand's bytes; constants are part of
the executable and not counted). The executable allocates all of those allocations for the whole
call, which is ``memory_stats().peak`` (arguments + outputs - aliased + temporaries), so the peak of
the live bytes is at most that; the rest are allocated bytes that hold nothing live at the peak
(temporaries packed for other moments, outputs not yet written).
"""
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jax
from jaxlib.mlir import ir

from ..compile import xla
from ..compile.pipeline import write_atomic
from ..errors import MemoryReportError, warn
from ..passes.functions import arg_attrs, main_func
from ..passes.locations import in_library
from ..passes.vocabulary import STATE, STEP_INDEX, STOPPED
from ..run import runtime
from . import memory_timeline, xla_dump

REPORT_FILE, TIMELINE_FILE = "memory-report.txt", "memory-timeline.svg"
COUNTED = ("argument", "donated", "output", "temp")         # allocation kinds in memory_stats()


@dataclass(frozen=True)
class LiveBuffer:
    """One buffer live at the peak: its bytes, shape, allocation kind ("argument", "donated" (an
    argument updated in place), "output" or "temp"), HLO value name, what made it (jax's op name, or
    the argument it is), the user's line that made it (``file:line (function)``, None where the
    program has no location for it) and its live range (first and last schedule position)."""

    bytes: int
    shape: str
    kind: str
    name: str
    what: str
    source: str | None
    live: tuple[int, int]


@dataclass(frozen=True)
class MemoryReport:
    """The peak of one compiled program (per device on a mesh of `devices`; see the module docstring).

    `peak_bytes` are live at schedule position `peak_position` (while instruction `peak_instruction`
    runs); `live_bytes` has one entry per position, the last one after the last instruction (the
    outputs); `buffers` are the largest of the `buffers_at_peak` buffers live at the peak, largest
    first; `stats` the report executable's `runtime.MemoryStats` (``stats.peak >= peak_bytes``);
    `notes` what the report lacks or where XLA's figures disagree.
    """

    platform: str
    devices: int
    peak_bytes: int
    peak_position: int
    peak_instruction: str
    live_bytes: tuple[int, ...]
    buffers: tuple[LiveBuffer, ...]
    buffers_at_peak: int
    stats: runtime.MemoryStats
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        s = self.stats
        where = self.platform if self.devices == 1 else f"{self.platform}, per device of {self.devices}"
        lines = [f"peak on {where}: {size_text(self.peak_bytes)} live at schedule position "
                 f"{self.peak_position} of {len(self.live_bytes) - 1} ({self.peak_instruction})",
                 f"allocated per call: {size_text(s.peak)} = {size_text(s.argument)} arguments + "
                 f"{size_text(s.output)} outputs - "
                 f"{size_text(s.alias)} aliased + {size_text(s.temp)} temporaries (memory_stats); "
                 f"{size_text(s.peak - self.peak_bytes)} of it holds nothing live at the peak",
                 *self.notes,
                 f"the {len(self.buffers)} largest of {self.buffers_at_peak} buffers live at the peak:"]
        rows = [("bytes", "kind", "shape", "live", "HLO value", "made by", "source")] + [
            (size_text(b.bytes), b.kind, b.shape, f"{b.live[0]}-{b.live[1]}", b.name.removesuffix("{}"),
             _first(b.what), b.source or "-") for b in self.buffers]
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        lines += ["  " + "  ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  + "  " + r[6] for r in rows]
        return "\n".join(lines) + "\n"


def _first(op_name: str) -> str:
    """The first of the op names XLA joined with ";" when it fused ops (``mul;broadcast_in_dim``)."""
    first, *more = op_name.split(";")
    return first + (f" (+{len(more)} fused)" if more else "")


def compile_report(module: ir.Module, devices, xla_options: Mapping[str, Any], *, host_callbacks=(), batch_paths=(),
                   top: int = 10) -> MemoryReport:
    """Compile `module` (a lowered program: the module handed to XLA) for `devices` with its program's
    `xla_options` (``Lowered.xla.values``, `host_callbacks` its trace's) and XLA's dump into a temporary folder, and
    read its `MemoryReport` (the `top` largest buffers at the peak; `batch_paths` name the batch arguments);
    the folder is deleted before this returns."""
    with module.context:
        text = str(module.operation.get_asm(enable_debug_info=True))
    names = argument_names(module, batch_paths)
    with tempfile.TemporaryDirectory(prefix="loopfuse-memory-") as folder:
        dump = {**xla_options, "xla_dump_to": folder, "xla_dump_hlo_as_text": True}
        compiled = xla.compile_options(devices, dump, shardy=xla.uses_shardy(module))
        executable = xla.compile_module(text, devices, compiled, host_callbacks=host_callbacks)
        return read(Path(folder), runtime.MemoryStats.of(executable), devices[0].platform, len(devices), names, top)


def argument_names(module: ir.Module, batch_paths=()) -> list[str]:
    """The name of each argument of `module`'s @main: ``state<path>`` (or the effect token),
    ``batch<path>`` (`batch_paths` in order), ``start`` (a Dataset's step index) or ``stopped``
    (a loop's initial flag)."""
    with module.context:
        names, batch = [], 0
        for attrs in arg_attrs(main_func(module.operation)):
            if STATE in attrs:
                path = ir.StringAttr(attrs[STATE]).value
                names.append(path if path.startswith("<") else f"state{path}")
            elif STEP_INDEX in attrs or STOPPED in attrs:
                names.append("start" if STEP_INDEX in attrs else "stopped")
            else:
                names.append(f"batch{batch_paths[batch]}" if batch < len(batch_paths) else f"batch leaf {batch}")
                batch += 1
    return names


def read(folder: Path, stats: runtime.MemoryStats, platform: str, devices: int = 1, names=(),
         top: int = 10) -> MemoryReport:
    """The `MemoryReport` of the module XLA dumped into `folder`, compiled for `devices` devices of
    `platform` (`stats`: its executable's; `names`: @main's arguments)."""
    files = xla_dump.module_files(folder)
    if "buffers" not in files or "live_ranges" not in files:
        raise MemoryReportError(
            f"XLA (jax {jax.__version__}, {platform}) wrote no "
            f"{'buffer assignment' if 'buffers' not in files else 'live ranges'} for this program "
            f"(found {sorted(p.name for p in folder.iterdir())[:8] or 'nothing'}); a memory report reads "
            "XLA's *_after_optimizations-buffer-assignment.txt and -live-range.txt (the live ranges need the "
            "XLA option xla_dump_buffer_assignment_analysis, which xla_options= can set)")
    buffers = xla_dump.buffer_assignment(files["buffers"].read_text())
    ranges = xla_dump.live_ranges(files["live_ranges"].read_text())
    notes = []
    if "hlo" in files:
        hlo = xla_dump.hlo_module(files["hlo"].read_text())
        if not hlo.frames:
            notes.append("XLA's HLO has no source frames: no source lines")
    else:
        hlo = xla_dump.Hlo({}, {}, "", {}, {})
        notes.append("XLA wrote no optimized HLO: no op names or source lines")
    counted = {n: b for n, b in buffers.items() if b.allocation.kind in COUNTED and n in ranges.ranges}
    series = live_bytes(counted, ranges.ranges, ranges.end)
    peak = max(range(len(series)), key=series.__getitem__)
    allocated = sum({b.allocation.index: b.allocation.size for b in buffers.values()
                     if b.allocation.kind in COUNTED}.values())
    if allocated != stats.peak:
        notes.append(f"XLA's buffer assignment allocates {size_text(allocated)}, memory_stats {size_text(stats.peak)}")
    live = _distinct([b for n, b in counted.items() if ranges.ranges[n][0] <= peak <= ranges.ranges[n][1]],
                     ranges.ranges)
    live.sort(key=lambda b: (-b.size, b.name))
    shown = tuple(_describe(b, ranges.ranges[b.name], hlo, list(names)) for b in live[:top])
    return MemoryReport(platform, devices, series[peak], peak,
                        ranges.schedule[peak] if peak < len(ranges.schedule) else "the outputs", tuple(series),
                        shown, len(live), stats, tuple(notes))


def live_bytes(buffers: dict[str, xla_dump.Buffer], ranges: dict[str, tuple[int, int]], end: int) -> list[int]:
    """Per schedule position ``0..end``, the bytes of the allocations that hold a live buffer
    (buffers that share bytes, as an update in place does, count them once).

    Examples:
        >>> a = xla_dump.Allocation(0, 16, "temp")
        >>> x, y = xla_dump.Buffer("x{}", 8, 0, "f32[2]", a), xla_dump.Buffer("y{}", 8, 0, "f32[2]", a)
        >>> live_bytes({"x{}": x, "y{}": y}, {"x{}": (0, 1), "y{}": (1, 2)}, 3)   # y overwrites x in place
        [8, 8, 8, 0]
    """
    events: dict[int, list[tuple[int, xla_dump.Buffer]]] = {}
    for name, b in buffers.items():
        first, last = ranges[name]
        events.setdefault(first, []).append((1, b))
        events.setdefault(last + 1, []).append((-1, b))
    covered: dict[tuple[int, int], int] = {}     # (allocation, byte segment start) -> live buffers over it
    segments = _segments(buffers.values())
    total, series = 0, []
    for t in range(end + 1):
        for change, b in events.get(t, ()):
            for start, size in segments[b.name]:
                key = (b.allocation.index, start)
                before = covered.get(key, 0)
                covered[key] = before + change
                total += size if before == 0 else -size if before + change == 0 else 0
        series.append(total)
    return series


def _segments(buffers) -> dict[str, list[tuple[int, int]]]:
    """Each buffer's bytes cut at every buffer boundary in its allocation: (start, size) pieces that
    other buffers either cover whole or not at all."""
    cuts: dict[int, set[int]] = {}
    for b in buffers:
        cuts.setdefault(b.allocation.index, set()).update((b.offset, b.offset + b.size))
    ordered = {a: sorted(c) for a, c in cuts.items()}
    pieces = {}
    for b in buffers:
        edges = [c for c in ordered[b.allocation.index] if b.offset <= c <= b.offset + b.size]
        pieces[b.name] = [(s, e - s) for s, e in zip(edges, edges[1:])]
    return pieces


def _distinct(live: list[xla_dump.Buffer], ranges) -> list[xla_dump.Buffer]:
    """`live` without the buffers whose bytes a later-written live buffer reuses (an operand its
    last reader overwrites in place): the buffers that occupy distinct memory."""
    kept: list[xla_dump.Buffer] = []
    for b in sorted(live, key=lambda b: -ranges[b.name][0]):
        if not any(k.allocation is b.allocation and k.offset < b.offset + b.size and b.offset < k.offset + k.size
                   for k in kept):
            kept.append(b)
    return kept


def _describe(b: xla_dump.Buffer, live: tuple[int, int], hlo: xla_dump.Hlo, names: list[str]) -> LiveBuffer:
    instruction, loop = _origin(hlo, b.instruction, b.index)
    what, source = "", None
    if instruction is not None and instruction.opcode == "parameter" and instruction.computation == hlo.entry:
        number = instruction.operands[0]
        what = names[int(number)] if number.isdigit() and int(number) < len(names) else f"argument {number}"
    else:
        for made in (instruction, loop):    # the loop's own line where what it carries has none
            if made is not None and not (what or source):
                what, source = _made_by(hlo, made)
        what = re.sub(r"^jit\([^)]*\)/", "", what)     # the tracer's wrapper around the step function
    what = (what or b.name) + (" (loop carry)" if loop is not None else "")
    held = b.allocation.parameter
    if held is not None and held < len(names) and not what.startswith(names[held]):    # a donated argument's bytes
        what = f"{names[held]}, written in place by {_first(what)}"       # the step writes in place (rolled rows)
    return LiveBuffer(b.size, _without_layouts(b.shape), b.allocation.kind, b.name, what, source, live)


def _without_layouts(shape: str) -> str:
    """An HLO shape without its layouts.

    Examples:
        >>> _without_layouts("f32[2,3]{1,0}"), _without_layouts("(s32[], f32[1]{0})")
        ('f32[2,3]', '(s32[], f32[1])')
    """
    return re.sub(r"\{[^{}]*\}", "", shape)


def _origin(hlo: xla_dump.Hlo, name: str, index: tuple[int, ...]):
    """(the instruction that made the value `name{index}`, the loop that carries it or None),
    looking through tuples, copies XLA inserted, calls and loop carries."""
    loop = None
    for _ in range(64):
        instruction = hlo.instructions.get(name)
        if instruction is None:
            return None, loop
        caller = hlo.instructions.get(hlo.callers.get(instruction.computation, ""))
        if instruction.opcode == "tuple" and index:
            name, index = instruction.operands[index[0]], index[1:]
        elif instruction.opcode in ("copy", "bitcast") and not instruction.op_name:
            name = instruction.operands[0]
        elif instruction.opcode == "while":
            name, loop = instruction.operands[0], loop or instruction
        elif instruction.opcode == "parameter" and caller is not None and caller.opcode == "while":
            name, loop = caller.operands[0], loop or caller
        elif instruction.opcode == "parameter" and caller is not None and caller.opcode == "call":
            name = caller.operands[int(instruction.operands[0])]
        else:
            return instruction, loop
    return None, loop


def _made_by(hlo: xla_dump.Hlo, instruction: xla_dump.Instruction) -> tuple[str, str | None]:
    """jax's op name and the user's source line of `instruction` (of its fused root where the
    fusion itself has no metadata)."""
    if not instruction.op_name and instruction.frame is None and instruction.called:
        body = hlo.computations.get(instruction.called[0])
        if body:
            instruction = hlo.instructions[body[-1]]
    if instruction.source is not None:
        file, line = instruction.source
        return instruction.op_name, f"{_short(file)}:{line}"
    frame_id, seen = instruction.frame, set()
    while frame_id is not None and frame_id in hlo.frames and frame_id not in seen:
        seen.add(frame_id)
        frame = hlo.frames[frame_id]
        if not in_library(frame.file):
            return instruction.op_name, f"{_short(frame.file)}:{frame.line} ({frame.function})"
        frame_id = frame.parent
    return instruction.op_name, None


def _short(file: str) -> str:
    """`file` relative to the working directory when it is under it."""
    try:
        return os.path.relpath(file) if os.path.realpath(file).startswith(os.getcwd() + os.sep) else file
    except ValueError:
        return file


def size_text(n: int) -> str:
    """Bytes for people (reports and messages).

    Examples:
        >>> size_text(1536), size_text(12)
        ('1.5 KiB', '12 B')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def timeline(report: MemoryReport) -> str:
    """`report` as an SVG picture (`memory_timeline.svg`): live bytes over the schedule, the peak
    marked, and the live ranges of the buffers it lists."""
    bars = [(*b.live, f"{size_text(b.bytes)} {b.shape} {b.what}" + (f"  {b.source}" if b.source else ""))
            for b in report.buffers]
    return memory_timeline.svg(report.live_bytes, report.peak_position,
                               f"peak {size_text(report.peak_bytes)} at {report.peak_position} "
                               f"({report.peak_instruction})",
                               bars, f"live bytes over the schedule ({report.platform})")


def write(report: MemoryReport, folder: Path) -> None:
    """Write `report` into a program's dump folder: `REPORT_FILE` (the table) and `TIMELINE_FILE`
    (`timeline`); a folder that cannot be written warns."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / REPORT_FILE, str(report))
        write_atomic(folder / TIMELINE_FILE, timeline(report))
    except OSError as e:
        warn(f"loopfuse: memory report not written to {folder}: {e}")
