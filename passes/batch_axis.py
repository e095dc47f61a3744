"""Where the batch axis goes in a step: the analysis behind micro-batch (it reads the IR, never edits it).

Data-parallel sharding propagation (Shardy's, GSPMD's) where the "devices" are the slices of a
micro-batch loop and the all-reduce is an accumulation. Every value of ``@main``'s block gets a fact:

* `REPLICATED`: the same whatever the slice (it does not depend on the batch: parameters, constants,
  the broadcast of 1/B a mean's gradient starts from);
* `Split` ``(dim)``: the value is cut along `dim` as the batch is: with m slices on D devices the dim is
  D runs of m equal chunks (one run on one device), and slice i's ops compute chunk i of each run from
  chunk i of their operands (per-example values: activations, their cotangents);
* `Partial` ``(combine)``: the op combines chunks of the batch axis (a reduce-add over it, a
  dot_general contracting it, a scatter-add of per-example rows into zeros): each slice computes its
  own part and the parts are combined in slice order, a sum where ``combine`` is ``stablehlo.add``;
  also an op on partial sums alone that nothing else reads, which adds, subtracts or negates sums (the
  terms of a gradient jax sums over a leaf's uses), or moves their elements on the way to such an op
  (`_sum_of_sums`, `_unabsorbed`), run on each slice's parts;
* `AFTER`: computed from partial sums and replicated values only: once, after the loop, on the
  combined values (the loss, the optimizer update).

The batch arguments (those without ``loopfuse.state``, ``loopfuse.step_index`` or ``loopfuse.stopped``,
of rank 1 or more) are split along dim 0. Under a `Dataset` (a step index argument) they are the
dataset's arrays, which the step reads by a ``dynamic_slice`` of ``batch_size`` rows (split along 0),
or, shuffled, by gathering the rows of the epoch order's ``dynamic_slice`` ``[1, batch_size]`` (split
along 1); the arrays themselves are replicated. Facts follow dims, never sizes: each op's rule says
where its result is split given where its operands are (`_rule`), and which operands a slice reads
cut (a replicated operand aligned with a split one is cut too). An op that reads a partial sum and a
split value (batch norm's mean in the normalisation, a masked mean's 1/sum(mask) in the per-example
cotangent), a rule that does not hold (slicing examples out, sorting or gathering along the batch
axis, the outer product of two per-example values), and any op with a split operand that no rule
knows (custom calls, RNG, loops and conditionals of the user's, calls that were not inlined) make
the step one that does not decompose over its examples: `Refusal` names the op and its line.
"""
import math
from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy, stablehlo

from .dataflow import ARG, Dataflow
from .dead_code import first_effect, has_side_effects
from .functions import arg_attrs, enclosing_module
from .locations import described
from .matchers import ELEMENTWISE, slice_attrs, splat, splat_value
from .module_pass import PassError
from .vocabulary import SDY_SHARDING, SHARDINGS, STATE, STEP_INDEX, STOPPED

REPLICATED, AFTER = "replicated", "after"


@dataclass(frozen=True)
class Split:
    dim: int


@dataclass(frozen=True)
class Partial:
    combine: str          # the op that combines two slices' parts: stablehlo.add, maximum, minimum, and, or


class Refusal(Exception):
    """The step does not decompose over its examples: `op` (None: the whole step) and why."""

    def __init__(self, op: ir.Operation | None, why: str):
        super().__init__(f"{described(op)} {why}" if op is not None else why)
        self.op = op


@dataclass(frozen=True)
class Cut:
    """How one op runs inside the loop, on one slice."""

    results: tuple               # per result: its split dim, or None for a partial sum
    operands: tuple              # per operand: the dim a slice reads it cut along, or None: as it is
    resize: tuple = ()           # (attribute, index): the entry that is a size along the cut dim
    combine: str | None = None   # a partial sum: the op that combines the slices' parts


@dataclass
class Plan:
    """The micro-batch loop of one step (see the module docstring)."""

    g: Dataflow
    slices: int
    runs: int                                   # the devices the batch axis is spread over (1: one)
    facts: list                                 # value id -> fact
    cuts: dict = field(default_factory=dict)    # op id -> Cut, for the ops the loop runs
    inputs: dict = field(default_factory=dict)  # value id -> split dim: values made before the loop, read cut
    outputs: dict = field(default_factory=dict)  # return operand index -> split dim: written back chunk by chunk
    hoist: list = field(default_factory=list)   # replicated ops after `at` the loop reads: moved before it
    at: int = 0                                 # op id the loop goes before: the first AFTER op, or the return

    @property
    def roots(self) -> list[int]:
        """The ops whose results are partial sums read after the loop, in program order (a partial sum the
        loop combines further, `_sum_of_sums`, is not accumulated itself)."""
        g = self.g
        return [n for n, c in self.cuts.items() if c.combine is not None
                and any(u not in self.cuts for u, _ in g.users[g.results[n][0]])]


def is_batch(attrs: dict) -> bool:
    """Whether an argument with these attributes is a batch leaf (or a Dataset's array)."""
    return not any(a in attrs for a in (STATE, STEP_INDEX, STOPPED))


def batch_inputs(main: func.FuncOp) -> list[int]:
    """The argument numbers of the batch leaves, or of a Dataset's arrays (and epoch orders)."""
    return [i for i, a in enumerate(arg_attrs(main)) if is_batch(a)]


def batch_arguments(main: func.FuncOp) -> list[int]:
    """The argument numbers of the batch leaves of rank 1 or more (a Dataset's arrays: none)."""
    attrs = arg_attrs(main)
    if any(STEP_INDEX in a for a in attrs):
        return []
    return [i for i, a in enumerate(attrs) if is_batch(a) and ir.RankedTensorType(main.type.inputs[i]).rank > 0]


def analyze(main: func.FuncOp, slices: int, pure: frozenset = frozenset()) -> Plan:
    """The plan of `main`'s step in `slices` slices (`pure`: the module's callees free of effects);
    `Refusal` where it does not decompose, `PassError` where a batch does not divide into the slices."""
    block = main.body.blocks[0]
    g = Dataflow.of(block)
    attrs = arg_attrs(main)
    dataset = set(batch_inputs(main)) if any(STEP_INDEX in a for a in attrs) else set()
    plan = Plan(g, slices, 1, [REPLICATED] * len(g.values))
    facts = plan.facts
    origin: dict[int, int] = {}       # value id -> the op id of the partial sum it comes from
    for a in batch_arguments(main):
        facts[a] = Split(0)
        plan.inputs[a] = 0
    runs = {_runs(main, attrs[a], 0) for a in plan.inputs}
    ret = len(g.ops) - 1
    at = None
    for n, op in enumerate(g.ops[:-1]):
        fs = [facts[v] for v in g.operands[n]]
        later = [v for v, f in zip(g.operands[n], fs) if f is AFTER or isinstance(f, Partial)]
        split = {k: f.dim for k, f in enumerate(fs) if isinstance(f, Split)}
        if later and split:
            raise Refusal(op, f"reads a per-example value and a sum over the batch (from "
                              f"{described(g.ops[origin[later[0]]])}): the step does not decompose over its examples")
        if later:
            if _sum_of_sums(g, n, fs):      # run in the loop on the slices' parts: its result is their sum
                plan.cuts[n] = Cut((None,), (None,) * len(fs), combine="stablehlo.add")
                facts[g.results[n][0]], origin[g.results[n][0]] = Partial("stablehlo.add"), origin[later[0]]
                continue
            at = n if at is None else at
            for r in g.results[n]:
                facts[r], origin[r] = AFTER, origin[later[0]]
            continue
        if not split:
            seed = _dataset_batch(g, n, dataset)
            if seed is not None:
                facts[g.results[n][0]] = Split(seed)
                plan.inputs[g.results[n][0]] = seed
            continue
        if has_side_effects(op) and op.name != "sdy.sharding_constraint":
            raise Refusal(op, "may have effects (a custom call, a collective) and reads a per-example value: "
                              "micro-batch does not run it once per slice")
        cut = _rule(op, split)
        needs = cut.operands + (None,) * (len(fs) - len(cut.operands))   # values its regions capture: as they are
        for k, (f, dim) in enumerate(zip(fs, needs)):
            if isinstance(f, Split) and f.dim != dim:
                raise Refusal(op, f"reads operand {k} split along dim {f.dim} where "
                                  + ("it needs it whole" if dim is None else f"its other operands are split along {dim}")
                                  + ": it mixes examples")
        if op.name == "sdy.sharding_constraint":
            runs.add(_axes_size(main, op.attributes["sharding"], cut.results[0]))
        plan.cuts[n] = cut
        for r, d in zip(g.results[n], cut.results):
            facts[r] = Split(d) if d is not None else Partial(cut.combine or "")
            if d is None:
                origin[r] = n
    at = _unabsorbed(plan, at)
    runs -= {1}
    if len(runs) > 1:
        raise Refusal(None, f"the batch is spread over different device counts ({sorted(runs)})")
    plan.runs = runs.pop() if runs else 1
    if not plan.cuts:
        raise Refusal(None, "no op reads a per-example value: there is nothing to cut")
    plan.at = ret if at is None else at
    for k, v in enumerate(g.operands[ret]):
        if isinstance(facts[v], Split) and v not in plan.inputs:
            plan.outputs[k] = facts[v].dim
    _check_sizes(main, plan)
    plan.hoist = _hoist(plan, pure)
    return plan


def _dataset_batch(g: Dataflow, n: int, dataset: set) -> int | None:
    """The split dim of op `n`'s result where it is the step's batch read from a Dataset's array
    (``Dataset.batch``: rows ``[start, start + batch_size)``) or an epoch order (``_Ordered.batch``:
    ``order[row, start:start + batch_size]``, a ``[1, batch_size]`` slice of a 2-D table), else None."""
    op = g.ops[n]
    if op.name != "stablehlo.dynamic_slice" or g.arg_number(g.operands[n][0]) not in dataset:
        return None
    shape, sizes = _shape(op.operands[0]), _i64s(op, "slice_sizes")
    if sizes[1:] == shape[1:] and sizes[0] > 1:
        return 0
    return 1 if len(shape) == 2 and sizes[0] == 1 and sizes[1] > 1 else None


def _check_sizes(main: func.FuncOp, plan: Plan) -> None:
    """Every split value divides into the slices on every device: a batch input that does not is an
    error (the option does not fit the batch), any other a refusal."""
    g, parts = plan.g, plan.slices * plan.runs
    per = f" on each of {plan.runs} devices" if plan.runs > 1 else ""
    for v, f in enumerate(plan.facts):
        if not isinstance(f, Split):
            continue
        size = ir.RankedTensorType(g.values[v].type).shape[f.dim]
        if ir.ShapedType.is_dynamic_size(size):
            raise PassError(main, f"{g.values[v].type} has a dynamic size along the batch axis: micro-batch cuts "
                                  "static shapes only")
        if size % parts == 0:
            continue
        if v in plan.inputs:
            what = (f"batch argument {v}" if g.owner[v] == ARG else
                    f"the batch read by {described(g.ops[g.owner[v]])}")
            raise PassError(main, f"{what} ({g.values[v].type}) has {size} rows along dim {f.dim}, which do not "
                                  f"divide into {plan.slices} slices{per}")
        raise Refusal(g.ops[g.owner[v]], f"makes a dim of {size} from the batch axis, which does not divide into "
                                         f"{plan.slices} slices{per}")


def _hoist(plan: Plan, pure: frozenset) -> list[int]:
    """The ops after `plan.at` that the loop reads (replicated ones, in program order), checked
    free of effects (`pure`: the callees without any) so that they can move before the loop."""
    g = plan.g
    need: set = set()
    todo = [v for n in plan.cuts for v in g.operands[n]]
    while todo:
        p = g.owner[todo.pop()]
        if p == ARG or p in plan.cuts or p < plan.at or p in need:
            continue
        need.add(p)
        todo.extend(g.operands[p])
    for p in need:
        if first_effect(g.ops[p], pure) is not None:
            raise Refusal(g.ops[p], "has effects and comes after the loss, but the slices read it before")
    return sorted(need)


# ops whose result, on the sums of their operands' parts, is the sum of their results on the parts: those
# that only move elements, and add, subtract and negate
LINEAR = frozenset(f"stablehlo.{n}" for n in ("transpose", "reshape", "slice", "concatenate", "add", "subtract",
                                              "negate"))


def _sum_of_sums(g: Dataflow, n: int, facts: list) -> bool:
    """Whether op `n`, run in the loop on the slices' parts of its operands, gives a sum over the batch no
    larger than what it reads: every operand a sum over the batch (combined by add) that only op `n`
    reads, and the op one that moves elements (a gradient transposed or reshaped) or adds, subtracts or
    negates sums (the terms of a gradient jax sums over a leaf's uses, a leaf every layer reads). The loop
    then accumulates the one result instead of each operand: the same sums, reassociated (each slice's
    terms added first, then the slices), one accumulator instead of several. Sums combined otherwise
    (max, min, and, or) are left alone."""
    return g.ops[n].name in LINEAR and len(g.results[n]) == 1 and all(len(g.users[v]) == 1 for v in g.operands[n]) \
        and all(isinstance(f, Partial) and f.combine == "stablehlo.add" for f in facts)


def _unabsorbed(plan: Plan, at: int | None) -> int | None:
    """Give back to after the loop each op `_sum_of_sums` put in it that reads one partial sum and
    whose result the loop would accumulate (a gradient transposed, and nothing added to it): in the loop it
    saves no accumulator, and it would change how XLA computes the sum it reads. Later ops first, so a chain
    of them goes back whole. The first op after the loop (`at`), earlier where one goes back."""
    g = plan.g
    for n in reversed([n for n, c in plan.cuts.items() if c.combine is not None and len(g.operands[n]) == 1
                       and isinstance(plan.facts[g.operands[n][0]], Partial)]):
        if any(u not in plan.cuts for u, _ in g.users[g.results[n][0]]):
            del plan.cuts[n]
            plan.facts[g.results[n][0]] = AFTER
            at = n if at is None else min(at, n)
    return at


# ---- the rules ---------------------------------------------------------------------------------------
COMBINE = {"stablehlo.add": stablehlo.AddOp, "stablehlo.maximum": stablehlo.MaxOp,   # a reduction's op -> its class
           "stablehlo.minimum": stablehlo.MinOp, "stablehlo.and": stablehlo.AndOp, "stablehlo.or": stablehlo.OrOp}


def _rule(op: ir.Operation, split: dict) -> Cut:
    """Where `op`'s results are split given its split operands (`split`: operand index -> dim), and
    which operands a slice reads cut; `Refusal` where no rule holds."""
    name = op.name
    if name in ELEMENTWISE or name == "stablehlo.bitcast_convert" and _shape(op.operands[0]) == _shape(op.result):
        d = next(iter(split.values()))
        rank = len(_shape(op.results[0]))
        return Cut((d,) * len(op.results), tuple(d if len(_shape(v)) == rank else None for v in op.operands))
    rule = _RULES.get(name)
    if rule is None:
        raise Refusal(op, "reads a per-example value and is no op micro-batch knows how to cut "
                          "(custom calls, RNG, loops and conditionals are not cut)")
    return rule(op, split)


def _broadcast(op, split):
    d = split[0]
    return Cut((_i64s(op, "broadcast_dimensions")[d],), (d,))


def _transpose(op, split):
    d = split[0]
    return Cut((_i64s(op, "permutation").index(d),), (d,))


def _reshape(op, split):
    """The layout rule: the result is split along the dim that starts where the batch axis starts in
    the elements' order (the same elements before it); chunk i of the operand is then chunk i of the
    result wherever that dim divides into the chunks (`_check_sizes`): a batch axis reshaped into
    [examples, rows], per-example dims merged into it, unit dims added or dropped."""
    d = split[0]
    shape_in, shape_out = _shape(op.operands[0]), _shape(op.result)
    before = math.prod(shape_in[:d])
    for e, size in enumerate(shape_out):
        if math.prod(shape_out[:e]) == before and size > 1:
            return Cut((e,), (d,))
    raise Refusal(op, f"reshapes {shape_in} to {shape_out}, merging the batch axis (dim {d}) into an outer dim")


def _reduce(op, split):
    k = len(op.operands) // 2
    d = next(iter(split.values()))
    dims = _i64s(op, "dimensions")
    if d not in dims:
        r = d - sum(1 for x in dims if x < d)
        return Cut((r,) * k, (d,) * k + (None,) * k)
    combine = _combiner(op.regions[0])
    if k != 1:
        raise Refusal(op, "reduces several values together over the batch axis (an argmax over examples)")
    if combine is None:
        raise Refusal(op, "reduces over the batch axis with an op other than add, max, min, and, or")
    if not _identity(op.operands[1], combine):
        raise Refusal(op, "reduces over the batch axis from an initial value that is not its op's identity")
    return Cut((None,), (d, None), combine=combine)


def _dot_general(op, split):
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    batch = (list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions))
    contract = (list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions))
    free = [[x for x in range(len(_shape(op.operands[s]))) if x not in batch[s] and x not in contract[s]]
            for s in (0, 1)]

    def role(s: int, d: int) -> tuple:
        return ("batch", batch[s].index(d)) if d in batch[s] else \
            ("contract", contract[s].index(d)) if d in contract[s] else ("free", free[s].index(d))

    roles = {s: role(s, d) for s, d in split.items()}
    if len(roles) == 2 and (roles[0] != roles[1] or roles[0][0] == "free"):
        raise Refusal(op, "multiplies two per-example values along different axes (an outer product over examples)")
    s, (kind, p) = next(iter(roles.items()))
    if kind == "batch":
        return Cut((p,), (batch[0][p], batch[1][p]))
    if kind == "contract":
        return Cut((None,), (contract[0][p], contract[1][p]), combine="stablehlo.add")
    return Cut((len(batch[0]) + p,), (split[0], None)) if s == 0 else \
        Cut((len(batch[0]) + len(free[0]) + p,), (None, split[1]))


def _slice(op, split):
    d = split[0]
    start, limit, strides = slice_attrs(op) or ([], [], [])
    if (start[d], limit[d], strides[d]) != (0, _shape(op.operands[0])[d], 1):
        raise Refusal(op, f"takes some rows of the batch axis (dim {d})")
    return Cut((d,), (d,), (("limit_indices", d),))


def _dynamic_slice(op, split):
    if set(split) != {0}:
        raise Refusal(op, "slices at a per-example position")
    d = split[0]
    if _i64s(op, "slice_sizes")[d] != _shape(op.operands[0])[d]:
        raise Refusal(op, f"takes some rows of the batch axis (dim {d})")
    return Cut((d,), (d,) + (None,) * (len(op.operands) - 1), (("slice_sizes", d),))


def _dynamic_update_slice(op, split):
    if set(split) - {0, 1}:
        raise Refusal(op, "writes at a per-example position")
    d = next(iter(split.values()))
    if _shape(op.operands[1])[d] != _shape(op.operands[0])[d]:
        raise Refusal(op, f"writes some rows of the batch axis (dim {d})")
    return Cut((d,), (d, d) + (None,) * (len(op.operands) - 2))


def _concatenate(op, split):
    d = next(iter(split.values()))
    if d == ir.IntegerAttr(op.attributes["dimension"]).value:
        raise Refusal(op, f"joins values along the batch axis (dim {d})")
    return Cut((d,), (d,) * len(op.operands))


def _pad(op, split):
    d = split[0]
    if any(_i64s(op, a)[d] for a in ("edge_padding_low", "edge_padding_high", "interior_padding")):
        raise Refusal(op, f"pads the batch axis (dim {d})")
    return Cut((d,), (d, None))


def _sort(op, split):
    d = next(iter(split.values()))
    if d == ir.IntegerAttr(op.attributes["dimension"]).value:
        raise Refusal(op, f"sorts along the batch axis (dim {d})")
    return Cut((d,) * len(op.results), (d,) * len(op.operands))


def _top_k(op, split):
    d = split[0]
    if d == len(_shape(op.operands[0])) - 1:
        raise Refusal(op, f"takes the top k along the batch axis (dim {d})")
    return Cut((d, d), (d,))


def _reduce_window(op, split):
    k = len(op.operands) // 2
    d = next(iter(split.values()))
    ones = [_i64s(op, a)[d] if a in op.attributes else 1
            for a in ("window_dimensions", "window_strides", "base_dilations", "window_dilations")]
    padding = ir.DenseIntElementsAttr(op.attributes["padding"]) if "padding" in op.attributes else None
    if ones != [1, 1, 1, 1] or padding is not None and (padding[2 * d], padding[2 * d + 1]) != (0, 0):
        raise Refusal(op, f"slides a window along the batch axis (dim {d})")
    return Cut((d,) * k, (d,) * k + (None,) * k)


def _gather(op, split):
    dn = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    operand_batching, indices_batching = list(dn.operand_batching_dims), list(dn.start_indices_batching_dims)
    out_rank, ivd = len(_shape(op.result)), dn.index_vector_dim
    index_dims = [x for x in range(len(_shape(op.operands[1]))) if x != ivd]
    batch_out = [x for x in range(out_rank) if x not in list(dn.offset_dims)]
    if 1 in split:
        e = split[1]
        if e == ivd:
            raise Refusal(op, "gathers at per-example positions of the same rows")
        od = operand_batching[indices_batching.index(e)] if e in indices_batching else None
        return Cut((batch_out[index_dims.index(e)],), (od, e))
    d = split[0]
    if d in operand_batching:
        e = indices_batching[operand_batching.index(d)]
        return Cut((batch_out[index_dims.index(e)],), (d, e))
    offsets = [x for x in range(len(_shape(op.operands[0]))) if x not in list(dn.collapsed_slice_dims)
               and x not in operand_batching]
    if d not in offsets or d in list(dn.start_index_map) or _i64s(op, "slice_sizes")[d] != _shape(op.operands[0])[d]:
        raise Refusal(op, f"gathers along the batch axis (dim {d}): it picks examples")
    return Cut((list(dn.offset_dims)[offsets.index(d)],), (d, None), (("slice_sizes", d),))


def _scatter(op, split):
    if len(op.operands) != 3:
        raise Refusal(op, "scatters several values at once")
    dn = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    input_batching, indices_batching = list(dn.input_batching_dims), list(dn.scatter_indices_batching_dims)
    window_updates, ivd = list(dn.update_window_dims), dn.index_vector_dim
    index_dims = [x for x in range(len(_shape(op.operands[1]))) if x != ivd]
    scatter_updates = [x for x in range(len(_shape(op.operands[2]))) if x not in window_updates]
    window_operand = [x for x in range(len(_shape(op.operands[0])))
                      if x not in list(dn.inserted_window_dims) and x not in input_batching]
    if 1 in split:
        e = split[1]
        if e == ivd:
            raise Refusal(op, "scatters to per-example positions of the same rows")
        f = scatter_updates[index_dims.index(e)]
        if e in indices_batching:
            d = input_batching[indices_batching.index(e)]
            return Cut((d,), (d, e, f))
        if 0 not in split and _combiner(op.regions[0]) == "stablehlo.add" and splat_value(op.operands[0]) == 0:
            return Cut((None,), (None, e, f), combine="stablehlo.add")    # per-example rows added into zeros
        raise Refusal(op, "scatters per-example rows into shared rows, not by adding them into zeros")
    if 0 in split:
        d = split[0]
        if d not in window_operand:
            raise Refusal(op, f"scatters along the batch axis (dim {d})")
        f = window_updates[window_operand.index(d)]
    else:
        f = split[2]
        if f not in window_updates:
            raise Refusal(op, "scatters per-example updates to replicated positions")
        d = window_operand[window_updates.index(f)]
    if _shape(op.operands[2])[f] != _shape(op.operands[0])[d]:
        raise Refusal(op, f"writes some rows of the batch axis (dim {d})")
    return Cut((d,), (d, None, f))


_RULES = {
    "stablehlo.broadcast_in_dim": _broadcast, "stablehlo.transpose": _transpose, "stablehlo.reshape": _reshape,
    "stablehlo.reduce": _reduce, "stablehlo.dot_general": _dot_general, "stablehlo.slice": _slice,
    "stablehlo.dynamic_slice": _dynamic_slice, "stablehlo.dynamic_update_slice": _dynamic_update_slice,
    "stablehlo.concatenate": _concatenate, "stablehlo.pad": _pad, "stablehlo.sort": _sort,
    "stablehlo.reduce_window": _reduce_window, "stablehlo.gather": _gather, "stablehlo.scatter": _scatter,
    "chlo.top_k": _top_k,
}


# ---- helpers -----------------------------------------------------------------------------------------
def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _i64s(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _combiner(region: ir.Region) -> str | None:
    """The op of a reduction body ``return op(a, b)`` over its two arguments, if one of `COMBINE`."""
    block = region.blocks[0]
    ops = [o.operation for o in block.operations]
    if len(ops) != 2 or ops[0].name not in COMBINE or len(block.arguments) != 2:
        return None
    if set(ops[0].operands) != set(block.arguments) or list(ops[1].operands) != [ops[0].result]:
        return None
    return ops[0].name


def _identity(init: ir.Value, combine: str) -> bool:
    """Whether `init` is a splat constant that `combine` leaves every value unchanged with."""
    value = splat(init)
    if isinstance(value, ir.FloatAttr):
        return {"stablehlo.add": 0.0, "stablehlo.maximum": -math.inf, "stablehlo.minimum": math.inf}.get(combine) \
            == value.value
    if not isinstance(value, ir.IntegerAttr):
        return False
    t = ir.IntegerType(value.type)
    low, high = (0, 2**t.width - 1) if t.is_unsigned else (-2**(t.width - 1), 2**(t.width - 1) - 1)
    if t.width == 1:
        return (combine == "stablehlo.and") == (value.value != 0) and combine in ("stablehlo.and", "stablehlo.or")
    return {"stablehlo.add": 0, "stablehlo.maximum": low, "stablehlo.minimum": high}.get(combine) == \
        (value.value if t.is_unsigned or value.value <= high else value.value - 2**t.width)


def _runs(main: func.FuncOp, attrs: dict, dim: int) -> int:
    """How many devices a value with these argument attributes is spread over along `dim`."""
    if SDY_SHARDING in attrs:
        return _axes_size(main, attrs[SDY_SHARDING], dim)
    if any(s in attrs for s in SHARDINGS) and "replicated" not in str(attrs[SHARDINGS[1]]):
        raise Refusal(None, f"a batch argument has a GSPMD sharding ({attrs[SHARDINGS[1]]}): micro-batch reads Shardy's")
    return 1


def batch_devices(main: func.FuncOp) -> int:
    """The devices a data-parallel step's batch is spread over (its batch arguments' Shardy shardings of dim 0;
    1 without one, or where `_runs` cannot read it): each holds that share of the activations."""
    attrs, counts = arg_attrs(main), [1]
    for i in batch_arguments(main):
        try:
            counts.append(_runs(main, attrs[i], 0))
        except Refusal:
            pass
    return max(counts)


def _axes_size(main: func.FuncOp, sharding: ir.Attribute, dim: int) -> int:
    """The devices a Shardy sharding spreads `dim` over: the product of its mesh axes' sizes."""
    t = sdy.TensorShardingAttr(sharding)
    axes = [sdy.AxisRefAttr(a) for a in sdy.DimensionShardingAttr(t.dimension_shardings[dim]).axes]
    if any(a.sub_axis_info is not None for a in axes):
        raise Refusal(None, f"the batch is sharded over sub-axes ({sharding}): micro-batch reads whole mesh axes")
    mesh = t.mesh_or_ref
    if isinstance(mesh, ir.FlatSymbolRefAttr):
        module = enclosing_module(main.operation)
        mesh = next(op.attributes["mesh"] for op in module.regions[0].blocks[0].operations
                    if op.name == "sdy.mesh" and ir.StringAttr(op.attributes["sym_name"]).value == mesh.value)
    sizes = {sdy.MeshAxisAttr(a).name: sdy.MeshAxisAttr(a).size for a in sdy.MeshAttr(mesh).axes}
    return math.prod(sizes[a.name] for a in axes)
