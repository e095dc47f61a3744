"""loopfuse-opt: an mlir-opt style driver for loopfuse's passes (used by the lit tests).

    loopfuse-opt in.mlir --pass-pipeline='builtin.module(drop-unused-outputs,alias-state)'
    loopfuse-opt in.mlir --alias-state --simplify -o out.mlir
    loopfuse-opt - --split-input-file --simplify < in.mlir
    loopfuse-opt --reproducer DIR/reproducer.mlir     # replay a failure written by compile_step
"""
import argparse
import re
import sys

from jaxlib.mlir import ir

from .mlir_context import make_context
from .passes import PASSES
from .pass_manager import PassFailure, PassSpec, parse_pipeline, run_pass

SPLIT = re.compile(r"^// -----\s*$", re.M)
REPRODUCER_PIPELINE = re.compile(r"^// loopfuse-pipeline: (.*)$", re.M)


def _args(argv):
    p = argparse.ArgumentParser(prog="loopfuse-opt", description=__doc__.splitlines()[0])
    p.add_argument("input", nargs="?", default="-", help="input .mlir file, '-' for stdin")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument("--pass-pipeline", default=None, help="builtin.module(pass1,pass2{opt=v},...)")
    p.add_argument("--split-input-file", action="store_true", help="treat '// -----' as file separators")
    p.add_argument("--reproducer", action="store_true",
                   help="take the pipeline from the input's '// loopfuse-pipeline:' line")
    for name in PASSES:
        p.add_argument(f"--{name}", dest="single", action="append_const", const=name, help=f"run {name}")
    return p.parse_args(argv)


def _pipeline(ns, text: str) -> list[PassSpec]:
    specs = []
    if ns.reproducer:
        m = REPRODUCER_PIPELINE.search(text)
        if not m:
            raise SystemExit("loopfuse-opt: --reproducer input has no '// loopfuse-pipeline:' line")
        specs += parse_pipeline(m.group(1))
    if ns.pass_pipeline:
        specs += parse_pipeline(ns.pass_pipeline)
    return specs + [PassSpec(n) for n in ns.single or []]


class ChunkError(Exception):
    """One input chunk failed to parse or to pass; the message is ready to print."""


def _process(chunk: str, name: str, line_offset: int, specs) -> str:
    ctx = make_context()
    with ctx, ir.Location.unknown():
        try:
            module = ir.Module.parse(chunk)
        except ir.MLIRError as e:
            raise ChunkError(_located(e, name, line_offset)) from None
        for spec in specs:
            try:
                run_pass(module, spec)
            except PassFailure as e:
                raise ChunkError(f"{name}: error: {e}") from None
        return str(module)


def _located(e: ir.MLIRError, name: str, line_offset: int) -> str:
    """Render parse diagnostics as file:line:col with lines counted in the whole input file."""
    lines = []
    for d in e.error_diagnostics or []:
        loc = str(d.location)
        m = re.search(r':(\d+):(\d+)', loc)
        where = f"{name}:{int(m.group(1)) + line_offset}:{m.group(2)}" if m else name
        lines.append(f"{where}: error: {d.message}")
    return "\n".join(lines) or f"{name}: error: {e}"


def main(argv=None) -> int:
    ns = _args(argv)
    text = sys.stdin.read() if ns.input == "-" else open(ns.input).read()
    name = "<stdin>" if ns.input == "-" else ns.input
    try:
        specs = _pipeline(ns, text)
    except ValueError as e:
        raise SystemExit(f"loopfuse-opt: {e}")
    chunks = SPLIT.split(text) if ns.split_input_file else [text]
    outputs, offset, failed = [], 0, False
    for chunk in chunks:  # like mlir-opt, a failing chunk is reported and the others still run
        try:
            outputs.append(_process(chunk, name, offset, specs))
        except ChunkError as e:
            print(e, file=sys.stderr)
            failed = True
        offset += chunk.count("\n")
    out = "\n// -----\n".join(outputs)
    if ns.output == "-":
        sys.stdout.write(out)
    else:
        with open(ns.output, "w") as fh:
            fh.write(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
