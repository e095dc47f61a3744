"""What a loopfuse pass is: a frozen dataclass with a name, a one-line summary and typed options.

    @dataclass(frozen=True)
    class WrapLoop(ModulePass):
        name = "wrap-loop"
        summary = "Run K steps of the update in one device call"
        steps: int = option(1, "iterations per call", minimum=1)

        def apply(self, module_op): ...

The option ``steps`` is written ``wrap-loop{steps=8}`` in a pipeline (underscores in a field name
are dashes in the option name). Options are checked when the pass is built, from Python or from
text, and every problem is one `PassOptionError` naming the pass and the option. A pass that cannot
rewrite its input raises `PassError` at the offending op; the pass manager reports it as an MLIR
error diagnostic at that op's location.
"""
import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir

from .vocabulary import REPORT_PREFIX

_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "string"}


class PassError(Exception):
    """The pass cannot rewrite this IR: an error at `op`'s location (None: the whole module)."""

    def __init__(self, op, message: str):
        super().__init__(message)
        self.op = op


class PassOptionError(ValueError):
    """A pass option that does not exist, or whose value has the wrong type or range."""

    def __init__(self, pass_name: str, option: str, problem: str):
        super().__init__(f"pass '{pass_name}' option '{option}': {problem}")
        self.pass_name, self.option = pass_name, option


def option(default, help: str, *, minimum=None, maximum=None):
    """An option field: its default, its help line, and optionally the range of values allowed."""
    return dataclasses.field(default=default, metadata={"help": help, "minimum": minimum, "maximum": maximum})


def option_name(f: dataclasses.Field) -> str:
    return f.name.replace("_", "-")


@dataclass(frozen=True)
class ModulePass:
    """Base of loopfuse's passes; subclasses are frozen dataclasses whose fields are the options."""

    name: ClassVar[str]     # the pass argument in a pipeline, e.g. "wrap-loop"
    summary: ClassVar[str]  # one line for --help
    after_wrap_loop: ClassVar[bool] = False  # pipeline.build runs it after wrap-loop (it rewrites the loop)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _has_type(value, f.type):
                raise PassOptionError(self.name, option_name(f), f"expects {_TYPE_NAMES[f.type]}, got {value!r}")
            if isinstance(value, float) and math.isnan(value):  # compares as neither below nor above a bound
                raise PassOptionError(self.name, option_name(f), "expects a number, got nan")
            low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
            if low is not None and value < low:
                raise PassOptionError(self.name, option_name(f), f"must be >= {low}, got {value!r}")
            if high is not None and value > high:
                raise PassOptionError(self.name, option_name(f), f"must be <= {high}, got {value!r}")

    def apply(self, module_op: ir.Operation) -> None:
        """Rewrite `module_op` (a builtin.module) in place; raise `PassError` if it cannot."""
        raise NotImplementedError

    def adds_control_flow(self) -> bool:
        """Whether the pass may add control flow of the module's own (loops besides wrap-loop's): then
        the program is compiled as one that has some (`xla.program_options`), unless it added none."""
        return False

    def added_control_flow(self, module_op: ir.Operation) -> bool:
        """Whether the pass added control flow of the module's own to `module_op`, which it ran on: whether it
        may (`adds_control_flow`), or, for a pass whose report says so, whether it did."""
        return self.adds_control_flow()

    def report(self, module_op: ir.Operation, text: str) -> None:
        """Say what the pass did: `text` goes on the module (``loopfuse.report.<name>``), into the
        dump as ``<name>.txt`` and to ``Executable.reports``."""
        module_op.attributes[REPORT_PREFIX + self.name] = ir.StringAttr.get(text)

    @classmethod
    def options(cls) -> tuple:
        """The option fields (dataclasses.Field: name, type, default, metadata["help"])."""
        return dataclasses.fields(cls)

    @classmethod
    def from_text(cls, options: dict) -> "ModulePass":
        """The pass with option values given as text, e.g. {"min-group": "3"}."""
        fields = {option_name(f): f for f in cls.options()}
        values = {}
        for key, text in options.items():
            f = fields.get(key)
            if f is None:
                known = ", ".join(fields) or "none"
                raise PassOptionError(cls.name, key, f"no such option (options of {cls.name}: {known})")
            values[f.name] = _parse(cls.name, key, f.type, text)
        return cls(**values)

    def __str__(self) -> str:
        """The pass in pipeline syntax, with the options that differ from their defaults."""
        changed = [f"{option_name(f)}={_format(getattr(self, f.name))}" for f in self.options()
                   if getattr(self, f.name) != f.default]
        return self.name + ("{" + " ".join(changed) + "}" if changed else "")


def _has_type(value, t: type) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, t) and (t is bool or not isinstance(value, bool))


def _parse(pass_name: str, key: str, t: type, text: str):
    if t is str:
        return text
    if t is bool and text in ("true", "false"):
        return text == "true"
    try:
        if t in (int, float):
            return t(text)
    except ValueError:
        pass
    raise PassOptionError(pass_name, key, f"expects {_TYPE_NAMES[t]}, got {text!r}")


def _format(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def reports(module_op: ir.Operation) -> dict[str, str]:
    """The reports passes left on `module_op` (`ModulePass.report`): pass name -> text."""
    attrs = module_op.attributes
    named = [attrs[i] for i in range(len(attrs))]
    return {a.name[len(REPORT_PREFIX):]: ir.StringAttr(a.attr).value for a in named if a.name.startswith(REPORT_PREFIX)}
