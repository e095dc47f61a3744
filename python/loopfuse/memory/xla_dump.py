"""Reading what XLA writes with the compile options ``xla_dump_to`` and ``xla_dump_hlo_as_text``.

Three files per module, named ``module_NNNN.<name>.<platform>_after_optimizations<suffix>``:

- ``.txt``: the optimized HLO; each instruction's opcode, operands and metadata (jax's op name and
  a stack frame id into the FileNames/FunctionNames/FileLocations/StackFrames tables at the top);
- ``-buffer-assignment.txt``: the allocations (size; parameter, live-out, constant, thread-local or
  temporary) and in each the buffers (HLO values) with size, offset and shape;
- ``-live-range.txt``: the schedule (the while bodies flattened into it) and each buffer's first
  and last position in it.

Formats as jaxlib 0.10.2 and 0.12 write them on CPU (XLA's ``HloModule::ToString``,
``BufferAssignment::ToString`` and ``HloLiveRange::ToString``); lines of another form are skipped.
"""
import re
from dataclasses import dataclass
from pathlib import Path

STAGE = "_after_optimizations"
FILES = {"hlo": ".txt", "buffers": "-buffer-assignment.txt", "live_ranges": "-live-range.txt"}


def module_files(folder: Path) -> dict[str, Path]:
    """The dump files of the one optimized module in `folder`: {"hlo", "buffers", "live_ranges"}
    (those XLA wrote; the last module's where it dumped several)."""
    found = sorted(folder.glob(f"*{STAGE}{FILES['live_ranges']}")) or sorted(folder.glob(f"*{STAGE}{FILES['buffers']}"))
    if not found:
        return {}
    prefix = str(found[-1]).rsplit(STAGE, 1)[0] + STAGE
    return {kind: Path(prefix + suffix) for kind, suffix in FILES.items() if Path(prefix + suffix).is_file()}


@dataclass(frozen=True)
class Allocation:
    """One buffer allocation; `kind` is "argument", "donated" (an argument the outputs reuse),
    "output", "temp", "constant" or "thread-local"; `parameter` the argument's number (None for the others)."""

    index: int
    size: int
    kind: str
    parameter: int | None = None


@dataclass(frozen=True)
class Buffer:
    """One HLO value's place: ``name`` is the instruction and shape index (``dot.2{}``, ``while.1{3}``)."""

    name: str
    size: int
    offset: int
    shape: str
    allocation: Allocation

    @property
    def instruction(self) -> str:
        return self.name.split("{", 1)[0]

    @property
    def index(self) -> tuple[int, ...]:
        inside = self.name[self.name.index("{") + 1:-1]
        return tuple(int(i) for i in inside.split(",") if i.strip())


_ALLOCATION = re.compile(r"allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(r"\s*value: <\d+ ([^\s{>]+)(\{[\d,]*\})?(?: \(phi\))?(?: @\d+)?> "
                    r"\(size=(\d+),offset=(\d+)\): (.*)$")


def buffer_assignment(text: str) -> dict[str, Buffer]:
    """The buffers of a ``-buffer-assignment.txt``, by name (``instruction{index}``).

    Examples:
        >>> b = buffer_assignment('''allocation 0: size 16, parameter 1, shape |f32[4]| at ShapeIndex {}, maybe-live-out:
        ...  value: <3 p @0> (size=16,offset=0): f32[4]{0}
        ... allocation 1: size 40, preallocated-temp:
        ...  value: <5 w{1} (phi) @0> (size=8,offset=32): f32[2]{0}''')
        >>> b["p{}"].allocation.kind, b["p{}"].allocation.parameter, b["w{1}"].allocation.kind, b["w{1}"].offset
        ('donated', 1, 'temp', 32)
    """
    buffers: dict[str, Buffer] = {}
    allocation = None
    for line in text.splitlines():
        m = _ALLOCATION.match(line)
        if m:
            allocation = _allocation(int(m[1]), int(m[2]), m[3])
            continue
        m = _VALUE.match(line)
        if m and allocation is not None:
            name = m[1] + (m[2] or "{}")
            buffers[name] = Buffer(name, int(m[3]), int(m[4]), m[5].strip(), allocation)
    return buffers


def _allocation(index: int, size: int, attributes: str) -> Allocation:
    live_out = "maybe-live-out" in attributes
    parameter = re.search(r", parameter (\d+)", attributes)
    kind = ("donated" if live_out else "argument") if parameter else \
        "output" if live_out else "constant" if ", constant" in attributes else \
        "thread-local" if "thread-local" in attributes else "temp"
    return Allocation(index, size, kind, int(parameter[1]) if parameter else None)


@dataclass(frozen=True)
class LiveRanges:
    """The flattened schedule (instruction names by position) and each buffer's ``(first, last)``
    position; positions run from 0 to `end` (the end of the program, where its outputs live)."""

    schedule: tuple[str, ...]
    ranges: dict[str, tuple[int, int]]
    end: int


_RANGE = re.compile(r"\s+(\S+\{[\d,]*\}):(\d+)-(\d+)\s*$")
_POSITION = re.compile(r"\s+(\d+):(\S+)\s*$")


def live_ranges(text: str) -> LiveRanges:
    """The schedule and live ranges of a ``-live-range.txt``.

    Examples:
        >>> r = live_ranges('''HloLiveRange (max 2):
        ...   InstructionSequence:
        ...     0:p
        ...     1:add
        ...   BufferLiveRange:
        ...     p{}:0-1
        ...     add{}:1-2''')
        >>> r.schedule, r.ranges["add{}"], r.end
        (('p', 'add'), (1, 2), 2)
    """
    schedule: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    end, section = 0, ""
    for line in text.splitlines():
        head = re.match(r"HloLiveRange \(max (\d+)\)", line)
        if head:
            end = int(head[1])
        elif line.strip().endswith(":") and not line.startswith("    "):
            section = line.strip()
        elif section == "InstructionSequence:" and (m := _POSITION.match(line)):
            schedule.append(m[2])
        elif section == "BufferLiveRange:" and (m := _RANGE.match(line)):
            ranges[m[1]] = (int(m[2]), int(m[3]))
    return LiveRanges(tuple(schedule), ranges, max(end, len(schedule)))


@dataclass(frozen=True)
class Frame:
    """One source frame: file, line and function, and the frame that called it (None at the top)."""

    file: str
    line: int
    function: str
    parent: int | None


@dataclass(frozen=True)
class Instruction:
    """One optimized HLO instruction: what it computes from what, and where it came from."""

    name: str
    opcode: str
    operands: tuple[str, ...]
    computation: str
    called: tuple[str, ...]        # computations it calls (fusion, while body and condition, ...)
    op_name: str
    frame: int | None              # stack frame id
    source: tuple[str, int] | None  # (file, line) where XLA names them directly instead of a frame


@dataclass(frozen=True)
class Hlo:
    """An optimized HLO module: its instructions (by name), computations (name -> its instructions
    in order, the root last), entry computation and source frames (by id)."""

    instructions: dict[str, Instruction]
    computations: dict[str, list[str]]
    entry: str
    frames: dict[int, Frame]
    callers: dict[str, str]        # computation -> the instruction that calls it (fusion, while, call, ...)


_COMPUTATION = re.compile(r"(ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"\s+(ROOT\s+)?%?([^\s=]+)\s*=\s*")


def hlo_module(text: str) -> Hlo:
    """The instructions and source frames of an optimized HLO module's text.

    Examples:
        >>> h = hlo_module('''HloModule m
        ...
        ... FileNames
        ... 1 "a.py"
        ...
        ... FunctionNames
        ... 1 "f"
        ...
        ... FileLocations
        ... 1 {file_name_id=1 function_name_id=1 line=7 end_line=7 column=1 end_column=2}
        ...
        ... StackFrames
        ... 1 {file_location_id=1 parent_frame_id=1}
        ...
        ... ENTRY %main (p: f32[2]) -> f32[2] {
        ...   %p = f32[2]{0} parameter(0), metadata={op_name="args[0]"}
        ...   ROOT %s = f32[2]{0} sine(%p), metadata={op_name="jit(f)/sin" stack_frame_id=1}
        ... }''')
        >>> h.instructions["s"].operands, h.instructions["s"].op_name, h.frames[1]
        (('p',), 'jit(f)/sin', Frame(file='a.py', line=7, function='f', parent=None))
    """
    instructions: dict[str, Instruction] = {}
    computations: dict[str, list[str]] = {}
    entry, computation = "", None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            head = _COMPUTATION.match(line)
            computation = head[2] if head else None
            if head:
                computations[head[2]] = []
                entry = head[2] if head[1] else entry
            continue
        m = _INSTRUCTION.match(line)
        if computation is None or not m:
            continue
        rest = line[m.end():]
        rest = rest[_balanced(rest, 0):] if rest.startswith("(") else rest.split(" ", 1)[-1]
        op = re.match(r"\s*([\w\-]+)\(", rest)
        if not op:
            continue
        close = _balanced(rest, op.end() - 1)
        operands = tuple(_operand_names(rest[op.end():close - 1]))
        attributes = rest[close:]
        metadata = _metadata(attributes)
        source = re.search(r'source_file="([^"]*)" source_line=(\d+)', metadata)
        frame = re.search(r"stack_frame_id=(\d+)", metadata)
        op_name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', metadata)
        instructions[m[2]] = Instruction(
            m[2], op[1], operands, computation,
            tuple(re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=\{?%?([\w.\-]+)", attributes)),
            op_name[1] if op_name else "", int(frame[1]) if frame else None,
            (source[1], int(source[2])) if source and source[1] != "-" else None)
        computations[computation].append(m[2])
    callers = {c: i.name for i in instructions.values() for c in i.called}
    return Hlo(instructions, computations, entry, _frames(text), callers)


def _balanced(text: str, start: int) -> int:
    """The index after the parenthesis that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def _operand_names(operands: str) -> list[str]:
    """The instruction names in an operand list (``%a, %b``, or printed long ``f32[2]{0} %a``), else
    its literal entries (a parameter's number: ``parameter(0)``)."""
    if "%" in operands:
        return re.findall(r"%([\w.\-]+)", operands)
    return [o.strip() for o in operands.split(",") if o.strip()]


def _metadata(attributes: str) -> str:
    """The inside of ``metadata={...}`` (quoted strings may hold braces)."""
    m = re.search(r'metadata=\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}', attributes)
    return m[1] if m else ""


def _frames(text: str) -> dict[int, Frame]:
    """The StackFrames table with files, lines and functions filled in.

    XLA prints each frame's parent id plus one (``HloModule::ToString``: 1 for a frame without a
    parent, since frame ids start at 1 and 0 means none); the first frame never has a parent, so
    where it prints 0 the ids are taken as printed."""
    tables: dict[str, dict[int, str]] = {}
    table = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = tables.setdefault(line, {})
        elif table is not None and (m := re.match(r"(\d+) (.*)$", line)):
            table[int(m[1])] = m[2]
        else:
            table = None
    files = {k: _unquote(v) for k, v in tables.get("FileNames", {}).items()}
    functions = {k: _unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locations = {k: _fields(v) for k, v in tables.get("FileLocations", {}).items()}
    stack = {k: _fields(v) for k, v in tables.get("StackFrames", {}).items()}
    shift = 0 if stack.get(1, {}).get("parent_frame_id") == 0 else 1
    frames = {}
    for k, f in stack.items():
        loc = locations.get(f.get("file_location_id", 0), {})
        parent = f.get("parent_frame_id", shift) - shift
        frames[k] = Frame(files.get(loc.get("file_name_id", 0), "?"), loc.get("line", 0),
                          functions.get(loc.get("function_name_id", 0), "?"), parent if parent in stack and parent != k else None)
    return frames


def _unquote(text: str) -> str:
    return text[1:-1] if text.startswith('"') and text.endswith('"') else text


def _fields(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", text)}
