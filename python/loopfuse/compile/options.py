"""StepOptions: everything that changes a step's compiled program, each option declared once, as a field
with its type, default and help (`option`), and validated once (`checked`).

Every other place an option appears is made from that declaration: `compile_step`'s keywords (`KEYWORDS`,
its signature and help by `takes_keywords`), the compiled backends' fields (`Fragment`), and the
``Attributes:`` of StepOptions' own docstring.

To add an option: its field here (``name: type = option(default, "help")``; ``loop=True`` for one that
`Step.loop` sets), its check in `checked` if it needs one, and its effect where the program is made
(`compiler.trace`: the trace, the passes of `StepOptions.pipeline`, or the XLA options; the compile cache and
the dump folder know a program by those three). `compile_step` then takes it, and `help(compile_step)` lists
it; the README must name it (tests/py/test_readme.py). A backend that passes it on lists it in its
``Fragment, options=(...)``.
"""
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

import jax

from .. import validate
from ..run.sharding import Placement
from . import pipeline, stopping


def option(default, help: str, *, loop: bool = False):
    """A StepOptions field: its default and its help (`loop`: set by `Step.loop`, not a `compile_step` keyword)."""
    return field(default=default, metadata={"help": help, "loop": loop})


@dataclass(frozen=True)
class StepOptions:
    """Everything that changes the compiled program: `compile_step`'s keywords, and `Step.loop`'s."""

    donate: bool = option(True, "update the state in place (params and optimizer state buffers are reused); the "
                                "state a call is given is consumed.")
    passes: str | tuple | None = option(None, "optimization passes (a pipeline string or names, e.g. "
                                              "``\"flatten-update{min-group=3}\"``), default "
                                              "``pipeline.DEFAULT_PASSES``.")
    keep_aux: tuple | None = option(None, "aux leaf paths to return, e.g. ``(\"loss\",)``; the others are not computed "
                                          "(None: all).")
    steps: int | None = option(None, "run that many updates per call in one device loop; aux gains a leading [steps] "
                                     "axis.")
    device: Any = option(None, "the one device to run on (default: the first, whatever device the arguments "
                                  "are committed to or `jax.default_device` names: pass it).")
    devices: tuple | None = option(None, "run SPMD over a mesh of these devices (a list of jax devices; with "
                                         "`sharding`).")
    sharding: str | None = option(None, "over `devices`, \"data\" (default) splits the batch and replicates the state, "
                                        "\"params\" also splits large state leaves (see `sharding`).")
    dump_ir: str | Path | None = option(None, "folder for the IR after tracing and after every pass (or "
                                              "$LOOPFUSE_DUMP_IR); each program gets its own subfolder "
                                              "``<fn name>-<digest>`` (see `pipeline.dump_folder`).")
    xla_options: Mapping[str, Any] | None = option(
        None, "XLA compile options (``{\"xla_...\": value}``) merged over the options loopfuse decides per program "
              "(`xla.program_options`: the copy-free loop carry where it is safe), e.g. "
              "``{\"xla_cpu_copy_insertion_use_region_analysis\": False}`` turns that off; a value of None leaves an "
              "option unset.")
    until: Callable | None = option(None, "a loop's stop predicate ``pred(new_state, aux) -> scalar bool`` (see "
                                          "`Step.loop`).", loop=True)
    init: Callable | None = option(None, "a loop's initial state ``init(x, batch)``, computed inside its program: a "
                                         "call takes x, never donated, in the state's place (see `Step.loop`).",
                                   loop=True)
    stop_on_nonfinite: bool = option(False, "a loop stops after a step whose kept floating aux leaves hold a NaN or "
                                            "Inf (see `Step.loop`).", loop=True)
    cache_dir: str | Path | None = option(None, "folder of the persistent compile cache (or $LOOPFUSE_CACHE_DIR); a "
                                                "program compiled once on this machine loads from it instead of "
                                                "running the passes and XLA again.")
    verify: bool | None = option(None, "check each new executable's first call against jax.jit of the step function "
                                       "on copies of the inputs and raise `MiscompileError` naming the first differing "
                                       "leaf and the pass or XLA option that causes it (default: $LOOPFUSE_VERIFY; see "
                                       "`verify`).")
    memory_budget: float | None = option(
        None, "roll repeated layers (a Python loop over alike layers) into a forward and a backward device loop over "
              "stacked leaves, recomputing activations (the ``roll-layers`` pass): 0.0 keeps the least memory; b in "
              "(0, 1) also saves the matrix products dearest to recompute, up to b of their bytes; 1.0 (kept as None, "
              "the default) leaves the step as traced. A rolled program matches jax.jit within a tolerance, not "
              "bitwise (README, \"Rolling repeated layers\"); ``Executable.reports[\"roll-layers\"]`` says what "
              "rolled.")
    micro_batches: int | None = option(
        None, "run the loss and gradient over that many slices of the batch, one at a time in a device loop, summing "
              "the gradients before one update (the ``micro-batch`` pass): within a tolerance of jax.jit, not bitwise "
              "(README, \"Micro-batches\"); ``Executable.reports[\"micro-batch\"]`` says what was cut, or why not.")
    memory_limit: int | str | None = option(
        None, "the most memory a call may take, in bytes, a size such as ``\"2GiB\"``, or ``\"device\"`` (the "
              "device's memory less a margin, `memory_plan.DEVICE_MARGIN`; refused where the device reports none, as "
              "a CPU): loopfuse chooses the `memory_budget` and `micro_batches` whose compiled peak (arguments + "
              "outputs - aliased + temporaries) fits, preferring the fewest slices, then the least recompute "
              "(`memory_plan`); one of them given is kept as given. ``Executable.reports[\"memory-limit\"]`` says "
              "what was chosen and what was not; a limit below every plan is a `MemoryLimitError` naming the floor.")
    placement: Placement | None = field(init=False, repr=False, compare=False)  # of `devices` (None: one device)

    def __post_init__(self) -> None:
        for name, value in checked({f.name: getattr(self, f.name) for f in FIELDS.values()}).items():
            object.__setattr__(self, name, value)
        placement = None if self.devices is None else Placement(self.devices, self.sharding or "data")
        object.__setattr__(self, "placement", placement)

    def pipeline(self, rows: int = 0) -> list:
        """The passes the program runs (`pipeline.build` of these options; wrap-loop's `rows`, see
        `xla.history_rows`)."""
        return pipeline.build(self.passes, steps=self.steps, donate=self.donate, memory_budget=self.memory_budget,
                              rows=rows, micro_batches=self.micro_batches, init=self.init is not None)

    @property
    def stops(self) -> bool:
        """Whether the program is a loop that can stop early."""
        return self.steps is not None and (self.until is not None or self.stop_on_nonfinite)

    @property
    def program_devices(self) -> list:
        """The devices the program runs on: the mesh's, or the one device."""
        return self.placement.devices if self.placement else [self.device or jax.devices()[0]]


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(StepOptions) if f.init}
KEYWORDS = tuple(name for name, f in FIELDS.items() if not f.metadata["loop"])    # compile_step's


def checked(values: dict, name: Callable[[str], str] = str) -> dict:
    """The value of every option (`values`, by field name) validated and in its one form (tuples, a read-only
    mapping, a float budget; a budget of 1.0, the step as traced, as None); an error names an option as
    ``name(field name)`` (a backend's: ``CompiledLoop(memory_budget=...)``)."""
    o = dict(values)
    if o["memory_budget"] is not None:
        budget = validate.budget(o["memory_budget"], name("memory_budget"))
        o["memory_budget"] = None if budget == 1.0 else budget
    if o["steps"] is not None:
        o["steps"] = validate.steps(o["steps"], name("steps"))
    if o["micro_batches"] is not None:
        o["micro_batches"] = validate.steps(o["micro_batches"], name("micro_batches"))
    if o["memory_limit"] is not None:
        o["memory_limit"] = validate.memory_limit(o["memory_limit"], name("memory_limit"))
    stopping.check(o["until"], o["stop_on_nonfinite"], o["steps"])
    if o["devices"] is not None:
        o["devices"] = _devices(o["devices"], name("devices"))
    validate.device(o["device"], name("device"))
    for key in ("cache_dir", "dump_ir"):
        validate.folder(o[key], name(key))
    if o["init"] is not None:
        _check_init(o, name)
    if o["sharding"] not in (None, "data", "params", "members"):    # "members": an ensemble's (see `ensemble`)
        raise ValueError(f"{name('sharding')} must be None, 'data' or 'params', got {o['sharding']!r}")
    if o["device"] is not None and o["devices"] is not None:
        raise ValueError("pass either device= (one device) or devices= (an SPMD mesh), not both")
    if o["sharding"] is not None and o["devices"] is None:
        raise ValueError(f"sharding={o['sharding']!r} needs devices=[...] to shard over")
    if o["passes"] is not None and not isinstance(o["passes"], str):
        o["passes"] = tuple(o["passes"])
    if o["passes"] is not None:
        pipeline.chosen(o["passes"])     # a ValueError naming an unknown pass or a bad option, before any call
    if o["keep_aux"] is not None:
        o["keep_aux"] = tuple(o["keep_aux"])
    if o["xla_options"] is not None:
        o["xla_options"] = MappingProxyType(validate.xla_options(o["xla_options"]))
    return o


def _check_init(o: dict, name: Callable[[str], str]) -> None:
    """`init` (`Step.loop`): a callable, starting a loop of `steps` that cannot stop early, of a program that
    can start from one (`init_refused`)."""
    if not callable(o["init"]):
        raise TypeError(f"{name('init')} must be callable, got {o['init']!r}")
    conflicts = init_refused(o) + [f"until={o['until']!r}"] * (o["until"] is not None)
    conflicts += ["stop_on_nonfinite=True"] * o["stop_on_nonfinite"] + ["steps=None"] * (o["steps"] is None)
    if conflicts:
        raise ValueError(f"{name('init')} starts a loop of 2 or more `steps` on one device that cannot stop early, "
                         f"under no memory limit: not with {', '.join(conflicts)}")


def init_refused(values: Mapping[str, Any]) -> list[str]:
    """The options (`values` by field name) with which a program cannot start from an init, as ``name=value``:
    a mesh (its arguments' shardings are the state's), a memory limit (its plans are chosen on the state) and a
    loop of one step (XLA inlines a one-trip loop, and fuses the init's ops with the step's across the barrier:
    other last bits than the step from jax.jit's init)."""
    return ([f"{k}={values[k]!r}" for k in ("devices", "memory_limit") if values[k] is not None]
            + ["steps=1"] * (values["steps"] == 1))


def _devices(devices, name: str) -> tuple:
    """`devices` as a tuple of jax devices (a TypeError naming `name` for anything else or none)."""
    if isinstance(devices, jax.Device) or not hasattr(devices, "__iter__"):
        raise TypeError(f"{name} must be a list of jax devices, got {devices!r}")
    devices = tuple(devices)
    bad = [d for d in devices if not isinstance(d, jax.Device)]
    if not devices or bad:
        raise TypeError(f"{name} must be a non-empty list of jax devices" + (f"; not devices: {bad!r}" if bad else ""))
    return devices


def given(owner: str, values: dict) -> StepOptions:
    """The StepOptions of `owner`'s keywords `values` (``compile_step(fn, **values)``): a TypeError for a name
    that is no `KEYWORDS` entry, as Python raises for a keyword a function does not take."""
    for name in values:
        if name not in KEYWORDS:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
    return StepOptions(**values)


def takes_keywords(fn: Callable) -> Callable:
    """`fn`, which takes ``**options`` (`KEYWORDS`), with them in its signature (keyword-only, StepOptions'
    types and defaults: what `help` and `inspect.signature` show) and their help in its docstring."""
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=FIELDS[n].default,
                                 annotation=FIELDS[n].type) for n in KEYWORDS]
    fn.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    fn.__doc__ = _with_help(fn.__doc__ or "", "Keywords (`StepOptions`):", KEYWORDS)
    return fn


class Fragment:
    """Base of a class (a dataclass) that takes some `compile_step` keywords: ``class B(Fragment,
    options=("devices", ...))`` gives it those StepOptions fields, keyword-only with their types, defaults and
    help; `fragment` is them as StepOptions, validated by `checked` (errors name ``B(devices=...)``)."""

    OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, options: tuple = (), **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.OPTIONS = options
        if "__annotations__" not in cls.__dict__:
            cls.__annotations__ = {}
        for name in options:
            cls.__annotations__[name] = FIELDS[name].type
            setattr(cls, name, field(default=FIELDS[name].default, kw_only=True, metadata=FIELDS[name].metadata))
        if cls.__doc__:
            cls.__doc__ = _with_help(cls.__doc__, "Keywords of `compile_step` (`StepOptions`):", options)

    def _check_options(self) -> None:
        """Validate the fragment's fields (`checked`), keep each in its one form and `fragment` as StepOptions."""
        owner = type(self).__name__
        values = checked({**{n: f.default for n, f in FIELDS.items()}, **{n: getattr(self, n) for n in self.OPTIONS}},
                         lambda n: f"{owner}({n}=...)")
        for n in self.OPTIONS:
            object.__setattr__(self, n, values[n])
        object.__setattr__(self, "fragment", StepOptions(**{n: values[n] for n in self.OPTIONS}))

    fragment: StepOptions


def _with_help(doc: str, title: str, names) -> str:
    """`doc` with a `title` section listing the help of the options `names`, before its ``Examples:`` if it
    has them (else at the end)."""
    doc = inspect.cleandoc(doc)
    lines = [title] + [textwrap.fill(f"{n}: {FIELDS[n].metadata['help']}", 108, initial_indent="    ",
                                     subsequent_indent="        ", break_on_hyphens=False) for n in names]
    section = "\n".join(lines)
    head, examples, tail = doc.partition("\nExamples:")
    return f"{head.rstrip()}\n\n{section}\n" + (f"\nExamples:{tail}" if examples else "")


StepOptions.__doc__ = _with_help(StepOptions.__doc__ or "", "Attributes:", FIELDS)
