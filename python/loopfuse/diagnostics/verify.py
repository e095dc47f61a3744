"""Verify mode: check each new executable's first call against `jax.jit` of the unmodified step.

``compile_step(fn, verify=True)`` (or ``LOOPFUSE_VERIFY=1``) runs loopfuse's executable and the
reference on copies of the call's inputs before the call itself, so the caller's state is never
consumed by the check, and compares every returned leaf bitwise. The reference of a step is
``jax.jit(fn)``; of ``loop(K)``, K calls of ``jax.jit(fn)`` (stopping where the loop's `until` /
``stop_on_nonfinite`` would, histories padded as the loop pads them; the stop computed inside the
jitted step or on its outputs), or ``jax.jit`` of the same steps written as one ``lax.scan`` (for a
loop that runs all K steps) or ``lax.while_loop`` (for one that can stop): XLA may compile a loop
body to other last bits than a lone step; the loop must equal one of them. A program over a mesh
(``devices=``) is compared with jax.jit of the same over that mesh, with the shardings the program
takes and returns its state and batch with (a `Dataset`'s batch split over the mesh as it splits it):
its gradient's all-reduce sums in another order than one device does.

On a difference it bisects, as LLVM's ``-opt-bisect-limit`` does: it compiles the program again
with each loopfuse pass, buffer donation (alias-state) and each XLA option loopfuse set removed in
turn, and names those whose removal makes the result equal to the reference. It raises
`MiscompileError` naming the first differing leaf, the passes and XLA options in effect and the
culprits. Later calls of the same executable are not checked, so the check costs nothing after
the first call. The check runs the program a few more times: host callbacks run again with it.

A program whose layers roll-layers rolled (``memory_budget``) computes the same ops as jax.jit
but XLA compiles its loops to other last bits, and a micro-batched one (``micro_batches``) sums its
gradients slice by slice, so either is held to a tolerance, not bitwise: each aux leaf within
`ROLLED_RTOL` of its largest value (two units in the last place of bfloat16, float16 or float8 where
the step computes in one: `rolled_rtol`), each new state leaf within that of its largest value
plus twice the largest change the call made in its part of the state (its top-level entry: the params,
the optimizer state; a packed state's buffers are one part): Adam moves a parameter whose gradient is
rounding noise (a bias before a batch norm, a key bias under a softmax) by up to its learning rate in
either direction, however small the noise, wherever rounding differs; step counts and stop flags exactly.
"""
from dataclasses import replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from .. import settings
from ..compile import compiler, pipeline, stopping
from ..compile.trace import fn_name
from ..errors import MiscompileError
from ..run.sharding import Placement
from ..state.data import Dataset
from ..state.packed import PackedState
from ..state.leaves import aux_kept, dotted_paths, keyed_paths, raw

VERIFY_ENV = "LOOPFUSE_VERIFY"
ROLLED_RTOL = 1e-5      # a rolled or micro-batched program against jax.jit (see the module docstring)
NARROW_ULPS = 2         # ... of one that computes in a type narrower than float32: units in its last place


def enabled(explicit: bool | None) -> bool:
    """The keyword when given, else whether $LOOPFUSE_VERIFY is set to something other than 0."""
    return settings.flag(explicit, VERIFY_ENV)


def check(fn, options, executable, state, batch, start: int, static: dict) -> None:
    """Raise `MiscompileError` unless `executable` (of `fn` under `options`) computes what the reference
    does on copies of ``(state, batch)`` (`state`: what it takes, a loop's x where it starts from ``init(x,
    batch)``, whose reference starts from jax.jit of that init)."""
    given = state
    if options.init is not None:
        state = jax.jit(options.init)(given, batch)
    got = _run(executable, given, batch, start)
    references = _references(fn, options, _Jit.of(options.placement, executable, state, batch), state, batch,
                             start, static)
    reports = executable.reports
    reassociated = reports.get("roll-layers", "").startswith("rolled") or \
        reports.get("micro-batch", "").startswith("micro-batched")
    tolerance = _Tolerance(state, rolled_rtol(executable.traced.module)) if reassociated else None
    if _matches(got, references, tolerance):
        return
    culprits = [what for what, variant in _variants(options, executable)
                if _matches(_run(compiler.build(fn, variant, given, batch, static), given, batch, start), references)]
    difference = _difference(got, references[0], tolerance)
    assert difference is not None   # no reference matched
    path, max_abs, max_rel = difference
    passes = pipeline.pipeline_string(executable.passes)
    raise MiscompileError(
        f"loopfuse's executable for {fn_name(fn)} computes other values than jax.jit "
        f"of the same function: {path} differs by up to {max_abs:.3g} (relative {max_rel:.3g}). "
        f"Passes: {passes}; XLA options: {executable.xla_options or 'none'}. "
        + (f"Removing {' or '.join(culprits)} makes it equal to jax.jit." if culprits else
           "No single pass, donation or XLA option explains it."),
        path=path, max_abs=max_abs, max_rel=max_rel, passes=passes, xla_options=executable.xla_options,
        culprits=culprits)


class _Tolerance(NamedTuple):
    """What a rolled or micro-batched program is held to (see the module docstring): the state its call
    started from, and the relative tolerance of the floating types its step computes in (`rolled_rtol`)."""

    before: Any
    rtol: float


def rolled_rtol(module: ir.Module) -> float:
    """The relative tolerance of a rolled or micro-batched program of the traced step `module`:
    `ROLLED_RTOL`, or where the step computes in a floating type narrower than float32 (bfloat16,
    float16, float8), two units in the last place of the narrowest (`NARROW_ULPS`). XLA rounds such a
    type at other points in a loop than in the unrolled program, as it does jax.jit's own scan: jax.jit
    of bfloat16 MLP blocks written as a ``lax.scan`` differs from jax.jit of the Python loop by up to
    2e-5 in the loss and 0.8% of the largest gradient (one bfloat16 unit), as the rolled program does."""
    widths: set = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        for r in op.results:
            t = r.type
            et = t.element_type if isinstance(t, ir.ShapedType) else t
            if isinstance(et, ir.FloatType) and et.width < 32:
                widths.add(str(et))
        return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
    return max([ROLLED_RTOL, *(NARROW_ULPS * e for e in map(_epsilon, widths) if e is not None)])


def _epsilon(mlir_name: str) -> float | None:
    """The machine epsilon of an MLIR float type by its name (``bf16``, ``f16``, ``f8E4M3FN``), or None for
    one numpy does not know."""
    if mlir_name == "bf16":
        name = "bfloat16"
    elif mlir_name[1] in "468":                       # f8E4M3FN: float8_e4m3fn
        name = f"float{mlir_name[1]}_{mlir_name[2:].lower()}"
    else:                                             # f16: float16
        name = f"float{mlir_name[1:]}"
    try:
        return float(jnp.finfo(jnp.dtype(name)).eps)
    except (TypeError, ValueError):
        return None


def _matches(got, references: list, tolerance: _Tolerance | None = None) -> bool:
    """Whether `got` equals one of the `references` (see `_difference`)."""
    return any(_difference(got, ref, tolerance) is None for ref in references)


def _copy(tree):
    """Fresh device buffers for every jax Array leaf (donating them leaves `tree` intact)."""
    return jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)


def _run(executable, state, batch, start: int):
    return executable(jax.tree_util.tree_leaves((_copy(state), batch)), start)


class _Jit(NamedTuple):
    """jax.jit as the references run it: plain for a one-device program (no `placement`), else on its mesh
    with the shardings it takes its state and batch with (trees like them)."""

    placement: Placement | None = None
    state: Any = None
    batch: Any = None

    @classmethod
    def of(cls, placement: Placement | None, executable, state, batch) -> "_Jit":
        """The shardings `executable` (over `placement`'s mesh) was compiled with."""
        if placement is None:
            return cls()
        flat = executable.traced.arg_shardings
        (s, state_def), (b, batch_def) = jax.tree_util.tree_flatten(state), jax.tree_util.tree_flatten(batch)
        return cls(placement, jax.tree_util.tree_unflatten(state_def, flat[:len(s)]),
                   jax.tree_util.tree_unflatten(batch_def, flat[len(s):len(s) + len(b)]))

    def __call__(self, f, results: int, step: bool = True):
        """jax.jit of ``f(state, batch[, step index])`` returning `results` values, the new state first: on the
        mesh, its arguments placed as the program takes them (the step index replicated), the new state
        returned as the state comes in, the rest replicated."""
        if self.placement is None:
            return jax.jit(f)
        replicated = self.placement.replicated
        into = (self.state, self.batch, replicated)[:2 + step]
        jitted = jax.jit(f, in_shardings=into, out_shardings=(self.state, *[replicated] * (results - 1)))
        return lambda *args: jitted(*jax.device_put(args, into))

    def select(self, batch, i):
        """The step's batch at global step `i` (a served `Dataset` picks its rows, split over the mesh)."""
        if not isinstance(batch, Dataset):
            return batch
        rows = batch.batch(i)
        return rows if self.placement is None else self.placement.constrain_batch(batch.batch_size, rows)


def _references(fn, o, jit: _Jit, state, batch, start: int, static: dict) -> list:
    """The outputs the executable of `fn` under options `o` must equal, as it returns them: one step
    of ``jax.jit(fn)`` returning the aux leaves the call keeps (XLA may fuse a program that returns more, gradients
    say, to other last bits); for a loop, K such steps (and, without a stop, their jitted scan).
    With a stop, the K steps are taken twice: the stop computed inside the jitted step, and K calls
    of ``jax.jit(fn)`` itself with the stop evaluated on their outputs (with jaxlib 0.12 the extra
    output can change the step's last bits, and with them where an `until` stops); and jax.jit of
    the same steps as one ``lax.while_loop`` (which XLA, like the scan, may compile to other last
    bits than a lone step: an Adam MLP stopping on a params leaf, 1 ulp). Each runs as `jit` runs it."""
    stop = stopping.flag(o.until, o.stop_on_nonfinite)

    def outputs(new, aux):
        returned = _returned(aux, o.keep_aux)
        if stop is None:
            return new, returned
        kept = {p: x for p, x in zip(dotted_paths(returned), jax.tree_util.tree_leaves(returned))}
        return new, returned, stop(new, aux, kept)

    def one(s, b, i):
        return outputs(*fn(s, jit.select(b, i), **static))

    jitted = jit(one, 2 if stop is None else 3)
    if o.steps is None:
        return [jitted(_copy(state), batch, np.int32(start))]
    if stop is not None:
        plain = jit(lambda s, b, i: fn(s, jit.select(b, i), **static), 2)
        return [_steps(run, state, batch, start, o.steps) for run in (jitted, lambda s, b, i: outputs(*plain(s, b, i)))] + [
            _while_loop(one, jit, state, batch, start, o.steps)]
    s, history, _, _ = _steps(jitted, state, batch, start, o.steps)
    scan = jit(lambda s, b: jax.lax.scan(lambda s, i: one(s, b, i), s,
                                         start + jnp.arange(o.steps, dtype=jnp.int32)), 2, step=False)
    return [(s, history), scan(_copy(state), batch)]


def _steps(run, state, batch, start: int, k: int) -> tuple:
    """Up to `k` calls of `run` from a copy of `state`, ending after one whose stop flag (if it
    returns one) is true: (state, history padded to `k` rows, steps run, stopped)."""
    s, rows, stopped = _copy(state), [], []
    for i in range(k):
        s, aux, *stopped = run(s, batch, np.int32(start + i))
        rows.append(aux)
        if stopped and bool(stopped[0]):
            break
    history = jax.tree_util.tree_map(lambda *r: _padded(jnp.stack(r), k), *rows)
    return s, history, np.int32(len(rows)), np.bool_(bool(stopped and stopped[0]))


def _while_loop(one, jit: _Jit, state, batch, start: int, k: int) -> tuple:
    """`jit` of the stopping loop written by hand: a `lax.while_loop` of `one` (whose last output is the
    stop flag) for at most `k` steps, each step's aux written into a history padded as `_padded` pads."""
    def run(s, b):
        rows = jax.eval_shape(one, s, b, jnp.int32(start))[1]
        history = jax.tree_util.tree_map(lambda a: _padded(jnp.zeros((0, *a.shape), a.dtype), k), rows)

        def body(carry):
            s, history, i, _ = carry
            s, aux, stop = one(s, b, start + i)
            return s, jax.tree_util.tree_map(lambda h, a: h.at[i].set(a), history, aux), i + 1, stop
        return jax.lax.while_loop(lambda c: (c[2] < k) & ~c[3], body, (s, history, jnp.int32(0), jnp.bool_(False)))
    return jit(run, 4, step=False)(_copy(state), batch)


def _returned(aux, keep_aux):
    """`aux` with the leaves a call does not keep (`keep_aux`) replaced by None."""
    flat, tree = jax.tree_util.tree_flatten(aux)
    return jax.tree_util.tree_unflatten(tree, [x if k else None for x, k in
                                               zip(flat, aux_kept(dotted_paths(aux), keep_aux))])


def _padded(rows: jax.Array, k: int) -> jax.Array:
    """A history of the steps run, padded to `k` rows as wrap-loop pads it (NaN, or 0 for integers)."""
    if rows.shape[0] == k:
        return rows
    fill = jnp.nan if jnp.issubdtype(rows.dtype, jnp.inexact) else 0
    return jnp.concatenate([rows, jnp.full((k - rows.shape[0], *rows.shape[1:]), fill, rows.dtype)])


def _difference(got, ref, tolerance: _Tolerance | None = None) -> tuple[str, float, float] | None:
    """None when every leaf loopfuse returned equals the reference's bitwise (or, given the state
    the call started from, within a rolled program's tolerance: see the module docstring), else the
    first differing leaf's (path, max abs difference, max relative difference). Aux leaves the call
    did not keep (None) are not compared."""
    ref_leaves = dict(zip(keyed_paths(ref), jax.tree_util.tree_leaves(ref)))
    is_none = lambda x: x is None  # noqa: E731
    moved = _moves(ref[0], tolerance.before) if tolerance is not None else {}
    for path, x in zip(keyed_paths(got, is_leaf=is_none), jax.tree_util.tree_leaves(got, is_leaf=is_none)):
        if x is None:
            continue
        a, b = _host(x), _host(ref_leaves[path])
        if a.dtype != b.dtype or a.shape != b.shape:
            return _describe(path, a, b)
        if a.tobytes() == b.tobytes():
            continue
        if tolerance is None or path[:3] not in ("[0]", "[1]") or not np.issubdtype(a.dtype, np.inexact):
            return _describe(path, a, b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        allowed = tolerance.rtol * np.max(np.abs(b64), initial=0.0)
        if path[:3] == "[0]":           # a state leaf: plus twice the call's largest change in its part
            allowed += 2 * moved[path]
        if not np.all(np.abs(a64 - b64) <= allowed):
            return _describe(path, a, b)
    return None


def _moves(new, before) -> dict[str, float]:
    """Per floating leaf of the new state `new` (its path in the call's outputs, ``[0]...``), the largest
    change the reference's call made to a floating leaf of the same part of the state, from `before`: the
    state's top-level entry it is in (the params, the optimizer state, ..), or the whole state for a leaf at
    the top, or of a `PackedState`, whose buffers mix the parts."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(new)
    parts = [None if isinstance(new, PackedState) or not p else p[0] for p, _ in leaves]
    change: dict = {}
    for part, (_, x), x0 in zip(parts, leaves, jax.tree_util.tree_leaves(before)):
        a, a0 = _host(x), _host(x0)
        if np.issubdtype(a.dtype, np.inexact) and a.size:
            change[part] = max(change.get(part, 0.0), float(np.max(np.abs(a.astype(np.float64) - a0))))
    return {"[0]" + path[3:]: change.get(part, 0.0) for path, part in zip(keyed_paths((new,)), parts)}


def _host(x) -> np.ndarray:
    return np.asarray(raw(x))


def _describe(path: str, a: np.ndarray, b: np.ndarray) -> tuple[str, float, float]:
    name = {"[0]": "the state", "[1]": "the aux", "[2]": "the steps run", "[3]": "the stop flag"}[path[:3]]
    where = f"{name} leaf {path[3:]}" if path[3:] else name
    if a.shape != b.shape or not (np.issubdtype(a.dtype, np.number) and np.issubdtype(b.dtype, np.number)):
        return f"{where} ({a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)})", float("inf"), float("inf")
    a64, b64 = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64), b.astype(a.dtype).astype(
        np.complex128 if np.iscomplexobj(a) else np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.abs(a64 - b64)
        rel = diff / np.abs(b64)
    return where, float(np.nanmax(diff, initial=0.0)), float(np.nanmax(rel, initial=0.0))


def _variants(options, executable) -> list[tuple[str, Any]]:
    """(what, options without it) for each loopfuse pass, donation and XLA option in effect."""
    passes = pipeline.chosen(options.passes)
    out = [(f"the pass {p.name!r}", replace(options, passes=tuple(q for q in passes if q is not p))) for p in passes]
    if options.donate:
        out.append(("buffer donation (alias-state)", replace(options, donate=False)))
    if options.memory_budget is not None:
        out.append(("memory_budget (the pass 'roll-layers')", replace(options, memory_budget=None)))
    if options.micro_batches is not None:
        out.append(("micro_batches (the pass 'micro-batch')", replace(options, micro_batches=None)))
    user = dict(options.xla_options or {})
    out += [(f"the XLA option {name}", replace(options, xla_options={**user, name: None}))
            for name in executable.xla_options]
    return [(what, replace(v, dump_ir=None, cache_dir=None)) for what, v in out]
