"""roll-layers{memory-budget=0.0}: run repeated layers as two device loops over stacked leaves.

A model written as a Python loop over L alike layers traces to L copies of each layer's forward
ops, L copies of its backward ops and L copies of each leaf's optimizer update, and the backward
pass keeps every layer's activations alive until it reaches that layer. This pass finds such a run
(`layer_runs` proposes it from the state leaves' paths, `layer_roles` checks that the ops are the
same at every layer; where the first layer does not line up, the calls to a function jax lowered in two
forms, one where a layer reads the data and one where its input has a gradient, are inlined and the run
tried again: `inline_forms`) and rewrites the step as

* the run's state leaves stacked (``[L, ...]`` per leaf: parameters and optimizer moments), and the
  values from outside the run that differ between layers (a layer-wise rate) stacked too: where each
  layer's is a broadcast, the smaller values broadcast, broadcast again in the loop (`_broadcast_sources`);
* a **forward loop** (``stablehlo.while``, layer l = 0 .. L-1) running one copy of the forward
  ops, carrying the block's input from layer to layer and saving it per layer (``[L, ...]``);
* the ops before, between and after the run as they were (embeddings, head, loss, its backward);
* a **backward loop** (l = L-1 .. 0) that recomputes layer l's forward ops from its saved input
  (activations of one layer live at a time), runs its backward ops, carrying the cotangent from
  layer to layer, and, where the optimizer's update of the layer's leaves needs only that layer's
  gradient (Adam, SGD, schedules; not a global-norm clip), updates them right there, in place in
  the stacked leaves, so no stacked gradient exists; the gradient of a value every layer reads (a
  leaf shared by the blocks), which jax sums over the layers in the backward order, summed in the
  loop's carry, add for add (`Plan._sum_chain`), its update after the loop; a value the ops after
  the loops read at one layer only kept in a carry of its own, not in a row per layer; inside a
  micro-batch loop's body, a gradient the body adds to its slices' sum layer by layer (one carry of
  the micro-batch loop per layer) added to its row of one stacked carry instead, in the backward loop,
  in place (`Plan._accumulated`): the rows and the sums are one buffer;
* the new state leaves sliced out of the stacked ones.

After a micro-batch loop, or after the backward loop where the update needs every layer's gradient (a
global-norm clip), a packed state's update runs once in ``@main``, the same ops at every layer with
nothing passed between layers; it rolls too, as an *update run* (`Plan.of`): one loop over the
layers' rows (the backward loop's form, with no carry) that writes each layer's new rows in place,
where the unrolled update restacks each packed buffer with a concatenate, which XLA:CPU compiles to a
copy of the donated buffer. The shares of such an update that read no gradient (Adam's ``b1 * mu``)
are not the forward loop's to save per layer: they stay where the step computes them
(`Plan._read_outside_only`).

``memory-budget`` chooses what the forward loop saves besides the layer inputs: 0.0 saves nothing
else (the least memory; every forward op runs twice); b in (0, 1) also saves the matrix products the
backward ops read that cost the most work per byte to recompute, until their bytes reach b of all
such products (PyTorch's ``activation_memory_budget`` over jax's ``dots_saveable`` candidates); 1.0
leaves the step as it is. A state given leaf by leaf is stacked inside the call (a copy of the
rolled state in temporaries), so it rolls only where that costs less than the activations rolling
saves, less what the loops hand to the ops after them stacked over every layer (`Plan._not_worth_stacking`,
`Plan._exports_kept`; ``force`` rolls it anyway); a packed state's layers
(``loopfuse.pack(state, layers=True)``) are stacked already and roll in place (where none rolls, the
report says that the stacks then cost a copy per call).

Why it is exact: each op of the loops is one of `layer_roles`'s roles, run at position l on the
operands its classification names, which are the values the original op at layer l read (its
layer's own leaf, a value the same for all layers, another role's value at layer l, or the value
carried from the layer before or after). Recomputing a forward op reads the same operands as the
original, so it computes the same value. A sum in the carry adds the same values in the same order and
operand order as the unrolled adds (its first iteration selects layer L-1's value itself). A slices'
sum added to in the backward loop is the same add on the same operands, in the same operand order, its
row read before the loop writes it; the stacked sums start from the micro-batch loop's starts (stacked,
or +0.0 where every one is +0.0). An update run's layers read nothing another layer computes, so the
loop's order of layers computes each the same. Stacking, broadcasting, selecting, slicing and dynamic
(update) slices only move elements. XLA may compile the loop bodies to other last bits than the unrolled
ops, so the pass is opt-in (``compile_step(..., memory_budget=b)``), its tolerance tested.

The pass reports what it did (and why a run did not roll) with `ModulePass.report`: in the dump
(``roll-layers.txt``) and in ``Executable.reports``.
"""
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cmp_to_key

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from .batch_axis import batch_devices
from .canonicalize import fold_slices
from .cond_to_select import Selects
from .functions import arg_attrs, erase_uncalled, main_func, result_attrs, string_attr
from .matchers import rows, sliced_rows, splat_value
from .dataflow import ARG, Dataflow, tensor_bytes
from .dead_code import pure_callees
from .layer_roles import Carry, Internal, Invariant, PerLayer, Roles, Seed, analyze
from .layer_runs import keyed_runs, runs, sub_partner, tokens, with_partners
from .module_pass import ModulePass, option, reports
from .sink_leaf_ops import sink
from . import rewriter as rw
from . import xla_cpu
from .rewriter import Builder
from .vocabulary import MICRO_BATCH, PACKED, STATE


@dataclass(frozen=True)
class RollLayers(ModulePass):
    """Examples:
        >>> from loopfuse.compile.pass_manager import parse_pipeline
        >>> parse_pipeline("roll-layers{memory-budget=0.5}")
        [RollLayers(memory_budget=0.5, min_layers=2, force=False)]
    """

    name = "roll-layers"
    summary = "Run repeated layers as a forward and a backward loop over stacked leaves, recomputing activations"

    memory_budget: float = option(0.0, "the share of recomputable activation bytes to save (0: the least memory, "
                                       "1: leave the step as it is)", minimum=0.0, maximum=1.0)
    min_layers: int = option(2, "roll runs of at least this many alike layers", minimum=2)
    force: bool = option(False, "roll a state given leaf by leaf also where stacking its layers' leaves inside "
                                "the call costs more temporaries than the activations rolling saves")

    def adds_control_flow(self) -> bool:
        return self.memory_budget < 1.0

    def added_control_flow(self, module_op: ir.Operation) -> bool:
        """Whether a run rolled (an update run too: its loop), as the report says."""
        return any(line.startswith("rolled ") for line in reports(module_op).get(self.name, "").splitlines())

    def apply(self, module_op: ir.Operation) -> None:
        lines: list[str] = []
        if self.memory_budget >= 1.0:
            lines.append("memory budget 1.0: the step is left as it is")
        else:
            main = main_func(module_op)
            # a cond of cheap ops (optax.MultiSteps' update) as selects, which the layers' ops are lined up
            # through (`cond_to_select`); kept only where layers roll
            selected = Selects(main)
            block = layers_block(main)
            micro = block != main.body.blocks[0]      # rolling may rebuild that loop: asked once, here
            # in a micro-batch body, the ops micro-batch moved before its loop back in it: each layer's
            # ops read its leaves (`sink_leaf_ops`)
            sunk = sink(main, block, [v for v, _ in state_leaves(main)])
            rolled, tried = self._roll(module_op, main, lines, update=False, held=selected.held())
            if not tried:
                lines.append("no run of alike layers: no state leaves differ only in one index or key" + (
                    " (layers held stacked and looped over, as lax.scan, nn.scan or nnx.scan do, are a device loop "
                    "already; roll-layers rolls a Python loop over alike layers)" if _loops(block) else ""))
            if sunk is not None and rolled:
                sunk.finish(layers_block(main))
            elif sunk is not None:
                sunk.undo()
            if (micro or rolled) and _sources([v for v, _ in state_leaves(main)]):
                rolled |= self._roll(module_op, main, lines, update=True)[0]   # a packed state's update, after the loops
            if not rolled:
                selected.undo()
                if _stacked_buffers(main):
                    lines.append(NOT_ROLLED_STACKED)
            elif selected:
                lines.append(f"{len(selected)} two-way cond(s) of cheap ops run as selects (cond-to-select)")
        self.report(module_op, "\n".join(lines))

    def _roll(self, module_op: ir.Operation, main: func.FuncOp, lines: list, update: bool,
              held: frozenset = frozenset()) -> tuple[bool, set]:
        """Roll the runs of alike layers in `layers_block` (with `update`: the update runs in ``@main``,
        `Plan.of`), saying what rolled and what did not in `lines`: (whether any rolled, the leaf paths
        of the runs tried). Where the first run tried leaves its first layer out or does not roll, the
        calls to a function's forms are inlined (`inline_forms`; not the calls in `held`, which an undo
        puts back) and the run is tried again, once."""
        rolled = False
        tried: set = set()       # the leaf paths of the runs tried so far
        pure: frozenset | None = pure_callees(module_op)   # alike ops merged: until the first rewrite
        g = None                 # the block's Dataflow, read again after each rewrite
        indexed = False          # an index in the paths proposed a run: no run by keys is tried then
        inlined = update         # the forms of a function inlined (an update run has no such calls)
        block = main.body.blocks[0] if update else layers_block(main)
        what = UPDATE_RUN if update else ""
        while True:
            found = state_leaves(main)
            candidates, by_index = self._candidates(found, tried, keyed=not indexed)
            indexed |= by_index
            if not candidates:
                break
            g = g or Dataflow.of(block, pure, outside=[v for v, _ in found] + _sources([v for v, _ in found]))
            leaves = [(g.id_of[v], path) for v, path in found]
            if not by_index:     # runs by keys, in the order the step first reads their layers
                candidates, _ = self._candidates(found, tried, _first_use(g, leaves))
                if not candidates:       # the superset had some: none is left once ordered
                    break
            whole = candidates[0][0]
            run, plan, names, analyzed = self._plan_joined(g, main, candidates, leaves, update, by_index)
            if not inlined and (plan.why_not or run.start > analyzed.start):
                inlined = True
                if forms := inline_forms(block, held):
                    erase_uncalled(module_op, forms)
                    g, pure = None, pure_callees(module_op)
                    continue
            tried |= names
            where = f"{what}{', '.join(sorted(run.families))} [{run.start}:{run.stop}]"
            if plan.why_not:
                lines.append(f"did not roll {where}: {plan.why_not}")
                continue
            left = [l for l in range(whole.start, whole.stop) if not run.start <= l < run.stop]
            lines.append(f"rolled {where}: {plan.describe()}"     # before the rewrite erases ops it reads
                         + (f"; {_layers(left)} left as {'it is: its' if len(left) == 1 else 'they are: their'} "
                            "ops differ from the others'" if left else ""))
            g.merge()
            written = _rewrite(g, plan)
            rolled = True
            fold_slices(main.operation)
            if written is not None:
                write_in_place(main.body.blocks[0], written)
            g, pure = None, None
            if not update:
                block = layers_block(main)     # its loop may be a new one (`_Rewrite.accumulate_in_place`)
        return rolled, tried

    def _plan_joined(self, g: Dataflow, main: func.FuncOp, candidates: list, leaves: list, update: bool,
                     by_index: bool):
        """(part, plan, leaf paths, the run analyzed) of the first candidate run, joined by the candidates
        the step reads layer by layer with it (`with_partners`: one layer's modules held apart) where an
        index proposed it, or its part over the layers of a candidate that mirrors part of it, joined by
        that one (`sub_partner`: the moments an optimizer keeps for the layers it trains, the first ones
        frozen, or for each layer's adapters), or alone where they do not roll together (`_plan`)."""
        whole, names = candidates[0]
        if by_index and len(candidates) > 1:
            others = [r for r, _ in candidates[1:]]
            for joined in (with_partners(whole, others, _first_use(g, leaves)), sub_partner(whole, others)):
                if joined is not whole:
                    run, plan = self._plan(g, main, joined, leaves, update)
                    if not plan.why_not:
                        return run, plan, _leaf_paths(joined, [path for _, path in leaves]), joined
        return (*self._plan(g, main, whole, leaves, update), names, whole)

    def _plan(self, g: Dataflow, main: func.FuncOp, run, leaves: list, update: bool):
        """(part, plan) for the part of `run` that rolls best: the whole run; or the run less layers at
        either end whose ops differ from the others' (a stem, a head block), tried by the number of
        layers left out, fewest first, until a part rolls with every op or leaving out more layers
        finds no more alike ops; or, first, the parts on either side of a layer the whole run's
        analysis points at (`Roles.odd`: an op only that layer has), or of the layer before it (an op
        at a layer's boundary, on the output of a block without a residual, is as much the next
        layer's first), and so on for each of those parts' analyses (a stem, and an odd layer in the
        middle). A part that rolls with every op ends the search; the part that rolls the most ops
        (`_score`: none at a dead first position) wins, so a part too short to beat the best found so
        far is not analyzed (`hopeless`), nor are the parts beside the layers it would point at, which
        are shorter still."""
        paths = dict(leaves)
        written = written_leaves(g, main) if g.block == main.body.blocks[0] else {}    # the update is in @main
        layout = analyze(g, run, [v for v, _ in leaves])
        shards = batch_devices(main)
        done: dict = {}

        def attempt(first: int, last: int):
            if (first, last) not in done:
                roles = layout.roles(g, first, last)
                plan = Plan.of(g, roles, self.memory_budget, paths, written, self.force, update, shards)
                done[first, last] = (run.trimmed(first, last), plan, roles.alike, not plan.why_not and _all_alike(plan))
            return done[first, last]

        def best():
            rolled = [(part, plan) for part, plan, _, _ in done.values() if not plan.why_not]
            return max(rolled, key=lambda t: _score(t[1])) if rolled else None

        def hopeless(first: int, last: int) -> bool:
            """The part cannot beat the best plan found: a role is one of the placed chains and a plan only
            drops roles, so a part of n layers rolls at most n times as many ops as there are chains."""
            found = best()
            return found is not None and (run.length - first - last) * len(layout.placed) < _score(found[1])[0]

        whole = attempt(0, 0)
        if whole[3]:
            return whole[:2]
        todo = [(0, 0)]
        while todo:           # beside the layers a part's analysis points at, and beside those its parts' point at
            first, last = todo.pop(0)
            odd, n = done[first, last][1].roles.odd, run.length - first - last
            for p in [p for p, k in odd.items() if 2 * k >= max(odd.values())]:
                for part in ((first, last + n - p), (first + p + 1, last), (first, last + n - p + 1), (first + p, last)):
                    if run.length - sum(part) >= self.min_layers and part not in done and not hopeless(*part) \
                            and not attempt(*part)[3]:
                        todo.append(part)
        most = whole[2]
        for total in range(1, run.length - self.min_layers + 1):
            if hopeless(0, total):     # and so is every part with as many layers left out, or more
                break
            found = [attempt(first, total - first) for first in range(total + 1)]
            if any(t[3] for t in found) or max(t[2] for t in found) <= most:
                break
            most = max(most, *(t[2] for t in found))
        return best() or (whole[0], _declined(whole[1], [t[:2] for t in done.values() if t is not whole]))

    def _candidates(self, found: list, tried: set, first_use: list | None = None,
                    keyed: bool = True) -> tuple[list, bool]:
        """(the runs of the state leaves `found` ((value, path)) not tried yet, with their leaves' paths;
        whether an index in the paths proposes any run, tried or not): those an index proposes
        (`layer_runs.runs`), or, where none does and `keyed`, the layers held under keys that say nothing
        of their order, in the order the step first reads them (`keyed_runs`; `first_use[leaf]`: the
        first op that reads it, or None; without it, as if every leaf were read first at once: a superset
        of the runs, in no order, which tells whether any is left to try before the dataflow that orders
        them is built)."""
        paths, types = [p for _, p in found], [str(v.type) for v, _ in found]

        def untried(runs_: list) -> list:
            return [(run, names) for run in runs_ if not (names := _leaf_paths(run, paths)) & tried]
        by_index = runs(paths, types, self.min_layers)
        if by_index or not keyed:
            return untried(by_index), bool(by_index)
        return untried(keyed_runs(paths, types, [0] * len(paths) if first_use is None else first_use,
                                  self.min_layers)), False


def inline_forms(block: ir.Block, held: frozenset = frozenset()) -> set[str]:
    """Inline the calls in `block` to a function jax lowered in more than one form (their callees): ``_var``
    where a layer reads the data, ``_var_0`` (with more results: the residuals the derivative reads) where
    the layer's input has a gradient, one ``jnp.var`` (equinox's LayerNorm) whose two callees make the first
    layer's call unlike the others'. Inlined, the ops both forms compute line up, and those only the
    derivative needs have no op at the first layer (a dead first position: `layer_roles`); not the calls
    `held` (by `Selects`, to put back). jax names a function's forms ``f``, ``f_0``, ``f_1`` ..; two
    functions that only look so are inlined too, which changes no value (XLA inlines every call)."""
    calls = [view for view in block.operations if isinstance(view, func.CallOp) and view.operation not in held]
    forms: dict = defaultdict(set)
    for call in calls:
        forms[_form_key(call)].add(call.callee.value)
    inlined = [call for call in calls if len(forms[_form_key(call)]) > 1]
    names = {call.callee.value for call in inlined}
    for call in inlined:
        rw.inline(call.operation)
    return names


def _form_key(call: func.CallOp) -> tuple:
    """What the forms of one function share: the callee's name less jax's suffix for another form of it
    (``_var_0`` -> ``_var``) and the types of the arguments (its derivative, ``silu_1`` beside ``silu_0``,
    reads others)."""
    base, _, suffix = call.callee.value.rpartition("_")
    return base if base and suffix.isdigit() else call.callee.value, tuple(str(v.type) for v in call.operands)


def _loops(block: ir.Block) -> bool:
    """Whether `block` (the step's) runs a ``stablehlo.while`` of its own (the step loops over something)."""
    return any(isinstance(op, stablehlo.WhileOp) for op in block.operations)


def _first_use(g: Dataflow, leaves: list) -> list:
    """Per state leaf ((value id, path)), the first op that reads it, or None."""
    return [min((op for op, _ in g.users[v]), default=None) for v, _ in leaves]


def _leaf_paths(run, paths: list) -> set:
    """The paths of `run`'s leaves (`paths[leaf]`)."""
    return {paths[leaf] for per in run.families.values() for layer in per for leaf in layer.values()}


def _declined(whole: "Plan", parts: list) -> "Plan":
    """The whole run's `whole` plan; where its ops differ between layers, its reason also naming the parts
    ((part, plan)) whose ops are all alike but that did not roll for another reason (their cost), which the
    whole run's reason does not say."""
    if _all_alike(whole):
        return whole
    alike = [f"layers {part.start}-{part.stop - 1} are alike but did not roll: {plan.why_not}"
             for part, plan in parts if plan.why_not and _all_alike(plan)]
    return replace(whole, why_not="; ".join([whole.why_not, *alike])) if alike else whole


def _all_alike(plan: "Plan") -> bool:
    """Every op of the plan's layers has its like at every layer."""
    return bool(plan.roles.ops) and not plan.roles.dropped


def layers_block(main: func.FuncOp) -> ir.Block:
    """The block that holds the layers' ops: ``@main``'s, or the body of its micro-batch loop (one
    slice's loss and gradient, `micro_batch`), which reads the state leaves from ``@main``; there the
    gradients go to the slices' sums (added to in the backward loop where it can: `Plan._accumulated`),
    and the update runs after the micro-batch loop."""
    entry = main.body.blocks[0]
    for op in entry.operations:
        if isinstance(op, stablehlo.WhileOp) and MICRO_BATCH in op.operation.attributes:
            return op.operation.regions[1].blocks[0]
    return entry


NOT_ROLLED_STACKED = ("the state holds layers stacked (loopfuse.pack(state, layers=True)) and none rolled: each call "
                      "takes the stacks apart and builds them again, a copy of each in temporaries; pass the state "
                      "as a pytree, or packed without layers=True")


def _stacked_buffers(main: func.FuncOp) -> bool:
    """Whether a packed buffer of the state holds one leaf of alike layers, layer after layer (`pack`'s
    ``layers=True``): its leaves' paths differ in one key only, the layer's (an index, or a name followed
    by the leaf's own keys)."""
    for attrs in arg_attrs(main):
        if PACKED in attrs:
            keys = [tokens(ir.StringAttr(p).value) for p in ir.ArrayAttr(attrs[PACKED])]
            if len(keys) < 2 or len({len(k) for k in keys}) != 1:
                continue
            differ = [i for i in range(len(keys[0])) if len({k[i] for k in keys}) > 1]
            if len(differ) == 1 and (differ[0] < len(keys[0]) - 1 or all(re.fullmatch(r"\[\d+\]", k[-1]) for k in keys)):
                return True
    return False


def state_leaves(main: func.FuncOp) -> list[tuple[ir.Value, str]]:
    """(value, key path) of each state leaf as the step reads it: a state argument, or the piece of
    a packed buffer (an argument tagged ``loopfuse.packed``) that holds the leaf (its slice, reshaped)."""
    args = main.body.blocks[0].arguments
    out = []
    for a, attrs in enumerate(arg_attrs(main)):
        path = string_attr(attrs, STATE)
        if path is None:
            continue
        if PACKED not in attrs:
            out.append((args[a], path))
            continue
        held = [ir.StringAttr(p).value for p in ir.ArrayAttr(attrs[PACKED])]
        users = [use.owner.operation for use in args[a].uses]
        if len(held) == 1 and not any(rows(op) for op in users):
            out.append((args[a], held[0]))        # a leaf a packed state keeps as it is
            continue
        pieces = sorted(((bounds, op) for op in users if (bounds := rows(op)) is not None), key=cmp_to_key(_by_bounds))
        if len(pieces) != len(held) or [lo for (lo, _), _ in pieces] != [0, *[hi for (_, hi), _ in pieces[:-1]]]:
            continue         # not sliced leaf by leaf: no leaf to name
        for (_, op), path in zip(pieces, held):
            v = op.result
            uses = list(v.uses)
            if len(uses) == 1 and uses[0].owner.name == "stablehlo.reshape":
                v = uses[0].owner.result
            out.append((v, path))
    return out


def write_in_place(block: ir.Block, loop: ir.Operation) -> None:
    """Each 1-D concatenate in `block` (or tree of them) of rows of a result of `loop` (the stacked
    leaves' new values), each in its place, and values for the other elements (a packed buffer's new
    value: the rolled layers' rows and the new rows of layers left out of the run) -> those values
    written over the loop's result, in place, inside one loop of their own, before the last such
    concatenate (`xla_cpu`, 5). Exact: a concatenate puts each operand's elements at its offset, and
    the loop's rows are at theirs already."""
    found = [(op, *match) for op in [o.operation for o in block.operations]
             if (match := _rows_in_place(op, loop)) is not None]
    if not found:
        return
    last = found[-1][0]
    found = [f for f in found if all(u.owner.operation == last or u.owner.operation.parent == last.parent
                                     and last.is_before_in_block(u.owner.operation) for u in f[0].result.uses)]
    with ir.InsertionPoint(last), last.location:
        new = xla_cpu.write_pieces(loop, [rw.flat(x) for _, x, _ in found], [pieces for _, _, pieces in found])
    for (op, _, _), value in zip(found, new):
        op.result.replace_all_uses_with(value)
        _erase_unused(op)


def _rows_in_place(op: ir.Operation, loop: ir.Operation) -> tuple[ir.Value, list] | None:
    """(x, pieces) where `op` is a 1-D concatenate, or a tree of them (`_joined`), of x's size, x a
    result of `loop`, whose operands are rows of x at their own offset in x and `pieces`
    ((offset, operand) of the others); else None."""
    if op.name != "stablehlo.concatenate" or ir.RankedTensorType(op.result.type).rank != 1:
        return None
    total = ir.RankedTensorType(op.result.type).shape[0]
    x, pieces, offset = None, [], 0
    for v in _joined(op):
        y, first, _ = sliced_rows(v) or (None, 0, 0)
        shape = [] if y is None else ir.RankedTensorType(y.type).shape
        if isinstance(y, ir.OpResult) and y.owner.operation == loop and (x is None or x == y) \
                and math.prod(shape) == total and first * math.prod(shape[1:]) == offset:
            x = y
        else:
            pieces.append((offset, v))
        offset += ir.RankedTensorType(v.type).shape[0]
    return None if x is None else (x, pieces)


def _joined(op: ir.Operation) -> list[ir.Value]:
    """The operands of concatenate `op`, those that are 1-D concatenates of no other use (a tree of
    them: `_concat`) replaced by their own, recursively."""
    out = []
    for v in op.operands:
        inner = v.owner.operation if isinstance(v, ir.OpResult) else None
        if inner is not None and inner.name == "stablehlo.concatenate" and len(list(v.uses)) == 1:
            out += _joined(inner)
        else:
            out.append(v)
    return out


def _erase_unused(op: ir.Operation) -> None:
    """Erase `op` (its results unused), then the slices, reshapes and concatenates it read that are
    left unused."""
    operands = list(op.operands)
    op.erase()
    for v in operands:
        if isinstance(v, ir.OpResult) and not list(v.uses) and v.owner.name in (
                "stablehlo.slice", "stablehlo.reshape", "stablehlo.concatenate"):
            _erase_unused(v.owner.operation)


def _in_order(x: ir.Operation, y: ir.Operation) -> int:
    """Order of two ops of one block: program order."""
    return -1 if x.is_before_in_block(y) else 1


def _by_bounds(x: tuple, y: tuple) -> int:
    """Order of two (bounds, slice op) pieces: by bounds, equal ones in program order."""
    if x[0] != y[0]:
        return -1 if x[0] < y[0] else 1
    return _in_order(x[1], y[1])


def written_leaves(g: Dataflow, main: func.FuncOp) -> dict[tuple[int, int], str]:
    """(op id, operand index) -> the key path of the state leaf that operand becomes: a result of
    ``@main``, or a piece (reshaped) of a packed result (the concatenate that builds the buffer)."""
    ret = len(g.ops) - 1
    held = {string_attr(a, STATE): [ir.StringAttr(p).value for p in ir.ArrayAttr(a[PACKED])]
            for a in arg_attrs(main) if PACKED in a}
    out = {}
    for k, attrs in enumerate(result_attrs(main)):
        path = string_attr(attrs, STATE)
        if path is None:
            continue
        if path not in held:
            out[ret, k] = path
            continue
        pieces = _pieces(g, g.operands[ret][k])
        if len(pieces) != len(held[path]):
            continue
        for (concat, j), leaf in zip(pieces, held[path]):
            out[concat, j] = leaf
            p = g.owner[g.operands[concat][j]]
            if p != ARG and g.ops[p].name == "stablehlo.reshape":     # the leaf, flattened (may be a role too)
                out[p, 0] = leaf
    return out


def _pieces(g: Dataflow, v: int) -> list[tuple[int, int]]:
    """(concatenate op id, operand index) of each piece of value `v` built by a concatenate, in
    order, through a tree of concatenates (`_concat`: how ``jnp.concatenate`` builds a packed
    buffer of more than 16 leaves); [] if `v` is not built by one."""
    op = g.owner[v]
    if op == ARG or g.ops[op].name != "stablehlo.concatenate":
        return []
    out = []
    for j, u in enumerate(g.operands[op]):
        inner = _pieces(g, u) if len(g.users[u]) == 1 else []
        out += inner or [(op, j)]
    return out


# ---- the plan ----------------------------------------------------------------------------------
UPDATE_RUN = "the update of "  # how the report names an update run: "rolled the update of <leaves> [a:b]: ..."
UPDATE_AFTER = "the optimizer update runs after the backward loop"   # how it says a rolled run's update runs after it


def update_after_loops(report: str) -> bool:
    """Whether roll-layers' `report` says a rolled run's update runs after its loops (every layer's gradient
    kept until then: the loops may then keep more than the unrolled step does)."""
    return UPDATE_AFTER in report


def rolled_layers(report: str) -> bool:
    """Whether roll-layers' `report` says a run of layers rolled (an update run alone does not count)."""
    return any(line.startswith("rolled ") and not line.startswith("rolled " + UPDATE_RUN) for line in report.splitlines())


PRE, MID, POST = 0, 1, 2       # ops outside the run: before the forward loop, between the loops, after both
MATRIX_PRODUCTS = ("stablehlo.dot_general", "stablehlo.convolution")     # what a budget above 0 may save


@dataclass
class Plan:
    """How the valid roles of one run become two loops, or an update run's one (see the module docstring)."""

    g: Dataflow
    roles: Roles
    budget: float
    why_not: str = ""
    backward: set = field(default_factory=set)      # roles that read the next layer's values: the backward loop's
    forward: list = field(default_factory=list)     # forward roles the forward loop runs, in program order
    recompute: list = field(default_factory=list)   # forward roles the backward loop runs again, in program order
    saved: list = field(default_factory=list)       # (role, result) of forward roles the forward loop saves per layer
    carries: list = field(default_factory=list)     # forward carries (role, result, init value id)
    bcarries: list = field(default_factory=list)    # backward carries (role, result, init value id)
    exports: dict = field(default_factory=dict)     # (role, result) -> layers whose value ops outside the run read
    state: dict = field(default_factory=dict)       # (role, result) of a backward role -> seed it writes in place
    sums: dict = field(default_factory=dict)        # (role, result) of a backward role -> the adds summing it (`_sum_chain`)
    accumulated: dict = field(default_factory=dict)  # (role, result) of a backward role -> [(add op id, operand index
                                                     # of the slices' sum)] by layer (`_accumulated`)
    outside: dict = field(default_factory=dict)     # op id -> PRE | MID | POST
    update: bool = False      # an update run: one loop, no carry, writing the stacked leaves (`Plan.of`)
    shards: int = 1           # the devices the batch is spread over, each holding that share of the activations

    @classmethod
    def of(cls, g: Dataflow, roles: Roles, budget: float, leaf_paths: dict, written: dict,
           force: bool, update: bool, shards: int = 1) -> "Plan":
        """The plan, dropping roles the loops cannot hold (a forward op reading a value computed after
        the forward loop, a backward op reading one computed after the backward loop: the update after a
        global-norm clip, which then runs after the loop as it did) until none is left to drop, and the
        roles left as the step has them (`_read_outside_only`).

        With `update`, the plan of an *update run*: the optimizer's update of a packed state's layers that
        runs after a micro-batch loop (which sums the slices' gradients) or after the backward loop, the
        same ops at every layer with nothing passed from layer to layer. The roles that compute the stacked
        leaves' new rows become one loop (the backward loop's form, every role in it, no forward loop) that
        writes the rows in place, where the unrolled update restacks each packed buffer with a concatenate,
        which XLA:CPU compiles to a copy of the donated buffer."""
        if update:
            return cls._update_plan(g, roles, budget, leaf_paths, written)
        plan = cls(g, roles, budget, shards=shards)
        while True:
            if not roles.ops:
                plan.why_not = "no op is the same at every layer" + (
                    f" ({roles.dropped[0]}" + (f", and {len(roles.dropped) - 1} more" if len(roles.dropped) > 1 else "")
                    + ")" if roles.dropped else "")
                return plan
            plan._classify()
            bad = plan._misplaced()
            if bad:
                roles.drop(g, bad, "it reads a value computed after its loop")
            elif plan.backward and (unneeded := plan._read_outside_only()):
                roles.prune(unneeded)
            else:
                break
        plan._place_outside()
        if not plan.backward:
            plan.why_not = "no backward op is the same at every layer" + (
                f" ({roles.dropped[0]}" + (f", and {len(roles.dropped) - 1} more" if len(roles.dropped) > 1 else "")
                + ")" if roles.dropped else ": nothing is differentiated through the layers")
            return plan
        plan._carries_and_exports(leaf_paths, written)
        if not plan.carries:
            plan.why_not = ("no value passes from one layer to the next through ops alike at every layer: "
                            "the layers are not a chain, rolling them saves no activation")
            return plan
        plan._loops()
        plan.why_not = "" if force else plan._not_worth_stacking()
        return plan

    @classmethod
    def _update_plan(cls, g: Dataflow, roles: Roles, budget: float, leaf_paths: dict, written: dict) -> "Plan":
        """`of`'s plan of an update run: the roles that compute the stacked leaves' new rows (`_update_roles`;
        the others, such as each layer's share of a global norm, run as they are), where the leaves are
        packed (`force` does not apply: a leaf given on its own is written in place already)."""
        while True:
            plan = cls(g, roles, budget, update=True)
            if not roles.ops:
                plan.why_not = "no op of the update is the same at every layer" + (
                    f" ({roles.dropped[0]})" if roles.dropped else "")
                return plan
            plan._classify()
            plan._place_outside()
            plan._carries_and_exports(leaf_paths, written)
            if not plan.state:
                plan.why_not = "no stacked leaf's new value is computed alike at every layer"
                return plan
            unneeded = set(range(len(roles.ops))) - plan._update_roles()
            if unneeded:
                roles.prune(unneeded)
                continue
            bad = plan._misplaced()
            if not bad:
                break
            roles.drop(g, bad, "it reads a value another layer computes, or one computed after the update")
        if any(_packed_buffer(g, roles.seeds[s]) is None for s in set(plan.state.values())):
            plan.why_not = "its leaves are given leaf by leaf, and the update writes each in place as it is"
        else:
            plan.why_not = plan._not_worth_stacking()
        return plan

    def _update_roles(self) -> set:
        """The roles that compute a stacked leaf's new rows (`state`), and those they read (at their layer, or
        carried from another: `_misplaced` then drops the reader)."""
        needs = self.roles.reads()
        out, todo = set(), [r for r, _ in self.state]
        while todo:
            r = todo.pop()
            if r not in out:
                out.add(r)
                todo += needs[r]
        return out

    def _not_worth_stacking(self) -> str:
        """Why stacking the leaves inside the call would cost more than rolling saves ("" if it would
        not): the stack is a copy of the rolled state in temporaries, where the unrolled program keeps
        the activations the backward ops read, about L - 1 layers of them more than the rolled one
        (which keeps each layer's carried input and saved values). A packed buffer is stacked already;
        the rows it holds of layers left out of the run, where the loops write it in place, are read
        into buffers of their own (`_Rewrite.read_left_out`), a copy of those layers' state. An update run
        saves no activations but the copies XLA:CPU makes of the packed buffers the unrolled update
        restacks (`_update_saves`), and rolls only where that is strictly more than what it stacks. Data-parallel,
        each device holds its share of the activations (`shards`) and a whole stack of the replicated state."""
        g, roles = self.g, self.roles
        n = roles.length
        saves = self._update_saves() if self.update else self._activations_saved() // self.shards
        seeds = {c.leaf for classes in roles.operands for c in classes if isinstance(c, Seed)}
        leaves = sum(n * g.nbytes(roles.seeds[s][0]) for s in seeds if _packed_buffer(g, roles.seeds[s]) is None)
        stack = leaves + sum(n * g.nbytes(_broadcast_sources(g, c.values)[0][0]) for c in _per_layer(roles)
                             if _stack_rows(g, c.values) is None)
        left_out = sum(g.nbytes(roles.seeds[s][0]) * (_rows(g, found[0], roles.seeds[s]) - n)
                       for s in set(self.state.values()) if (found := _packed_buffer(g, roles.seeds[s])))
        cost = stack + left_out
        if cost == 0 or (cost < saves if self.update else cost <= saves):     # an update run: no tie
            return ""
        than = f", more than the ~{_kib(max(saves, 0))} of {'copies' if self.update else 'activations'} rolling saves"
        if not stack:
            return f"reading the packed rows of the layers left out of the run would cost {_kib(left_out)} of temporaries{than}"
        if not leaves:       # the leaves are rows of packed buffers already: no layout helps
            return f"stacking the values that differ by layer inside each call would cost {_kib(stack + left_out)} of temporaries{than}"
        hint = ("the packed state holds them in another order than the step reads them (loopfuse.pack stacks "
                "layers held under names in their keys' order)" if any(_out_of_order(g, roles.seeds[s]) for s in seeds)
                else "loopfuse.pack(state, layers=True) keeps them stacked between calls")
        return f"stacking the layers' leaves inside each call would cost {_kib(stack + left_out)} of temporaries{than}; {hint}"

    def _activations_saved(self) -> int:
        """About how many bytes of activations the loops keep fewer than the unrolled program."""
        g, roles = self.g, self.roles
        n = roles.length
        activations: set = set()        # forward roles computed from the layer's input (not only its leaves)
        for r in sorted(set(range(len(roles.ops))) - self.backward, key=roles.order):
            if any(isinstance(c, Carry) or isinstance(c, Internal) and c.role in activations for c in roles.operands[r]):
                activations.add(r)
        reads = {(c.role, c.result) for b in self.backward for c in roles.operands[b]
                 if isinstance(c, Internal) and c.role in activations}
        per_layer = sum(g.nbytes(roles.value(g, r, j)) for r, j in reads)
        kept = sum(g.nbytes(roles.value(g, r, j)) for r, j in {*((r, j) for r, j, _ in self.carries), *self.saved})
        return (n - 1) * per_layer - n * kept - self._exports_kept(reads)

    def _exports_kept(self, reads: set) -> int:
        """About how many bytes more than the unrolled program the loops keep of the values ops outside the run
        read: each is stacked over every layer, the forward loop's rows until the ops after it read them, the
        backward loop's from its end (a value read at one layer only is kept alone, `_Rewrite.backward_loop`).
        The unrolled program keeps a forward value from its op to its readers at the layers they read it (at
        every layer where a backward role reads it too, which the activations saved count as not kept), and
        a backward value until its readers run: at once, one layer after another, where they read no other
        layer's backward values (the weight gradients of layers that only some layers compute), or until
        every layer's is there (a global norm's clip)."""
        g, roles, n = self.g, self.roles, self.roles.length
        total = 0
        for r, j in self.forward_rows():
            if (r, j) not in self.saved:
                total += g.nbytes(roles.value(g, r, j)) * (n if (r, j) in reads else n - len(self.exports[r, j]))
        memo: dict = {}
        for (r, j), rows in self.backward_rows().items():
            if len(rows) < 2 or (r, j) in self.accumulated:     # one layer's value is kept alone
                continue
            waiting = sum(1 for l in rows if any(not self._backward_layers(u, memo) <= {l}
                                                 for u, _ in g.users[roles.value(g, r, j, l)] if u not in roles.role_of))
            total += (n - waiting - (waiting < len(rows))) * g.nbytes(roles.value(g, r, j))
        return total

    def forward_rows(self) -> list:
        """The forward roles' values ops outside the run read, which the forward loop saves per layer: all but
        a carry read at the last layer only (the loop's result)."""
        carried = {(r, j) for r, j, _ in self.carries}
        return [key for key, layers in self.exports.items()
                if key[0] not in self.backward and not (key in carried and layers == {self.roles.length - 1})]

    def backward_rows(self) -> dict:
        """The backward roles' values ops outside the run read, by the layers read, but a stacked leaf's new rows
        and a sum over the layers: the backward loop writes the values of more than one layer per layer, and
        keeps one layer's alone (a carry's value at layer 0 is its final one)."""
        carried = {(r, j) for r, j, _ in self.bcarries}
        return {key: layers - {0} if key in carried else layers for key, layers in self.exports.items()
                if key[0] in self.backward and key not in self.state and key not in self.sums}

    def _backward_layers(self, op: int, memo: dict) -> frozenset:
        """The layers whose backward roles' values op `op`, outside the run, reads, directly or through other ops
        outside it (memoized in `memo`)."""
        g, role_of = self.g, self.roles.role_of
        todo = [op]
        while todo:
            m = todo[-1]
            if m in memo:
                todo.pop()
                continue
            found, pending = set(), []
            for v in g.operands[m]:
                p = g.owner[v]
                if p == ARG:
                    continue
                if p in role_of:
                    if role_of[p][0] in self.backward:
                        found.add(role_of[p][1])
                elif p in memo:
                    found |= memo[p]
                else:
                    pending.append(p)
            if pending:
                todo += pending
            else:
                memo[m] = frozenset(found)
                todo.pop()
        return memo[op]

    def _update_saves(self) -> int:
        """The bytes of the packed buffers an update run writes in place: XLA:CPU copies each one the
        unrolled update restacks (`write_in_place`)."""
        buffers = {found[0] for s in self.state.values() if (found := _packed_buffer(self.g, self.roles.seeds[s]))}
        return sum(self.g.nbytes(b) for b in buffers)

    def _classify(self) -> None:
        g, roles = self.g, self.roles
        backward = set(range(len(roles.ops))) if self.update else set()    # an update run: one loop
        changed = True
        while changed:
            changed = False
            for r, classes in enumerate(roles.operands):
                if r not in backward and any(isinstance(c, Carry) and (c.backward or c.role in backward)
                                             or isinstance(c, Internal) and c.role in backward for c in classes):
                    backward.add(r)
                    changed = True
        self.backward = backward
        self.outside = {}       # placed as `_misplaced` asks, every op by `_place_outside` once no role is dropped

    def _read_outside_only(self) -> set:
        """Forward roles that read no carried value, directly or through another role (their layer's leaves
        and values the same at every layer alone), whose values only ops outside the run read, directly or
        through other such roles: the shares of an update left after the loops that read no gradient
        (Adam's ``b1 * mu``, a weight decay's ``wd * p``, where a global-norm clip keeps the update after the
        backward loop). In the forward loop they would be saved per layer, a stacked copy of each live
        through both loops; left as they are, outside the run, they are the ops jax.jit compiles, which XLA
        fuses into the update that reads them."""
        roles = self.roles
        reads = roles.reads()
        tainted = {r for r, classes in enumerate(roles.operands) if any(isinstance(c, Carry) for c in classes)}
        grown = True
        while grown:
            grown = False
            for r, found in enumerate(reads):
                if r not in tainted and found & tainted:
                    tainted.add(r)
                    grown = True
        readers: dict = {r: set() for r in range(len(roles.ops))}
        for q, found in enumerate(reads):
            for r in found:
                readers[r].add(q)
        only = set(range(len(roles.ops))) - tainted
        while bad := {r for r in only if not readers[r] <= only}:
            only -= bad
        return only

    def _where(self, n: int) -> int:
        """Where op `n`, outside the run, runs (PRE, MID, POST): after every role and outside op whose
        value it reads (memoized in `outside`; its operands' ops placed first, as far as it takes)."""
        g, role_of, outside = self.g, self.roles.role_of, self.outside
        todo = [n]
        while todo:
            m = todo[-1]
            if m in outside:
                todo.pop()
                continue
            top, where = len(todo), PRE
            for v in g.operands[m]:
                p = g.owner[v]
                if p == ARG:
                    continue
                placed = role_of.get(p)
                at = (POST if placed[0] in self.backward else MID) if placed is not None else outside.get(p)
                if at is None:
                    todo.append(p)
                elif at > where:
                    where = at
                    if where == POST:      # the latest: the other operands cannot move it
                        break
            if where == POST or len(todo) == top:
                outside[m] = where
                del todo[top - 1:]
        return outside[n]

    def _place_outside(self) -> None:
        """Place every op outside the run (`outside`: what the rewrite moves), once no role is dropped."""
        for n in range(len(self.g.ops)):      # program order: each op's operands' ops are placed before it
            if n not in self.roles.role_of:
                self._where(n)

    def _misplaced(self) -> set:
        """Roles that read a value not ready when their loop runs: an outside value computed after
        it, or a value carried from another layer by a role of the other loop (in the backward loop,
        layer L-1 down to 0, a backward op's value of the layer below; a forward op's of the layer above)."""
        bad = set()
        for r, classes in enumerate(self.roles.operands):
            for c in classes:
                latest = MID if isinstance(c, PerLayer) or r not in self.backward else POST   # stacked before both loops
                values = [c.value] if isinstance(c, Invariant) else [c.init] if isinstance(c, Carry) else \
                    c.values if isinstance(c, PerLayer) else []
                if any(self.g.owner[v] != ARG and self._where(self.g.owner[v]) >= latest for v in values):
                    bad.add(r)
                if isinstance(c, Carry) and (self.update or c.backward != (c.role in self.backward)):
                    bad.add(r)           # a carry runs in its own loop; an update run carries nothing
            if self.update and None in self.roles.ops[r]:
                bad.add(r)
        return bad

    def _carries_and_exports(self, leaf_paths: dict, written: dict) -> None:
        """The carries; the role values read outside the run; of those, the new value of a layer's own
        leaf at every layer (`written`: (op, operand) -> leaf path), which the loop writes in place."""
        g, roles = self.g, self.roles
        carries: dict = {}
        for classes in roles.operands:
            for c in classes:
                if isinstance(c, Carry):
                    carries.setdefault((c.role, c.result, c.init, c.backward), None)
        self.carries = [(r, j, v) for r, j, v, back in carries if not back]
        self.bcarries = [(r, j, v) for r, j, v, back in carries if back]
        seed_of_path = {leaf_paths[v]: (s, l) for s, per in enumerate(roles.seeds) for l, v in enumerate(per)}
        state: dict = defaultdict(set)
        for r, ops in enumerate(roles.ops):
            for l, o in enumerate(ops):
                if o is None:          # a dead first position: no value to export
                    continue
                for j, v in enumerate(g.results[o]):
                    for user, k in g.users[v]:
                        if user in roles.role_of:
                            continue
                        self.exports.setdefault((r, j), set()).add(l)
                        if (user, k) in written and r in self.backward:
                            seed = seed_of_path.get(written[user, k])
                            state[r, j].add((l, seed[0] if seed and seed[1] == l else None))
        for key, found in state.items():   # a backward role writing one stacked leaf, layer for layer
            seeds = {s for _, s in found}
            if len(seeds) == 1 and None not in seeds and {l for l, _ in found} == set(range(roles.length)):
                self.state[key] = seeds.pop()
        self.sums = {key: chain for key in self.exports if key[0] in self.backward and key not in self.state
                     and (chain := self._sum_chain(*key)) is not None}
        self.accumulated = {key: adds for key in self.exports if key[0] in self.backward and key not in self.state
                            and key not in self.sums and (adds := self._accumulated(*key)) is not None}
        for chain in [*self.sums.values(), *self.accumulated.values()]:
            for op, _ in chain:
                del self.outside[op]

    def _sum_chain(self, r: int, j: int) -> list | None:
        """The adds outside the run that sum backward role `r`'s result `j` over the layers in the
        backward loop's order, ``((v[L-1] + v[L-2]) + v[L-3]) + ... + v[0]`` (how jax sums the
        gradient of a leaf every layer reads), each add reading only the sum so far and one layer's
        value (as the same operand of each), the only reader of each outside the run but for the whole
        sum's: [(add op id, the operand index of the sum so far)] for layers L-2 .. 0, or None. (Where
        a value from before the backward loop starts the sum, a layer left out after the run, its L adds
        are a carry of the loops themselves: `layer_roles`.) The backward loop computes the
        same sum in its carry, add for add."""
        g, roles = self.g, self.roles
        if None in roles.ops[r]:             # a dead first position: its value is no layer's
            return None
        values = [g.results[o][j] for o in roles.ops[r]]
        outside = [[u for u, _ in g.users[v] if u not in roles.role_of] for v in values]
        if any(len(users) != 1 for users in outside):
            return None
        chain, total = [], values[-1]
        for l in range(len(values) - 2, -1, -1):
            if l < len(values) - 2 and len(g.users[total]) != 1:
                return None
            op = outside[-1][0] if l == len(values) - 2 else g.users[total][0][0]
            if g.ops[op].name != "stablehlo.add" or sorted(g.operands[op]) != sorted((total, values[l])):
                return None
            chain.append((op, g.operands[op].index(total)))
            total = g.results[op][0]
        return chain if len({k for _, k in chain}) == 1 else None     # the loop's one add: one operand order

    def _accumulated(self, r: int, j: int) -> list | None:
        """In a micro-batch loop's body, the adds that sum backward role `r`'s result `j` over the slices,
        layer by layer (`micro_batch`'s partial sums): at every layer, the value's one reader an add of it
        and a carried value of the body that only that add reads, the add's result that carried value's
        next one, which the loop's condition does not read, as the same operand of each: [(add op id,
        the operand index of the carried value)] for layers 0 .. L-1, or None. The backward loop adds
        each layer's value to its row of one stacked carry of the micro-batch loop instead
        (`_Rewrite.accumulate_in_place`)."""
        g, roles = self.g, self.roles
        loop = g.block.owner.operation
        if MICRO_BATCH not in loop.attributes or None in roles.ops[r]:
            return None
        cond = loop.regions[0].blocks[0]
        ret = len(g.ops) - 1
        adds = []
        for o in roles.ops[r]:
            v = g.results[o][j]
            if len(g.users[v]) != 1 or g.ops[op := g.users[v][0][0]].name != "stablehlo.add":
                return None
            k = 1 - g.users[v][0][1]
            carried = g.operands[op][k]
            n = g.arg_number(carried)
            if (n is None or g.users[carried] != [(op, k)] or g.users[g.results[op][0]] != [(ret, n)]
                    or any(True for _ in cond.arguments[n].uses)):
                return None
            adds.append((op, k))
        return adds if len({k for _, k in adds}) == 1 else None

    def _loops(self) -> None:
        """Which forward roles each loop runs, and what the forward loop saves (see `memory_budget`)."""
        roles = self.roles
        order = sorted(range(len(roles.ops)), key=roles.order)
        forward_roles = [r for r in order if r not in self.backward]
        needs = {r: {c.role for c in classes if isinstance(c, Internal)} for r, classes in enumerate(roles.operands)}
        read_back = {c.role for r in self.backward for c in roles.operands[r] if isinstance(c, Internal)} - self.backward

        def closure(start, stop=frozenset()) -> set:
            """`start` and the forward roles they read, not reading past `stop`."""
            out, todo = set(), [r for r in start if r not in stop]
            while todo:
                r = todo.pop()
                if r not in out:
                    out.add(r)
                    todo += [q for q in needs[r] if q not in self.backward and q not in stop]
            return out

        self.saved = self._choose_saved(closure(read_back), forward_roles)
        saved_roles = {r for r, _ in self.saved}
        recompute = closure(read_back, saved_roles)
        self.recompute = [r for r in forward_roles if r in recompute]
        wanted = {r for r, _, _ in self.carries} | saved_roles | {r for r, _ in self.exports if r not in self.backward}
        forward = closure(wanted)
        self.forward = [r for r in forward_roles if r in forward]

    def _choose_saved(self, needed: set, forward_roles: list) -> list:
        """The forward values to save per layer: none at budget 0; else, of the matrix products the
        backward loop would recompute (`needed`: the values dearest to recompute, jax's
        ``dots_saveable`` candidates), those that cost the most work per byte, up to `budget` of their
        bytes (a knapsack solved greedily by ratio, as PyTorch's partitioner does); the elementwise
        ops after them are recomputed from them. Elementwise values are never saved: XLA fuses them
        into their users, so saving them costs memory and saves little."""
        if self.budget <= 0.0:
            return []
        g, roles = self.g, self.roles
        wanted = [(r, 0) for r in forward_roles if r in needed and g.ops[roles.template(r)].name in MATRIX_PRODUCTS]
        sizes = {key: g.nbytes(roles.value(g, *key)) for key in wanted}
        total = sum(sizes.values())
        chosen, used = [], 0
        for key in sorted(wanted, key=lambda k: -_flops(g, roles.template(k[0])) / max(sizes[k], 1)):
            if _flops(g, roles.template(key[0])) and used + sizes[key] <= self.budget * total:
                chosen.append(key)
                used += sizes[key]
        return chosen

    def describe(self) -> str:
        g, roles = self.g, self.roles
        n = roles.length
        if self.update:
            k = len(set(self.state.values()))
            return f"{n} layers of {len(roles.ops)} ops each, one loop writing the rows of {k} stacked " \
                   f"lea{'f' if k == 1 else 'ves'} in place"
        carried = sum(g.nbytes(roles.value(g, r, j)) for r, j, _ in self.carries)
        saved = sum(g.nbytes(roles.value(g, r, j)) for r, j in self.saved)
        updated = len(set(self.state.values()))
        text = (f"{n} layers of {len(roles.ops)} ops each ({len(roles.ops) - len(self.backward)} forward, "
                f"{len(self.backward)} backward); forward loop carries {len(self.carries)} value(s) of "
                f"{_kib(carried)} and saves it per layer; backward loop recomputes {len(self.recompute)} forward "
                f"op(s), carries {len(self.bcarries)} value(s)")
        if self.sums:
            text += f" and sums {len(self.sums)} over the layers (the gradient of a value every layer reads)"
        if self.accumulated:
            text += f"; adds {len(self.accumulated)} per layer to the slices' sums, in place in stacks the micro-batch loop carries"
        if self.saved:
            text += f"; also saved per layer: {len(self.saved)} value(s) of {_kib(saved)} (memory budget {self.budget:g})"
        text += (f"; {updated} stacked leaves updated inside the backward loop" if updated else
                 f"; {UPDATE_AFTER} (it needs every layer's gradient)")
        return text


def _score(plan: "Plan") -> tuple[int, int]:
    """How good a plan is: the ops it rolls (a dead first position's none: its work is dropped), then the
    fewer bytes its loops carry."""
    g, roles = plan.g, plan.roles
    carried = sum(g.nbytes(roles.value(g, r, j)) for r, j, _ in [*plan.carries, *plan.bcarries])
    return sum(o is not None for ops in roles.ops for o in ops), -carried


def _layers(numbers: list) -> str:
    """``layer 0``, ``layers 0 and 7``, ``layers 0, 1 and 7``."""
    if len(numbers) == 1:
        return f"layer {numbers[0]}"
    return f"layers {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def _kib(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / 2**20:,.1f} MiB"


def _flops(g: Dataflow, op: int) -> int:
    """Rough work of one op: 2 x output x contracted elements for dot_general, else its output elements."""
    o = g.ops[op]
    out = sum(tensor_bytes(r.type) // 4 for r in o.results)
    if o.name == "stablehlo.dot_general":
        lhs = ir.RankedTensorType(o.operands[0].type)
        dims = stablehlo.DotDimensionNumbers(o.attributes["dot_dimension_numbers"])
        contracted = 1
        for d in dims.lhs_contracting_dimensions:
            contracted *= lhs.shape[d]
        return 2 * out * contracted
    return out


# ---- the rewrite -------------------------------------------------------------------------------
def _rewrite(g: Dataflow, plan: Plan) -> ir.Operation | None:
    """Replace the run's ops by the plan's loops (two; an update run's one); the ops between and after them
    move after each. The loop whose results are the stacked leaves' new values (None if the loops update none)."""
    rewrite = _Rewrite(g, plan)
    rewrite.read_left_out()
    rewrite.stack_inputs()
    if plan.update:
        rewrite.backward_loop(rewrite.last_input())
    else:
        forward = rewrite.forward_loop()
        rewrite.move(MID)
        rewrite.backward_loop(forward.op)
    rewrite.move(POST)
    for o in sorted((o for ops in plan.roles.ops for o in ops if o is not None), reverse=True):
        g.erase(g.ops[o])
    rewrite.accumulate_in_place()
    return rewrite.written


class _Rewrite:
    """One run's rewrite. Everything is built before the block's return (``@main``'s, or the micro-batch
    loop body's), in order: the stacked seeds and the forward loop, the ops between the loops (moved), the
    backward loop, the ops after both (moved); the ops before the run stay where they are. In a micro-batch
    body, the stacks of the state's leaves are built before the micro-batch loop, and that loop is rebuilt
    to carry the slices' sums the backward loop adds to (`accumulate_in_place`)."""

    def __init__(self, g: Dataflow, plan: Plan):
        self.g, self.plan, self.roles, self.length = g, plan, plan.roles, plan.roles.length
        self.ret = g.ops[-1]
        self.location = g.ops[min(o for ops in self.roles.ops for o in ops if o is not None)].location
        self.outer = Builder(ir.InsertionPoint(self.ret), self.location)
        enclosing = g.block.owner.operation    # a micro-batch loop's body: stack the state's leaves once, before it
        self.before = Builder.before(enclosing) if enclosing.name == "stablehlo.while" else self.outer
        self.seeds = sorted({c.leaf for classes in self.roles.operands for c in classes if isinstance(c, Seed)}
                            | set(plan.state.values()))     # read, or written in place (an update run's: maybe not read)
        self.per_layer: dict = {}    # PerLayer class -> its stack (`_PerLayerStack`), built before both loops
        self.sources: list = []      # the value ids the per-layer values are read from (`last_input`)
        self.stacked: dict = {}      # seed -> its stack, as the forward loop passes it through
        self.first: dict = {}        # seed -> the row of its layer 0 in its stack (`_stacked`)
        self.written: ir.Operation | None = None     # the loop whose results are the stacks' new values
        self.inputs: dict = {}       # forward carry (role, result, init) -> its value at every layer, stacked
        self.saved: dict = {}        # (role, result) of a forward role -> its value at every layer, stacked
        self.accumulators: dict = {}  # `Plan.accumulated` key -> (its zeros, its stack after the backward loop,
                                      # the micro-batch loop's carries it stands for, by layer)

    # -- the stacked seeds and per-layer values both loops read
    def stack_inputs(self) -> None:
        """The seeds' stacks (`_stacked`: a packed buffer's rows, or stacked here, before the block's loop
        where it is one's body) and the per-layer values' (rows of one stack already, `_stack_rows`, or
        stacked here), each with the row of layer 0."""
        g, roles = self.g, self.roles
        with self.before:
            pairs = [_stacked(g, roles.seeds[s]) for s in self.seeds]
        self.first = {s: first for s, (_, first) in zip(self.seeds, pairs)}
        self.stacked = {s: v for s, (v, _) in zip(self.seeds, pairs)}
        for c in _per_layer(roles):          # values from outside the block: stacked once, before it
            found = _stack_rows(g, c.values)
            if found:
                self.sources.append(found[0])
                self.per_layer[c] = _PerLayerStack(g.values[found[0]], found[1])
                continue
            sources, broadcast = _broadcast_sources(g, c.values)
            self.sources += sources
            with self.before if all(g.owner[v] == ARG and g.arg_number(v) is None for v in sources) else self.outer:
                self.per_layer[c] = _PerLayerStack(rw.stack([g.values[v] for v in sources]), 0, broadcast)

    def last_input(self) -> ir.Operation | None:
        """The op, latest in the block, that computes the per-layer values the roles read (an update run's
        gradients: the stack they are rows of, where they are), or None; after `stack_inputs`."""
        owners = [self.g.owner[v] for v in self.sources if self.g.owner[v] != ARG]
        return self.g.ops[max(owners)] if owners else None

    # -- the forward loop: layer 0 .. L-1, carrying the block's input and saving it per layer
    def forward_loop(self) -> rw.Loop:
        g, plan = self.g, self.plan
        saved = sorted(set(plan.forward_rows()) | set(plan.saved))
        with self.outer:
            loop = rw.Loop.counted(self.length, carry=[g.values[v] for _, _, v in plan.carries],
                                   inputs=[self._history(g.values[v].type) for _, _, v in plan.carries],
                                   saved=[self._history(self._type(key)) for key in saved],
                                   stacks=[self.stacked[s] for s in self.seeds])
        i = loop.counter
        carry_in = dict(zip(plan.carries, loop.arg("carry")))
        env: dict = {}
        body = _Body(g, dict(zip(self.seeds, loop.arg("stacks"))), self.per_layer, i, self.first)

        def resolve(c):
            if isinstance(c, Internal):
                return env[c.role, c.result]
            if isinstance(c, Carry):
                return carry_in[c.role, c.result, c.init]
            return body.outside(c)

        with Builder.at_end(loop.body, self.location):
            self._run(plan.forward, env, resolve)
            loop.next(carry=[env[r, j] for r, j, _ in plan.carries],
                      inputs=[rw.write_row(h, carry_in[key], i) for h, key in zip(loop.arg("inputs"), plan.carries)],
                      saved=[rw.write_row(h, env[key], i) for h, key in zip(loop.arg("saved"), saved)],
                      stacks=loop.arg("stacks"))
        # the stacked leaves pass through the forward loop, so the backward loop updates that one buffer in place
        self.stacked = dict(zip(self.seeds, loop.result("stacks")))
        self.inputs = dict(zip(plan.carries, loop.result("inputs")))
        self.saved = dict(zip(saved, loop.result("saved")))
        final = {(r, j): v for (r, j, _), v in zip(plan.carries, loop.result("carry"))}
        with self.outer:
            for key, layers in plan.exports.items():
                if key[0] not in plan.backward:
                    for l in layers:
                        self._replace(key, l, final[key] if l == self.length - 1 and key in final else
                                      rw.static_row(self.saved[key], l))
        return loop

    # -- the backward loop: layer L-1 .. 0; recompute, backward ops, the update of the stacked state
    def backward_loop(self, after: ir.Operation | None) -> None:
        """Layer l's new rows are carried to the next iteration (``pending``) and written there first,
        before anything reads the stack (`xla_cpu`, 4); layer 0's after the loop (`xla_cpu`, 2). Layer
        L-1's rows are read after the op `after` (the forward loop; an update run's last input), `xla_cpu`, 1.
        An update run's loop is this loop with no carry: its layers need not run in any order."""
        g, plan, roles, L = self.g, self.plan, self.roles, self.length
        state = sorted(set(plan.state.values()))
        row_of = {s: key for key, s in plan.state.items()}
        rows_read = plan.backward_rows()
        exported = [key for key, layers in rows_read.items() if len(layers) > 1]
        picked = {key: at for key, (at,) in ((k, tuple(ls)) for k, ls in rows_read.items() if len(ls) == 1)}
        sums = sorted(plan.sums)
        with self.outer:
            last = rw.scalar(L - 1) if after is None else xla_cpu.after(after, L - 1)   # L: clamped back (`_at`)
            loop = rw.Loop.counted(L, carry=[g.values[v] for _, _, v in plan.bcarries],
                                   stacks=[self.stacked[s] for s in state],
                                   pending=[rw.row(self.stacked[s], self._at(s, last)) for s in state],  # layer L-1
                                   sums=[rw.zeros(self._type(key)) for key in sums],
                                   picked=[rw.zeros(self._type(key)) for key in picked],
                                   exported=(histories := [self._history(self._type(key)) for key in exported]))
        carry_in = dict(zip(plan.bcarries, loop.arg("carry")))
        env: dict = {}
        inputs: dict = {}
        with Builder.at_end(loop.body, self.location):
            layer = stablehlo.SubtractOp(rw.scalar(L - 1), loop.counter).result
            above = stablehlo.AddOp(layer, rw.scalar(1)).result      # L at the first iteration: clamped to L - 1
            current = dict(self.stacked)
            current.update({s: rw.write_row(stack, pending, self._at(s, above))
                            for s, stack, pending in zip(state, loop.arg("stacks"), loop.arg("pending"))})
            body = _Body(g, current, self.per_layer, layer, self.first)

            def resolve(c):
                if isinstance(c, Internal):
                    if (c.role, c.result) not in env:          # a saved forward value
                        env[c.role, c.result] = rw.row(self.saved[c.role, c.result], layer)
                    return env[c.role, c.result]
                if not isinstance(c, Carry):
                    return body.outside(c)
                key = (c.role, c.result, c.init)
                if c.backward:
                    return carry_in[key]
                if key not in inputs:                          # a layer input: the forward loop saved it
                    inputs[key] = rw.row(self.inputs[key], layer)
                return inputs[key]

            self._run([*plan.recompute, *sorted(plan.backward, key=roles.order)], env, resolve)
            loop.next(carry=[env[r, j] for r, j, _ in plan.bcarries],
                      stacks=[current[s] for s in state],
                      pending=[rw.reshape(env[row_of[s]], list(ir.RankedTensorType(self.stacked[s].type).shape[1:]))
                               for s in state],
                      exported=[rw.write_row(h, env[key] if key not in plan.accumulated else
                                             _added(rw.row(h, layer), env[key], plan.accumulated[key][0][1]), layer)
                                for h, key in zip(loop.arg("exported"), exported)],
                      sums=[_summed(loop.counter, total, env[key], plan.sums[key][0][1])
                            for total, key in zip(loop.arg("sums"), sums)],
                      picked=[stablehlo.SelectOp(_is(layer, at), env[key], kept).result     # one layer's value, kept
                              for kept, (key, at) in zip(loop.arg("picked"), picked.items())])
        final = {(r, j): v for (r, j, _), v in zip(plan.bcarries, loop.result("carry"))}
        for key, total in zip(sums, loop.result("sums")):
            chain = [g.ops[op] for op, _ in plan.sums[key]]
            chain[-1].result.replace_all_uses_with(total)
            for op in reversed(chain):
                g.erase(op)
        rows = dict(zip(exported, loop.result("exported")))
        kept = dict(zip(picked, loop.result("picked")))
        for key, adds in plan.accumulated.items():         # the body returns each carried sum as it came in
            self.accumulators[key] = (histories[exported.index(key)], rows[key],
                                      [g.arg_number(g.operands[op][k]) for op, k in adds])
            for op, k in adds:
                g.ops[op].result.replace_all_uses_with(g.values[g.operands[op][k]])
                g.erase(g.ops[op])
        with self.outer:
            new_state = dict(zip(state, xla_cpu.write_first_rows(loop.op, loop.result("stacks"), loop.result("pending"),
                                                                 [self.first[s] for s in state])))
            self.written = new_state[state[0]].owner.operation if state else None
            for key, layers in plan.exports.items():
                if key[0] in plan.backward and key not in plan.sums and key not in plan.accumulated:
                    for l in layers:
                        seed = plan.state.get(key)
                        self._replace(key, l, rw.static_row(new_state[seed], self.first[seed] + l) if key in plan.state else
                                      final[key] if l == 0 and key in final else kept[key] if key in kept else
                                      rw.static_row(rows[key], l))

    def accumulate_in_place(self) -> None:
        """The micro-batch loop's carries of the slices' sums the backward loop adds to (`Plan._accumulated`),
        one per layer, become one stacked carry per sum, which the backward loop starts from instead of
        zeros: its row of layer l is then the sum so far plus the layer's value, the add the body ran after
        the loops, on the same operands, in the same order; after the micro-batch loop each layer's sum is
        its row of the stack. The sums' stack and the rows the loop wrote are one buffer, not two."""
        if not self.accumulators:
            return
        mb = self.g.block.owner.operation
        with Builder.before(mb):
            inits = [_stacked_start([mb.operands[n] for n in carries]) for _, _, carries in self.accumulators.values()]
        dropped = {n for _, _, carries in self.accumulators.values() for n in carries}
        new = rw.Recarry(mb, [n for n in range(len(mb.operands)) if n not in dropped], inits)
        for (zeros, _, _), arg in zip(self.accumulators.values(), new.added_args(new.body)):
            zeros.replace_all_uses_with(arg)
        new.next([stack for _, stack, _ in self.accumulators.values()])
        with Builder.before(mb):         # after the new loop
            for (_, _, carries), total in zip(self.accumulators.values(), new.added_results):
                for l, n in enumerate(carries):
                    mb.results[n].replace_all_uses_with(rw.static_row(total, l))
        new.finish()

    def _at(self, s: int, index: ir.Value) -> ir.Value:
        """The row of seed `s`'s stack that holds layer `index` (a 0-d i32, 0 .. L, where L means L - 1,
        as a dynamic slice clamps it where the stack holds no row after the run's)."""
        first, held = self.first[s], ir.RankedTensorType(self.stacked[s].type).shape[0]
        if first + self.length < held:
            index = stablehlo.MinOp(index, rw.scalar(self.length - 1)).result
        return _shifted(index, first)

    def read_left_out(self) -> None:
        """The rows that the packed buffers the backward loop writes in place hold besides the run's
        (layers left out of it: a stem, a last block), read before anything else (`xla_cpu`, 5): each
        slice of such a buffer outside the run's rows is replaced by the same elements, read into a
        buffer of their own by `xla_cpu.read_before`. The reads move no element: the step reads the
        same values."""
        g, L = self.g, self.length
        buffers: dict = {}           # buffer value id -> its index among the read loop's buffers
        pieces = []                  # (slice op, buffer index, first, last element)
        for s in sorted(set(self.plan.state.values())):
            found = _packed_buffer(g, self.roles.seeds[s])
            if found is None:
                continue
            size = math.prod(ir.RankedTensorType(g.values[self.roles.seeds[s][0]].type).shape)
            lo, hi = found[1] * size, (found[1] + L) * size
            for use in g.values[found[0]].uses:
                op = use.owner.operation
                if (bounds := rows(op)) is not None and (bounds[1] <= lo or bounds[0] >= hi):
                    pieces.append((op, buffers.setdefault(found[0], len(buffers)), *bounds))
        if not pieces:
            return
        first = min((op for op, *_ in pieces), key=cmp_to_key(_in_order))
        with Builder(ir.InsertionPoint(first), self.location):
            read = xla_cpu.read_before([g.values[b] for b in buffers], [p[1:] for p in pieces])
        for (op, *_), value in zip(pieces, read):
            op.result.replace_all_uses_with(value)
            g.erase(op)

    def move(self, where: int) -> None:
        """Move the ops outside the run placed `where` (MID, POST) to here (before the return)."""
        last = len(self.g.ops) - 1
        for n in sorted(o for o, at in self.plan.outside.items() if at == where and o != last):
            self.g.ops[n].move_before(self.ret)

    def _template(self, r: int) -> ir.Operation:
        """Role `r`'s op at layer 0, which a loop body clones."""
        return self.g.ops[self.roles.template(r)]

    def _type(self, key: tuple) -> ir.RankedTensorType:
        """The type of role `key[0]`'s result `key[1]`."""
        return ir.RankedTensorType(self._template(key[0]).results[key[1]].type)

    def _history(self, t: ir.Type) -> ir.Value:
        """Zeros of one value per layer (``[L, ...]``), for a loop to write row by row."""
        t = ir.RankedTensorType(t)
        return rw.zeros(ir.RankedTensorType.get([self.length, *t.shape], t.element_type))

    def _run(self, order: list, env: dict, resolve) -> None:
        """Clone the roles `order` here, each on the operands `resolve` gives for its classes; their
        results go to `env` by (role, result)."""
        g, roles = self.g, self.roles
        for r in order:
            op = self._template(r)
            classes = roles.operands[r]
            n = len(op.operands)
            operands = [resolve(c) for c in classes[:n]]
            captured = {g.values[g.operands[roles.template(r)][k]]: resolve(c) for k, c in enumerate(classes) if k >= n}
            for j, v in enumerate(rw.clone(op, operands, captured).results):
                env[r, j] = v

    def _replace(self, key: tuple, layer: int, value: ir.Value) -> None:
        """Outside uses of role `key`'s value at `layer` read `value` (in that value's shape: a new leaf
        may be written flat, as a packed state's buffer takes it)."""
        old = self.g.values[self.roles.value(self.g, key[0], key[1], layer)]
        old.replace_all_uses_with(rw.reshape(value, list(ir.RankedTensorType(old.type).shape)))


class _Body:
    """What one loop body reads from outside its layer's roles, once however many of its ops read it:
    a seed's or a per-layer value's row at this layer (`stacks`: the seeds' stacks as the body holds
    them), a value the same at every layer (built again where XLA would rather fuse it, `xla_cpu`, 3)."""

    def __init__(self, g: Dataflow, stacks: dict, per_layer: dict, index: ir.Value, first: dict):
        self.g, self.stacks, self.per_layer, self.index, self.first = g, stacks, per_layer, index, first
        self.rows: dict = {}       # Seed or PerLayer -> its row here
        self.shifted: dict = {}    # a stack's first row -> the index of this layer's row in it
        self.built: dict = {}      # value id -> the broadcast built again here

    def outside(self, c: Seed | PerLayer | Invariant) -> ir.Value:
        if isinstance(c, Invariant):
            return self.invariant(c.value)
        if c not in self.rows and isinstance(c, Seed):
            self.rows[c] = rw.row(self.stacks[c.leaf], self._at(self.first[c.leaf]))
        elif c not in self.rows and isinstance(c, PerLayer):
            stacked = self.per_layer[c]
            row = rw.row(stacked.stack, self._at(stacked.first))
            if stacked.broadcast is None:
                self.rows[c] = rw.reshape(row, list(ir.RankedTensorType(self.g.values[c.values[0]].type).shape))
            else:
                self.rows[c] = rw.clone(stacked.broadcast, [row]).results[0]
        return self.rows[c]

    def _at(self, first: int) -> ir.Value:
        """The index of this layer's row in a stack whose row `first` holds layer 0."""
        if first not in self.shifted:
            self.shifted[first] = _shifted(self.index, first)
        return self.shifted[first]

    def invariant(self, v: int) -> ir.Value:
        g = self.g
        op = g.owner[v]
        if op == ARG or not xla_cpu.rebuilt_in_body(g.ops[op]):
            return g.values[v]
        if v not in self.built:
            self.built[v] = rw.clone(g.ops[op], [g.values[g.operands[op][0]]]).results[0]
        return self.built[v]


@dataclass(frozen=True)
class _PerLayerStack:
    """How the loops read a per-layer value: row `first` + l of `stack` at layer l, broadcast again by
    `broadcast` (an op of the step, `_broadcast_sources`) where the stack holds what each layer's value
    is a broadcast of."""

    stack: ir.Value
    first: int
    broadcast: ir.Operation | None = None


def _broadcast_sources(g: Dataflow, values: tuple) -> tuple[tuple, ir.Operation | None]:
    """``(what to stack, the broadcast to apply to its rows)`` for per-layer `values`: where each is a
    ``broadcast_in_dim`` of a smaller value, alike at every layer (one signature: one shape, the same
    dimensions), those smaller values and the first layer's broadcast; else the values, None. A rate shared
    by a group of layers (one label per group) is one broadcast per leaf shape that the group's layers read:
    stacked as it is, it costs a weight's size per layer. A broadcast only moves elements, so each layer's
    row reads the same values either way."""
    owners = [g.owner[v] for v in values]
    if ARG in owners or g.ops[owners[0]].name != "stablehlo.broadcast_in_dim" \
            or len({g.signature[o] for o in owners}) > 1:
        return values, None
    sources = tuple(g.operands[o][0] for o in owners)
    return (sources, g.ops[owners[0]]) if g.nbytes(sources[0]) < g.nbytes(values[0]) else (values, None)


def _per_layer(roles: Roles) -> list[PerLayer]:
    """The per-layer values the roles read, each once, in the order first read."""
    return list(dict.fromkeys(c for classes in roles.operands for c in classes if isinstance(c, PerLayer)))


def _stacked(g: Dataflow, values: list) -> tuple[ir.Value, int]:
    """The layers' values of one leaf stacked (``[n, ...]``), and the row of the first one: the packed
    buffer they are the pieces of, reshaped, whose rows may also hold layers left out of the run
    before and after it (`_packed_buffer`); else a stack of them (row 0)."""
    found = _packed_buffer(g, values)
    if found is None:
        return rw.stack([g.values[v] for v in values]), 0
    shape = ir.RankedTensorType(g.values[values[0]].type).shape
    return rw.reshape(g.values[found[0]], [_rows(g, found[0], values), *shape]), found[1]


def _packed_buffer(g: Dataflow, values: Sequence[int]) -> tuple[int, int] | None:
    """(buffer, first) where the layers' values of one leaf are consecutive pieces of one 1-D buffer,
    each a slice, reshaped (`packed.pack(layers=True)`), the first one its row `first` (the buffer
    viewed as rows of the leaf's size); else None."""
    found = _consecutive(g, values)
    return found if found and ir.RankedTensorType(g.values[found[0]].type).rank == 1 else None


def _stack_rows(g: Dataflow, values: Sequence[int]) -> tuple[int, int] | None:
    """(x, first) where per-layer `values` are rows first, first + 1, .. of one value x, each a slice of
    one row, reshaped or not (an update run's gradients: rows of the stack a loop summed them in); else
    None."""
    found = _consecutive(g, values)
    size = math.prod(ir.RankedTensorType(g.values[values[0]].type).shape)
    return found if found and math.prod(ir.RankedTensorType(g.values[found[0]].type).shape[1:]) == size else None


def _consecutive(g: Dataflow, values: Sequence[int]) -> tuple[int, int] | None:
    """(x, first) where `values` (of one type) are consecutive pieces of one value x of the values' size
    each, in order, each a `rows` slice of x (reshaped or not), the first one piece `first` of x (viewed
    flat, as pieces of that size); else None."""
    size = math.prod(ir.RankedTensorType(g.values[values[0]].type).shape)
    source, first = None, 0
    for l, v in enumerate(values):
        piece = _piece(g, v)
        if piece is None or source not in (None, piece[0]):
            return None
        row = math.prod(ir.RankedTensorType(g.values[piece[0]].type).shape[1:])
        lo, hi = piece[1][0] * row, piece[1][1] * row
        source, first = piece[0], first if l else lo // size
        if (lo, hi) != ((first + l) * size, (first + l + 1) * size):
            return None
    if source is None or math.prod(ir.RankedTensorType(g.values[source].type).shape) % size:
        return None
    return source, first


def _piece(g: Dataflow, v: int) -> tuple[int, tuple[int, int]] | None:
    """(buffer, (first, last element)) where value `v` is a slice of a 1-D buffer, reshaped or not: in the
    block, or where a value the block reads from outside it (a micro-batch body's state leaf) is made, of a
    buffer the block also reads from outside (`_sources`). Asked once per value (`Dataflow.cached`)."""
    return g.cached(_sliced_piece, v)


def _sliced_piece(g: Dataflow, v: int) -> tuple[int, tuple[int, int]] | None:
    found = sliced_rows(g.values[v])
    return None if found is None or (b := g.id_of.get(found[0])) is None else (b, found[1:])


def _sources(leaves: list) -> list:
    """The buffers the state leaves `leaves` (`state_leaves`' values) are pieces of, each once: what a
    micro-batch body, which reads the leaves from ``@main``, reads of them to roll a packed state's layers
    over their rows (`_stacked`); in ``@main`` its arguments, numbered already."""
    return list(dict.fromkeys(found[0] for v in leaves if (found := sliced_rows(v)) is not None))


def _out_of_order(g: Dataflow, values: list) -> bool:
    """Whether the layers' values of one leaf are the rows of one packed buffer in another order than
    the layers' (`_packed_buffer` finds them once sorted by their rows)."""
    pieces = [_piece(g, v) for v in values]
    return (_packed_buffer(g, values) is None and all(pieces)
            and _packed_buffer(g, [v for _, v in sorted(zip([p[1] for p in pieces if p], values))]) is not None)


def _rows(g: Dataflow, buffer: int, values: list) -> int:
    """How many rows of the leaf's size the packed `buffer` holds."""
    return ir.RankedTensorType(g.values[buffer].type).shape[0] // math.prod(
        ir.RankedTensorType(g.values[values[0]].type).shape)


def _summed(counter: ir.Value, total: ir.Value, value: ir.Value, k: int) -> ir.Value:
    """The sum so far `total` plus this layer's `value`, `total` as operand `k` of the add (the original's
    operand order), or `value` itself at the first iteration (layer L-1, where the program sums nothing
    yet): the unrolled program's additions, one for one."""
    return stablehlo.SelectOp(_is(counter, 0), value, _added(total, value, k)).result


def _stacked_start(values: list) -> ir.Value:
    """`values` (one type) stacked: zeros where all are +0.0 (a sum's start), else their stack."""
    t = ir.RankedTensorType(values[0].type)
    if all((x := splat_value(v)) == 0 and math.copysign(1.0, x) > 0 for v in values):
        return rw.zeros(ir.RankedTensorType.get([len(values), *t.shape], t.element_type))
    return rw.stack(values)


def _added(total: ir.Value, value: ir.Value, k: int) -> ir.Value:
    """``total + value`` with `total` as operand `k` of the add."""
    return stablehlo.AddOp(*((total, value) if k == 0 else (value, total))).result


def _is(index: ir.Value, at: int) -> ir.Value:
    """Whether the 0-d i32 `index` is `at` (a 0-d i1)."""
    return stablehlo.CompareOp(index, rw.scalar(at), stablehlo.ComparisonDirectionAttr.get("EQ")).result


def _shifted(index: ir.Value, first: int) -> ir.Value:
    """`index` + `first` (`index` itself for 0)."""
    return stablehlo.AddOp(index, rw.scalar(first)).result if first else index
