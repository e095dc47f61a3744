"""loopfuse-opt: an mlir-opt style driver for loopfuse's passes (used by the lit tests).

    loopfuse-opt in.mlir --pass-pipeline='builtin.module(drop-unused-outputs,alias-state)'
    loopfuse-opt in.mlir --alias-state --simplify -o out.mlir
    loopfuse-opt - --split-input-file --simplify < in.mlir
    loopfuse-opt --reproducer DIR/reproducer.mlir     # replay a failure written by compile_step

Errors are one line each, ``file:line:col: error: message`` (a pass failure names the pass), and
the exit status is 1; loopfuse-opt prints no traceback and leaves the ``-o`` file as it was.
"""
import argparse
import contextlib
import os
import re
import sys
import tempfile
import textwrap
from typing import Iterator

from jaxlib.mlir import ir, passmanager

from ..compile.mlir_context import make_context
from ..compile.pass_manager import Pass, PassFailure, UpstreamPass, parse_pipeline, run_pass, upstream_error
from ..passes import PASSES
from ..passes.module_pass import option_name
from ..passes.vocabulary import PIPELINE_HEADER, SPLIT_MARKER

MAX_NESTING = 1000  # deeper regions, types or attributes would overflow the MLIR parser's stack
# Upstream passes a reproducer may name: they only rewrite the module (no files, no output).
REPLAYABLE_UPSTREAM = frozenset({
    "canonicalize", "cse", "inline", "sccp", "symbol-dce", "symbol-privatize", "loop-invariant-code-motion",
    "control-flow-sink", "strip-debuginfo"})


class OptError(Exception):
    """A problem with the command's input or output; the message is ready to print."""


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps help at spaces only, so pass and option names (wrap-loop, min-group) stay whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Exits with status 1 on a bad command line (argparse's default is 2), as on any other error."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _args(argv):
    p = _Parser(prog="loopfuse-opt", description=__doc__.splitlines()[0],
                formatter_class=_HelpFormatter,
                epilog="--pass-pipeline also takes MLIR's own passes (canonicalize, cse, ...).")
    p.add_argument("input", nargs="?", default="-", help="input .mlir file, '-' for stdin")
    p.add_argument("-o", dest="output", default="-",
                   help="output file (default stdout), written only when the whole run succeeds")
    p.add_argument("--pass-pipeline", default=None, help="builtin.module(pass1,pass2{opt=v},...)")
    p.add_argument("--split-input-file", action="store_true", help=f"treat '{SPLIT_MARKER}' lines as file separators")
    p.add_argument("--reproducer", action="store_true",
                   help=f"take the pipeline from the input's '{PIPELINE_HEADER.strip()}' line (upstream passes "
                        f"only from: {', '.join(sorted(REPLAYABLE_UPSTREAM))})")
    group = p.add_argument_group(
        "loopfuse passes", "each flag runs one pass with default options, after --pass-pipeline, in "
                           "command-line order; give options in a pipeline: builtin.module(wrap-loop{steps=4})")
    for name, cls in PASSES.items():
        group.add_argument(f"--{name}", dest="single", action="append_const", const=name, help=_pass_help(cls))
    return p.parse_args(argv)


def _pass_help(cls) -> str:
    """The summary of a pass and, per option, ``name=<type> (default, range): help``."""
    lines = [cls.summary + "."]
    for f in cls.options():
        low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
        bounds = "".join([f", >= {low}" if low is not None else "", f", <= {high}" if high is not None else ""])
        lines.append(f"Option {option_name(f)}=<{f.type.__name__}> (default {f.default}{bounds}): {f.metadata['help']}.")
    return " ".join(lines)


def _pipeline(ns, text: str, name: str) -> list[Pass]:
    passes = []
    if ns.reproducer:
        header = next((line for line in text.splitlines() if line.startswith(PIPELINE_HEADER)), None)
        if header is None:
            raise OptError(f"{name}: error: --reproducer input has no '{PIPELINE_HEADER.strip()}' line")
        passes += _replayable(parse_pipeline(header[len(PIPELINE_HEADER):]), name)
    if ns.pass_pipeline:
        passes += parse_pipeline(ns.pass_pipeline)
    return [_checked(p) for p in passes] + [PASSES[n]() for n in ns.single or []]


def _checked(spec: Pass) -> Pass:
    """`spec` once MLIR's registry takes it, checked before any chunk runs (a ValueError naming it and why not:
    an unknown upstream pass, a bad option, with the line LLVM's option parser writes to stderr itself, which
    came out bare, then the failure once per chunk)."""
    if not isinstance(spec, UpstreamPass):
        return spec
    with make_context(), _stderr_captured() as said:
        try:
            passmanager.PassManager("builtin.module").add(str(spec))
            return spec
        except ValueError as e:
            error = e
    llvm = " ".join("".join(said).split()).lstrip(": ")
    raise ValueError(f"pass '{spec}': {upstream_error(str(error))}" + (f" ({llvm})" if llvm else ""))


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """What native code writes to file descriptor 2 inside, as the text of the list it yields (at the end)."""
    sys.stderr.flush()
    said: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            said.append(f.read().decode(errors="replace"))


def _replayable(passes: list[Pass], name: str) -> list[Pass]:
    """A reproducer's passes, refusing upstream passes that may have effects outside the module."""
    for p in passes:
        if isinstance(p, UpstreamPass) and (p.name not in REPLAYABLE_UPSTREAM or p.options):
            raise OptError(f"{name}: error: the reproducer's pipeline names '{p}', which --reproducer does not "
                           f"replay: upstream passes only from {', '.join(sorted(REPLAYABLE_UPSTREAM))}, without "
                           "options (run it with --pass-pipeline if you trust the file)")
    return passes


class ChunkError(Exception):
    """One input chunk failed to parse or to pass; the message is ready to print."""


def _process(chunk: str, name: str, first_line: int, passes) -> str:
    """Parse and transform one chunk that starts at line `first_line` (1-based) of the input."""
    _check_nesting(chunk, name, first_line)
    with make_context(), ir.Location.unknown():
        try:
            module = ir.Module.parse(chunk)
        except ir.MLIRError as e:
            diagnostics = [(d.location, d.message) for d in e.error_diagnostics or []]
            raise ChunkError(_located(diagnostics, name, first_line) or f"{name}:{first_line}: error: {e}") from None
        for p in passes:
            try:
                run_pass(module, p)
            except PassFailure as e:
                prefix = f"pass '{p}' failed: "
                raise ChunkError(_located(e.diagnostics, name, first_line, prefix)
                                 or f"{name}:{first_line}: error: {e}") from None
        return str(module)


_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')


def _located(diagnostics, name: str, first_line: int, prefix: str = "") -> str:
    """Diagnostics as ``file:line:col: error: ...``, lines counted in the whole input file.

    A location in the parsed text itself (MLIR names it "-") is mapped into `name`; an explicit
    ``loc("other.py":3:1)`` is printed as written; a location without a file or line (an implicit
    module's is "-":0:0) names the chunk's first line.
    """
    lines = []
    for loc, message in diagnostics:
        m = _FILE_LOC.search(str(loc))
        if m is None or m.group(1) == "-" and m.group(2) == "0":
            where = f"{name}:{first_line}"
        elif m.group(1) == "-":
            where = f"{name}:{int(m.group(2)) + first_line - 1}:{m.group(3)}"
        else:
            where = f"{m.group(1)}:{m.group(2)}:{m.group(3)}"
        lines.append(f"{where}: error: {prefix}{message}")
    return "\n".join(lines)


_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|->|[{(\[<]|[})\]>]|\n')


def _check_nesting(text: str, name: str, first_line: int) -> None:
    """Refuse text nested deeper than MAX_NESTING brackets (regions, types, attributes), which
    would crash the parser; strings and comments are skipped."""
    depth, line = 0, first_line
    for m in _BRACKETS.finditer(text):
        token = m.group()
        if token == "\n":
            line += 1
        elif token in "{([<":
            depth += 1
            if depth > MAX_NESTING:
                raise ChunkError(f"{name}:{line}: error: nesting deeper than {MAX_NESTING} levels of brackets "
                                 f"(regions, types, attributes): refused before parsing")
        elif token in "})]>":
            depth = max(depth - 1, 0)


def _chunks(text: str, split: bool):
    """(first line number, text) of each chunk: the whole text, or the pieces between marker lines."""
    if not split:
        return [(1, text)]
    chunks: list[tuple[int, str]] = []
    lines: list[str] = []
    first = 1
    for n, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.rstrip() == SPLIT_MARKER:
            chunks.append((first, "".join(lines)))
            lines, first = [], n + 1
        else:
            lines.append(line)
    chunks.append((first, "".join(lines)))
    return chunks


def _read(path: str) -> tuple[str, str]:
    """(display name, text) of the input; OptError for a missing file or non-UTF-8 bytes."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as e:
        raise OptError(f"{name}: error: cannot read the input: {e.strerror or e}") from None
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise OptError(f"{name}:{line}:{col}: error: the input is not UTF-8 text "
                       f"(byte 0x{data[e.start]:02x})") from None


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        raise OptError(f"{path}: error: cannot write the output: {e.strerror or e}") from None


def main(argv=None) -> int:
    ns = _args(argv)
    try:
        name, text = _read(ns.input)
        try:
            passes = _pipeline(ns, text, name)
        except ValueError as e:
            raise OptError(f"loopfuse-opt: error: {e}") from None
        outputs, failed = [], False
        for first_line, chunk in _chunks(text, ns.split_input_file):
            try:  # like mlir-opt, a failing chunk is reported and the others still run
                outputs.append(_process(chunk, name, first_line, passes))
            except ChunkError as e:
                print(e, file=sys.stderr)
                failed = True
        if not failed or ns.output == "-":  # a failed run leaves an -o file (perhaps the input) as it was
            _write(ns.output, f"\n{SPLIT_MARKER}\n".join(outputs))
    except OptError as e:
        print(e, file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
