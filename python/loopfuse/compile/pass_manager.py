"""Parse and run mlir-opt style pipelines that mix loopfuse (Python) and upstream MLIR passes.

A loopfuse pass is a `ModulePass` object; an upstream one (canonicalize, cse ...) an `UpstreamPass`
handed to MLIR's registry. Running either reports failures as MLIR error diagnostics: a loopfuse
pass's `PassError` at the offending op, the verifier's at the invalid op.
"""
import re
from dataclasses import dataclass
from typing import TypeAlias

from jaxlib.mlir import ir, passmanager

from ..passes import PASSES, ModulePass, PassError, PassOptionError
from ..passes.functions import find_function


@dataclass(frozen=True)
class UpstreamPass:
    """A pass from MLIR's own registry, its options as MLIR's pipeline text (checked by MLIR)."""

    name: str
    options: str = ""

    def __str__(self) -> str:
        return self.name + ("{" + self.options + "}" if self.options else "")

    def adds_control_flow(self) -> bool:
        """False: MLIR's registered passes rewrite or remove ops (canonicalize, cse, inlining,
        StableHLO's legalizations), they build no loops of their own (see `ModulePass`)."""
        return False


Pass: TypeAlias = ModulePass | UpstreamPass

_ITEM = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(?:\{([^}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[Pass]:
    """`builtin.module(a,b{k=v w=1})` or `a,b{k=v}` -> pass objects.

    Raises ValueError on bad syntax and `PassOptionError` (a ValueError) on a bad loopfuse option.
    """
    text = text.strip()
    m = re.fullmatch(r"builtin\.module\((.*)\)", text, re.S)
    body = m.group(1) if m else text
    passes, pos = [], 0
    while pos < len(body.rstrip()):
        item = _ITEM.match(body, pos)
        if not item or item.end() == pos:
            raise ValueError(f"cannot parse pass pipeline at {body[pos:]!r}")
        passes.append(make_pass(item.group(1), item.group(2) or ""))
        pos = item.end()
    return passes


_SPACED_EQ = re.compile(r"([^\s=]+)(\s*)=(\s*)([^\s=]*)")


def make_pass(name: str, options: str = "") -> Pass:
    """The pass `name` with `options` in pipeline text (``k=v k2=v2``: as in MLIR, no spaces around
    '=', each option at most once)."""
    cls = PASSES.get(name)
    if cls is None:
        return UpstreamPass(name, options.strip())
    for m in _SPACED_EQ.finditer(options):
        if m.group(2) or m.group(3):
            raise PassOptionError(name, m.group(1), f"no spaces around '=' (write {m.group(1)}={m.group(4)})")
    values: dict[str, str] = {}
    for kv in options.split():
        key, eq, value = kv.partition("=")
        if not eq:
            raise PassOptionError(name, key, "is not key=value")
        if key in values:
            raise PassOptionError(name, key, "given more than once")
        values[key] = value
    return cls.from_text(values)


class PassFailure(RuntimeError):
    """A pass failed or produced IR that does not verify; `diagnostics` are MLIR's error diagnostics
    (location, message), `spec` the pass."""

    def __init__(self, spec: Pass, message: str, cause: BaseException | None = None, diagnostics=()):
        super().__init__(f"pass '{spec}' failed: {message}")
        self.spec, self.message, self.cause, self.diagnostics = spec, message, cause, list(diagnostics)


def run_pass(module: ir.Module, spec: Pass) -> None:
    """Run one pass on `module` in place, with the MLIR verifier after it; raise `PassFailure`."""
    errors: list = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        pm.enable_verifier(True)
        if isinstance(spec, ModulePass):
            pm.add(_callback(spec, errors), name=spec.name, argument=spec.name)
        else:
            try:
                pm.add(str(spec))
            except ValueError as e:
                raise PassFailure(spec, upstream_error(str(e)), e) from None
        try:
            pm.run(module.operation)
        except ir.MLIRError as e:
            diagnostics = [(d.location, d.message) for d in e.error_diagnostics or []]
            message = "; ".join(m for _, m in diagnostics) or str(e)
            cause = errors[0] if errors else e
            raise PassFailure(spec, message, cause, diagnostics) from cause


def _callback(spec: ModulePass, errors: list):
    """`spec` as an MLIR pass: a failure becomes an error diagnostic (a `PassError` at its op; any
    other exception, a bug or IR the pass does not handle, one line at the module) and the exception
    is kept for `PassFailure.cause`."""

    def callback(op, pass_):
        try:
            with op.context, ir.Location.unknown():
                _check_main(op)
                spec.apply(op)
        except PassError as e:
            (op if e.op is None else e.op).location.emit_error(str(e))
            errors.append(e)
            pass_.signal_pass_failure()
        except Exception as e:
            op.location.emit_error(_unexpected(e))
            errors.append(e)
            pass_.signal_pass_failure()

    return callback


def _check_main(module_op: ir.Operation) -> None:
    """A `PassError` at ``@main`` when it is only a declaration: loopfuse's passes rewrite its body."""
    main = find_function(module_op, "main")
    if main is not None and main.is_external:
        raise PassError(main, "@main is a declaration without a body: loopfuse's passes need the step's body")


# What MLIR's bindings raise on IR a pass did not check for (a failed cast, a missing block, ...).
_UNCHECKED = (ValueError, TypeError, LookupError, AttributeError, ir.MLIRError)


def _unexpected(e: Exception) -> str:
    """A pass's exception other than `PassError` as one line: an MLIRError of the pass's own parsing
    without its locations (in that text, not in the module), an unchecked case marked as such."""
    if isinstance(e, ir.MLIRError):
        text = ": ".join(filter(None, [e.message, "; ".join(d.message for d in e.error_diagnostics or [])]))
    else:
        text = str(e)
    text = " ".join(text.split())
    return f"{text} (unexpected {type(e).__name__})" if isinstance(e, _UNCHECKED) else text


def upstream_error(mlir_message: str) -> str:
    if "does not refer to a registered pass" in mlir_message:
        return f"unknown pass (loopfuse passes: {', '.join(PASSES)}; others come from MLIR's registry)"
    return " ".join(mlir_message.split())
