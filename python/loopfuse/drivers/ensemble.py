"""Many solves in one call: ``minimize(..., ensemble=True)`` and ``fit(..., ensemble=True)``.

An ensemble is N members: every state leaf leads with the member axis. The members run in lockstep (at
global step i each running member takes its own step i, all seeing the batch of step i; data wrapped
as `per_member` gives member m its own ``data[m]``) and each stops on its own: `until` (and
`gtol`/`ftol`) and the non-finite test are per member, and a member that stopped costs no more work.

A wrapper around one solve. `minimize` and `fit` run one path, that of one solve, and ask once whether it is
an ensemble (`wrapper`); the answer (`Solo`, `Sole` or `Tiled`) wraps what that path builds (the member's
initial state, its step and stop) and maps the result it returns. A compiled ensemble's Step is derived from
the member's Step (`Step.derived`), so a repeated solve or fit compiles nothing.

How (one program, the step run on tiles). The global step is one device-loop iteration of the
ensemble step (`tiled_step`): the member step vmapped over a tile of T members, run on
``ceil(live / T)`` tiles in a `while` loop, each tile gathering its members' rows (state, and
per-member data) and scattering the rows of those still running back. `Members.order` lists the
members the tiles cover, the running ones first; when the members still running fit in fewer tiles,
it is recomputed (compaction: a stable partition of N indices, O(N), no state moves) and the tiles
cover only them. So the work per step follows the running members in steps of T, while one compiled
program serves every count. The loop around it is loopfuse's own (``Step.loop(K, until=...)``: the
chunks, histories, queued calls, checkpoints, Ctrl-C of `fit` and `minimize`), ending once every
member has stopped.

Why tiles and not a ladder of batch sizes (one program per size N, N/2, ..., 1, a gather between):
each size is a program to compile, and a ladder of log2(N) + 1 sizes compiles as many. A 64-start
L-BFGS fit of an ODE (examples/multistart.py) compiles in ~15 s per program on a 2-core CPU: seven
would take ~100 s where jax.jit compiles one. The tile program compiles once. And a smaller batch
is not only less work: a step with loops of its own (an adaptive ODE solver, a line search) runs them,
vmapped, until the batch's slowest member is done; on that fit an L-BFGS step takes 450 ms on 64
members and 50 ms on 16, so four tiles of 16 cost less than one batch of 64 even before anyone stops.

Policy and cost model. Tiling trades a tile's fixed cost (its kernels' launch and loop overhead, the
gather and scatter) against work: every tile its compaction empties saves its members' work, every
extra tile while all run costs its fixed cost, and a loop of the step whose trip count differs between
members runs, vmapped, until the tile's slowest member is done. The default tile is read from the
member step's program by `tiles` (its module docstring gives the model): the tile whose work equals its
fixed cost (32 quadratics of 64 parameters on a CPU), and one member per tile where the step nests
loops whose trip counts depend on the member (a line search over an adaptive ODE solve). An ensemble
whose members cannot stop before the others (no `until`) runs as one tile, as does GradOnly's, whose
eager step runs one op at a time. A compaction costs O(N) (a cumsum and a scatter of N int32) and runs
when a tile empties, at most N / T times. `Ensemble(tile=T)` sets the tile.

Results. A member's steps, params and history are those of the single-member solve vmapped over a
tile of T members: bitwise ``jax.jit(jax.vmap(solve))`` where XLA computes a batch of T as a batch of
N (elementwise steps always; on CPU a 64-wide float32 sum from T = 64 on, below which XLA vectorizes
the reduction otherwise and a loss differs in its last bit). With T = N (one tile) it is bitwise the
vmapped solve on N members. See README ("Ensembles") for the figures measured.
"""
import functools
import weakref
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .. import validate
from ..compile import stopping
from ..compile.options import StepOptions
from ..errors import StateMismatchError
from ..run.sharding import AXIS, Placement
from ..state import static_leaves
from ..state.data import Dataset
from ..state.leaves import aux_kept, dotted_paths, leaf_name
from ..state.packed import PackedState
from . import tiles
from .results import FitResult, Solution
from .step import Step

RUNNING, UNTIL, NON_FINITE = 0, 1, 2    # `Members.code`: still running, or why the member stopped


@dataclass(frozen=True)
class Ensemble:
    """How an ensemble runs (``ensemble=True`` is ``Ensemble()``).

    tile: members per tile (None: read from the member step's program, see `tiles`; N, one tile, when no
          member can stop before the others).

    Examples:
        >>> import jax.numpy as jnp
        >>> def sgd(x, h):         # a step of gradient descent on 0.5 * sum(h * x**2)
        ...     return x - h * x, {"loss": 0.5 * jnp.sum(h * x * x)}
        >>> x, h = jnp.ones((1024, 64)), jnp.ones(64)
        >>> Ensemble().tile_size(sgd, x, h), Ensemble().tile_size(sgd, x, h, stops=False), Ensemble(tile=16).tile_size(sgd, x, h)
        (32, 1024, 16)
    """

    tile: int | None = None

    def __post_init__(self) -> None:
        if self.tile is not None:
            object.__setattr__(self, "tile", validate.steps(self.tile, "Ensemble(tile=...)"))

    def tile_size(self, member: Callable, state, batch, stops: bool = True, devices=None) -> int:
        """The members per tile of an ensemble of `state` (every leaf [N, ...]; over `devices`, each one's
        share) whose member step is ``member(state, batch) -> (state, aux)`` on `batch` (shared, per-member
        data or a Dataset). `stops`: whether a member can stop before the others, by an `until`; without,
        members run every step unless they diverge, and one tile runs them. The default reads the member's
        program (`tiles.cost`, kept per member and abstract signature: a repeated call traces nothing) and
        the devices' platform."""
        _, n = share(size(state, "state"), devices)
        if self.tile is not None:
            return min(self.tile, n)
        if not stops:
            return n
        platform = devices[0].platform if devices else jax.default_backend()
        return _cost(member, state, batch).tile(n, platform)


def _cost(member: Callable, state, batch) -> tiles.Cost:
    """`tiles.cost` of `member` on one member's state and batch, kept per member and abstract signature."""
    key = _signature((state, batch))
    try:
        costs = _COSTS.setdefault(member, {})
    except TypeError:                  # a callable without weak references: read anew each call
        costs = {}
    if key not in costs:
        one = partial(jax.tree_util.tree_map, lambda x: x[0])
        own = isinstance(batch, PerMember)
        member_batch = jax.eval_shape(
            lambda b: one(b.data) if own else b.batch(np.int32(0)) if isinstance(b, Dataset) else b, batch)
        costs[key] = tiles.cost(member, jax.eval_shape(one, state), member_batch, own)
    return costs[key]


def _signature(tree) -> tuple:
    """`tree`'s structure and its leaves' shapes and dtypes (weak or not), read without tracing."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, tuple((np.shape(x), getattr(x, "dtype", type(x)), getattr(x, "weak_type", None)) for x in leaves)


_COSTS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def wrapper(ensemble, tree, what: str, data) -> tuple["Solo", Any, Any]:
    """How `minimize` and `fit` run, from their ``ensemble=`` argument and `tree` (`what`: their params or
    state): the one place either asks whether it runs an ensemble. `Solo` (one solve), `Sole` (a 1-member
    ensemble: the plain solve on its member, nothing to batch or compact) or `Tiled` (N members), with `tree`
    and `data` as that solve takes them (its leaves that are not arrays held as its structure, `static_leaves`); a
    `Solution` as `tree`, its params (`Solution.params_for`)."""
    if ensemble is True:
        ensemble = Ensemble()
    if ensemble is not False and not isinstance(ensemble, Ensemble):
        raise TypeError(f"ensemble must be True, False or a loopfuse.Ensemble, got {ensemble!r}")
    if isinstance(tree, Solution):
        tree = tree.params_for(ensemble is not False)
    tree = static_leaves.wrap(tree, what)        # leaves that are not arrays (an equinox model's functions): structure
    if ensemble is False:
        if isinstance(data, PerMember):
            raise TypeError("per_member data gives each member of an ensemble its own data: pass ensemble=True")
        return Solo(), tree, data
    if isinstance(tree, PackedState):
        raise TypeError(f"an ensemble's {what} is a pytree whose leaves lead with the member axis, not a PackedState")
    n = size(tree, what)
    check_data(data, n)
    if n == 1:
        tree, own = _member_axis_dropped((tree, data.data if isinstance(data, PerMember) else None))
        return Sole(), tree, data if own is None else own
    return Tiled(ensemble, n, isinstance(data, PerMember)), tree, data


@dataclass(frozen=True)
class Solo:
    """One solve: the driver's own state, step, stop and result (each hook the identity); equal to every
    other of its class (a driver keys what it learned of a solve by it)."""

    def init(self, init: Callable) -> Callable:
        """``init(params, batch) -> state``, the solve's initial state from the member's `init`."""
        return init

    def wrap(self, program, state, batch, until: Callable | None, stop_on_nonfinite: bool, keep_aux) -> tuple:
        """``(program, state, until, stop_on_nonfinite)`` the driver runs, from those of the member's solve:
        `program` its Step (or GradOnly's eager step), `state` its initial state, `batch` what its steps see,
        `until` and `stop_on_nonfinite` its stops, `keep_aux` the aux leaves its history keeps."""
        return program, state, until, stop_on_nonfinite

    def result(self, result: FitResult, names: dict | None = None) -> FitResult:
        """The driver's `FitResult` of the run `result`, its retcodes renamed by `names` (minimize's "converged")."""
        renamed = names.get(str(result.retcode)) if names else None
        return result if renamed is None else replace(result, retcode=renamed)

    def best(self, losses, steps) -> int | None:
        """The best member by its last loss (`losses` [N, steps]): None for one solve."""
        return None


@dataclass(frozen=True)
class Sole(Solo):
    """A 1-member ensemble: the plain solve on its member (`sole`), its result with the member axis."""

    def result(self, result: FitResult, names: dict | None = None) -> FitResult:
        return one_member(super().result(result, names))

    def best(self, losses, steps) -> int | None:
        return _best(losses, steps)


@dataclass(frozen=True)
class Tiled(Solo):
    """N members in one loop, on tiles of the members still running (see the module docstring)."""

    config: Ensemble
    n: int
    own: bool                  # the data is `per_member`

    def init(self, init: Callable) -> Callable:
        members_init = _members_init(init, self.own)
        return lambda params, batch: members_init(params, batch.data if self.own else batch)

    def wrap(self, program, state, batch, until: Callable | None, stop_on_nonfinite: bool, keep_aux) -> tuple:
        """The member's `program` as the ensemble's (`tiled_step`; of a Step, a Step derived from it, its
        devices holding the members), `state` as the members' (`Members`), and the loop's own stop: every
        member has (each on its `until` and `stop_on_nonfinite`)."""
        compiled = isinstance(program, Step)     # else GradOnly's eager step: one tile, nothing jitted
        devices = program.options.devices if compiled else None
        d, n = share(self.n, devices)
        if compiled:
            step = program
            program = step.derived(("ensemble", until, stop_on_nonfinite, keep_aux), lambda: Step(
                static_leaves.on_wrapped(tiled_step(step.fn, until, stop_on_nonfinite, keep_aux, devices)),
                _members_options(step.options)))
        else:
            program = tiled_step(program, until, stop_on_nonfinite, keep_aux)
        tile = self.config.tile_size(step.fn, state, batch, until is not None, devices) if compiled else n
        return program, start(state, tile, d), all_stopped, False

    def result(self, result: FitResult, names: dict | None = None) -> FitResult:
        """Per member: the state, history leaves [N, steps, ...], steps and retcode (members still running
        have the run's: "max_steps", "interrupted" or "error")."""
        members: Members = result.state
        history = (None if result.history is None else
                   jax.tree_util.tree_map(lambda h: np.swapaxes(h, 0, 1), result.history))
        running = "max_steps" if result.retcode in ("until", "non_finite") else str(result.retcode)
        retcode = [{**RETCODES, RUNNING: running}[int(c)] for c in host(members.code)]
        return FitResult(members.state, history, host(members.steps),
                         np.array([(names or {}).get(r, r) for r in retcode]), result.resumed_from)

    def best(self, losses, steps) -> int | None:
        return _best(losses, steps)


@partial(jax.tree_util.register_dataclass, data_fields=["data"], meta_fields=[])
@dataclass(frozen=True)
class PerMember:
    """Data with one entry per ensemble member (see `per_member`)."""

    data: Any


def per_member(data) -> PerMember:
    """Mark `data` as one entry per member of an ensemble: every leaf leads with the member axis N and
    member m sees ``data[m]`` (an unmarked batch is shared by all members, whatever its shape).

    Examples:
        >>> import jax.numpy as jnp, optax, loopfuse
        >>> targets = jnp.array([[1.0], [2.0], [3.0]])
        >>> sol = loopfuse.minimize(lambda w, t: jnp.sum((w - t) ** 2), jnp.zeros((3, 1)),
        ...                         data=loopfuse.per_member(targets), optimizer=optax.sgd(0.5), steps=2,
        ...                         ensemble=True)
        >>> sol.params[:, 0].tolist(), sol.steps.tolist()
        ([1.0, 2.0, 3.0], [2, 2, 2])
    """
    if isinstance(data, (Dataset, PerMember)):
        raise TypeError(f"per_member takes a pytree of arrays, not a {type(data).__name__}: a Dataset is "
                        "shared by all members (pass it unwrapped)")
    return PerMember(data)


class Members(NamedTuple):
    """The state an ensemble's loop carries (and checkpoints). Over D devices each holds N / D members
    and their bookkeeping (an `order` of local indices, a `live`), compacting them on its own."""

    state: Any              # the members' states: every leaf [N, ...]
    steps: Any              # int32[N]: the steps each member ran
    code: Any               # int8[N]: RUNNING, or why the member stopped (UNTIL, NON_FINITE)
    order: Any              # int32[D * (N / D + T)]: per device, the members the tiles cover, running ones
                            # first; then N / D (padding)
    live: Any               # int32[D]: per device, the members of `order` the tiles cover (the running ones at
                            # the last compaction)


def size(tree, what: str) -> int:
    """N, the leading axis every leaf of `tree` shares (a StateMismatchError naming a leaf that does not)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    if not leaves:
        raise StateMismatchError(f"the ensemble's {what} has no leaves")
    n = None
    for path, x in leaves:
        shape = np.shape(x)
        n = shape[0] if n is None and shape else n
        if not shape or shape[0] != n:
            raise StateMismatchError(
                f"{leaf_name(what, path)} has shape {tuple(shape)}; in an "
                f"ensemble every {what} leaf leads with the member axis" + (f" (N = {n})" if n is not None else ""))
    assert n is not None
    return n


def start(state, tile: int, devices: int = 1) -> Members:
    """`Members` of the members' initial `state` (N from its leaves), all running, in tiles of `tile` on
    each of `devices` devices (N / devices members each)."""
    n = size(state, "state") // devices
    order = np.tile(np.concatenate([np.arange(n, dtype=np.int32), np.full(tile, n, np.int32)]), devices)
    # host values: the first call places them (on every process alike, over jax.distributed)
    return Members(state, np.zeros(n * devices, np.int32), np.zeros(n * devices, np.int8), order,
                   np.full(devices, n, np.int32))


def share(n: int, devices) -> tuple[int, int]:
    """(D, N / D): the device count of ``CompiledLoop(devices=...)`` (1 without) and each one's members
    (a ValueError unless D divides N)."""
    d = 1 if devices is None else len(devices)
    if n % d:
        raise ValueError(f"an ensemble of {n} members cannot be split evenly over {d} devices; pass a multiple of {d}")
    return d, n // d


@functools.lru_cache(maxsize=64)
def _members_init(init: Callable, own: bool) -> Callable:
    """The member's `init` vmapped over the members (and `own` data), jitted: kept per `init`, as minimize keeps
    the program it starts (vmapped anew at each call, the init alone took a millisecond)."""
    return jax.jit(jax.vmap(init, in_axes=(0, 0 if own else None)))


def _members_options(options: StepOptions) -> StepOptions:
    """The options of an ensemble's Step from its member Step's: every aux leaf the ensemble step returns kept
    (it drops the member's others itself), no layers rolled (roll-layers reads the layers of ``@main``'s
    block, and a member's are inside the loop over tiles; see `chunks.carried`), and over ``devices``
    sharding "members" (each device its share)."""
    options = replace(options, memory_budget=None)
    if options.devices is None:
        return replace(options, keep_aux=None)
    if options.sharding not in (None, "members"):
        raise ValueError(f"an ensemble splits its members over the devices; sharding={options.sharding!r} "
                         "does not apply (leave it unset)")
    return replace(options, keep_aux=None, sharding="members")


@jax.jit
def _member_axis_dropped(tree):
    """A 1-member ensemble's leaves (its params or state, and its per-member data) without the member axis,
    in one call: such an ensemble runs the plain solve on its member, nothing to batch or compact."""
    return jax.tree_util.tree_map(lambda x: jax.lax.squeeze(x, (0,)), tree)


@jax.jit
def _member_axis_added(tree):
    """The plain solve's leaves as a 1-member ensemble's, in one call."""
    return jax.tree_util.tree_map(lambda x: jax.lax.expand_dims(x, (0,)), tree)


def one_member(result: FitResult) -> FitResult:
    """A plain `FitResult` as the result of a 1-member ensemble."""
    history = None if result.history is None else jax.tree_util.tree_map(lambda h: h[None], result.history)
    return FitResult(_member_axis_added(result.state), history,
                     np.array([result.steps], np.int32), np.array([result.retcode]), result.resumed_from)


def check_data(data, n: int) -> None:
    """Per-member data must lead with the ensemble's N (a StateMismatchError naming the leaf)."""
    if isinstance(data, PerMember) and size(data.data, "per-member data") != n:
        raise StateMismatchError(f"per_member data has {size(data.data, 'per-member data')} entries per leaf, "
                                 f"the ensemble {n} members")


def all_stopped(state: Members, aux=None) -> jax.Array:
    """Whether every member has stopped (the ensemble loop's `until`)."""
    return jnp.sum(state.live) == 0


def tiled_step(fn: Callable, until: Callable | None, stop_on_nonfinite: bool, keep_aux, devices=None) -> Callable:
    """The ensemble step ``(Members, batch) -> (Members, aux)`` of one member's ``fn(state, batch) -> (state,
    aux)``: each member stops after a step where ``until(new_state, aux)`` is true or (`stop_on_nonfinite`)
    its kept floating aux leaves hold a NaN or Inf. Aux: the member aux tree, kept leaves [N, ...] (NaN/0 for
    members stopped before this step), the leaves `keep_aux` drops None. `devices`: split the members over
    these (see `Members`)."""
    def outcome(new_state, aux):
        leaves, tree = jax.tree_util.tree_flatten(aux)
        paths = dotted_paths(aux)
        kept = aux_kept(paths, keep_aux)
        flag = (stopping.predicate(until(new_state, aux)) if until is not None else False)
        bad = stopping.nonfinite({p: x for p, x, k in zip(paths, leaves, kept) if k}) if stop_on_nonfinite else False
        return _code(flag, bad), jax.tree_util.tree_unflatten(tree, [x if k else None for x, k in zip(leaves, kept)])
    return _on_devices(_batched(fn, outcome, devices is not None), devices)


def _on_devices(step: Callable, devices) -> Callable:
    """`step` on each device's share of the members (``shard_map`` over the "members" mesh), or `step`."""
    if devices is None:
        return step
    mesh = Placement(devices, "members").mesh
    return jax.shard_map(step, mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P(AXIS), check_vma=False)


def _code(until, nonfinite) -> jax.Array:
    """A member's code after a step: NON_FINITE before UNTIL (as one solve's retcode), else RUNNING."""
    return jnp.where(nonfinite, NON_FINITE, jnp.where(until, UNTIL, RUNNING)).astype(jnp.int8)


def _batched(update: Callable, outcome: Callable, sharded: bool = False) -> Callable:
    """``step(members, batch) -> (members, rows)``: `update` (one member's step) on every running member;
    ``outcome(new_state, aux) -> (code, kept aux)`` per member; `rows`: the kept aux, [N, ...], unwritten
    (NaN, 0) for the members that did not step. Tiled when the state's `order` says so (see the module
    docstring). `sharded`: `members` is one device's share (inside `shard_map`), per-member data whole."""
    def member(state, batch):
        new_state, aux = update(state, batch)
        code, kept = outcome(new_state, aux)
        return new_state, code, kept

    def step(m: Members, batch):
        n = m.steps.shape[0]
        tile = m.order.shape[0] - n
        own = isinstance(batch, PerMember)
        live = m.live[0]
        data = batch.data if own else None
        if own and sharded:        # this device's members' rows of the (replicated) per-member data
            at = jax.lax.axis_index(AXIS) * n
            data = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_slice_in_dim(x, at, n), data)
        run = _vmapped(member, own, min(tile, n))
        if tile >= n:          # also GradOnly's eager step: nothing jitted here
            new, code, kept = run(m.state, data if own else batch)
            going = m.code == RUNNING
            code = jnp.where(going, code, m.code)
            state = jax.tree_util.tree_map(lambda a, b: _where(going, a, b), new, m.state)
            rows = jax.tree_util.tree_map(lambda x: _where(going, x, _unwritten(x)), kept)
            return Members(state, m.steps + going, code, m.order, jnp.sum(code == RUNNING, dtype=jnp.int32)[None]), rows

        def one_tile(t, carry):
            state, steps, code, rows = carry
            idx = jax.lax.dynamic_slice(m.order, (t * tile,), (tile,))
            valid = (t * tile + jnp.arange(tile) < live) & (code.at[idx].get(mode="fill", fill_value=UNTIL) == RUNNING)
            read = jnp.where(valid, idx, idx[jnp.argmax(valid)])   # an idle slot computes a running member again
            take = lambda x: x.at[read].get(mode="promise_in_bounds")  # noqa: E731
            new, c, out = run(jax.tree_util.tree_map(take, state),
                              jax.tree_util.tree_map(take, data) if own else batch)
            write = jnp.where(valid, idx, n)                        # n: dropped
            put = lambda x, y: x.at[write].set(y, mode="drop")      # noqa: E731
            return (jax.tree_util.tree_map(put, state, new), steps.at[write].add(1, mode="drop"), put(code, c),
                    jax.tree_util.tree_map(put, rows, out))

        run = jax.jit(run, inline=True)   # so that `eval_shape` and the tile loop share one trace of the step
        shapes = jax.eval_shape(run, jax.tree_util.tree_map(lambda x: x[:tile], m.state),
                                jax.tree_util.tree_map(lambda x: x[:tile], data) if own else batch)[2]
        rows = jax.tree_util.tree_map(lambda s: _unwritten(jax.ShapeDtypeStruct((n, *s.shape[1:]), s.dtype)), shapes)
        tiles = (live + tile - 1) // tile
        state, steps, code, rows = jax.lax.fori_loop(0, tiles, one_tile, (m.state, m.steps, m.code, rows))
        going = code == RUNNING
        count = jnp.sum(going, dtype=jnp.int32)
        order, live = jax.lax.cond((count + tile - 1) // tile < tiles, lambda: (_partition(going, tile), count),
                                   lambda: (m.order, live))
        return Members(state, steps, code, order, live[None]), rows
    return step


def _vmapped(member: Callable, own: bool, size: int) -> Callable:
    """`member` over a batch of `size` members (batched data when `own`): vmapped, or for one member the
    step itself on it (so that a one-member ensemble computes what one solve does: XLA may compile a
    vmapped batch of one, its dots say, to other last bits)."""
    if size > 1:
        return jax.vmap(member, in_axes=(0, 0 if own else None))
    first = partial(jax.tree_util.tree_map, lambda x: x[0])

    def one(state, batch):
        return jax.tree_util.tree_map(lambda x: x[None], member(first(state), first(batch) if own else batch))
    return one


def _where(going, new, old):
    """`new` for the members `going`, `old` for the others (`going` [N] against leaves [N, ...])."""
    return jnp.where(going.reshape(going.shape + (1,) * (jnp.ndim(new) - 1)), new, old)


def _unwritten(x):
    """An array like `x` of what a stopped loop's history holds: NaN (NaN + NaN i) for floating, else 0."""
    dtype = x.dtype
    value = (complex(np.nan, np.nan) if jnp.issubdtype(dtype, jnp.complexfloating) else
             np.nan if jnp.issubdtype(dtype, jnp.floating) else 0)
    return jnp.full(x.shape, value, dtype)


def _partition(going, tile: int) -> jax.Array:
    """`Members.order` for the running members `going`: their indices in order, then the others', then
    `tile` paddings (N)."""
    n = going.shape[0]
    count = jnp.sum(going, dtype=jnp.int32)
    at = jnp.where(going, jnp.cumsum(going, dtype=jnp.int32) - 1, count + jnp.cumsum(~going, dtype=jnp.int32) - 1)
    return jnp.full(n + tile, n, jnp.int32).at[at].set(jnp.arange(n, dtype=jnp.int32))


# ---- results --------------------------------------------------------------------------------------
RETCODES = {RUNNING: "max_steps", UNTIL: "until", NON_FINITE: "non_finite"}    # a member's, as a run's retcode


def host(x) -> np.ndarray:
    """`x` on the host whole, also where it is split over several processes' devices (jax.distributed)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _best(losses, steps) -> int | None:
    """The member with the lowest finite last loss (`losses` [N, steps], `steps` [N]); None if none is finite."""
    losses, steps = np.asarray(losses), np.asarray(steps)
    ran = np.flatnonzero(steps > 0)
    last = np.full(len(steps), np.nan)
    last[ran] = losses[ran, steps[ran] - 1]
    finite = np.isfinite(last)
    return int(np.argmin(np.where(finite, last, np.inf))) if finite.any() else None
