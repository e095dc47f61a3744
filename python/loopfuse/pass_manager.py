"""Parse and build mlir-opt style pipelines that mix loopfuse (Python) and upstream MLIR passes."""
import re
from dataclasses import dataclass, field

from jaxlib.mlir import ir, passmanager

from .passes import PASSES


@dataclass(frozen=True)
class PassSpec:
    name: str
    options: dict = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + " ".join(f"{k}={v}" for k, v in self.options.items()) + "}"


_ITEM = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(?:\{([^}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[PassSpec]:
    """`builtin.module(a,b{k=v w=1})` or `a,b{k=v}` -> [PassSpec]. Raises ValueError on bad syntax."""
    text = text.strip()
    m = re.fullmatch(r"builtin\.module\((.*)\)", text, re.S)
    body = m.group(1) if m else text
    specs, pos = [], 0
    while pos < len(body.rstrip()):
        item = _ITEM.match(body, pos)
        if not item or item.end() == pos:
            raise ValueError(f"cannot parse pass pipeline at {body[pos:]!r}")
        opts = {}
        for kv in (item.group(2) or "").split():
            if "=" not in kv:
                raise ValueError(f"pass option {kv!r} of {item.group(1)} is not key=value")
            k, v = kv.split("=", 1)
            opts[k] = v
        specs.append(PassSpec(item.group(1), opts))
        pos = item.end()
    return specs


def _python_pass(spec: PassSpec, errors: list):
    run = PASSES[spec.name]

    def callback(op, pass_):
        try:
            with op.context, ir.Location.unknown():
                run(op, **spec.options)
        except Exception as e:  # surfaced by run_pass with the pass name
            errors.append(e)
            pass_.signal_pass_failure()

    return callback


class PassFailure(RuntimeError):
    """A pass failed or produced IR that does not verify."""

    def __init__(self, spec: PassSpec, message: str, cause: BaseException | None = None):
        super().__init__(f"pass '{spec}' failed: {message}")
        self.spec, self.cause = spec, cause


def run_pass(module: ir.Module, spec: PassSpec) -> None:
    """Run one pass on `module` in place, with the MLIR verifier after it."""
    errors: list = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        pm.enable_verifier(True)
        if spec.name in PASSES:
            pm.add(_python_pass(spec, errors), name=spec.name, argument=spec.name)
        else:
            try:
                pm.add(str(spec))
            except ValueError as e:
                raise PassFailure(spec, f"unknown pass (loopfuse passes: {', '.join(PASSES)})", e) from None
        try:
            pm.run(module.operation)
        except ir.MLIRError as e:
            cause = errors[0] if errors else e
            raise PassFailure(spec, str(cause), cause) from cause
