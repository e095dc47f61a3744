"""wrap-loop{steps=K}: run K steps of the update in one device call.

Rewrites: the body of ``@main`` moves to a private ``@loopfuse_step``; ``@main`` becomes one
``stablehlo.while`` of K iterations that carries a counter, every state value (arguments and
results tagged with the same ``loopfuse.state`` path), the loop-invariant arguments (batch,
dataset, hyperparameters) and one ``tensor<K x ...>`` history buffer per aux result. Each
iteration calls the step on the carried state, writes its aux results into row ``i`` of the
histories (``dynamic_update_slice``) and passes its new state on. An argument tagged
``loopfuse.step_index`` receives ``start + i``, so per-step data selection (dataset slices,
shuffles) continues across iterations. ``@main`` returns the final state and the histories.

Why it is safe: iteration i computes exactly what the i-th separate call would, with the state
the previous iteration produced; invariant arguments are passed unchanged; the history rows are
written once each. Result attributes stay on the results so the runtime maps them as before (an
``sdy.sharding`` of an aux result gains an unsharded leading axis for its history).

Stopping early: a ``tensor<i1>`` result tagged ``loopfuse.stop`` (true = stop after this step) is
carried as a "stopped" flag instead of getting a history. The condition becomes ``i < K and not
stopped``; the histories start as NaN (floating and complex) or 0 (integer, bool), so the rows of
steps that never ran read as such; ``@main`` returns the final counter, the number of steps run,
as a ``tensor<i32>`` tagged ``loopfuse.steps_run`` in the stop result's place, and right after it
the final flag, a ``tensor<i1>`` tagged ``loopfuse.stopped`` (``loopfuse.result`` one past the
stop's): whether the stop ended the loop, also when it asked to at the K-th step. An argument tagged
``loopfuse.stopped`` (a ``tensor<i1>``, e.g. the previous call's flag) is the flag's initial value:
true runs no step (steps run 0, the state returned as it came, the flag true). Safe for the same
reasons: the iterations that run are the same, and the flag only decides how many run. Without a
``loopfuse.stop`` result the output is exactly the plain K-step loop.

Blocks (``rows``, 0 < rows < K): ``@main`` is an outer loop over blocks of ``rows`` steps (the last
one shorter) whose body runs an inner loop over the block's steps, as above but writing each aux
result into row ``i - block start`` of a ``tensor<rows x ...>`` block (NaN or 0 at first, like the
histories), then writes the blocks into the histories at the block's start; the histories are
padded to whole blocks and cut to K rows at the end. A stopping loop carries its flag through both
loops, and both stop on it. XLA:CPU runs a loop body sequentially only where every buffer it touches
is small (``runtime.SEQUENTIAL_BYTES``): a long history is such a buffer, a block of it need not be.
Safe for the same reasons: the same steps run in the same order on the same state, each history row
is written once (rows of steps that never ran keep their initial value), and the stop ends both
loops after the same step.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy, stablehlo

from . import rewriter as rw
from .functions import arg_attrs, main_func, result_attrs, set_result_attrs, string_attr
from .module_pass import ModulePass, PassError, option
from .vocabulary import BODY, RESULT, SDY_SHARDING, STATE, STEP_INDEX, STEPS_RUN, STOP, STOPPED


@dataclass(frozen=True)
class WrapLoop(ModulePass):
    """The wrap-loop pass; its one option, ``steps``, is K. Built from pipeline text:

    Examples:
        >>> from loopfuse.pass_manager import parse_pipeline
        >>> parse_pipeline("builtin.module(wrap-loop{steps=8},cse)")
        [WrapLoop(steps=8, rows=0), UpstreamPass(name='cse', options='')]
        >>> try:
        ...     parse_pipeline("wrap-loop{steps=0}")
        ... except ValueError as e:
        ...     print(e)
        pass 'wrap-loop' option 'steps': must be >= 1, got 0
    """

    name = "wrap-loop"
    summary = "Run K steps of the update in one device call (a stablehlo.while around the step)"

    steps: int = option(1, "iterations of the step per call (K)", minimum=1, maximum=2**31 - 1)  # an i32 counter
    rows: int = option(0, "with 0 < rows < steps, an outer loop over blocks of `rows` steps, each an inner loop "
                          "writing a block of `rows` rows of each history (0: one loop)", minimum=0, maximum=2**31 - 1)

    def apply(self, module_op: ir.Operation) -> None:
        _wrap(main_func(module_op), self.steps, self.rows)


def _wrap(f: func.FuncOp, k: int, rows: int) -> None:
    args, results = arg_attrs(f), result_attrs(f)
    in_types, out_types = list(f.type.inputs), list(f.type.results)
    state_arg = {ir.StringAttr(a[STATE]).value: i for i, a in enumerate(args) if STATE in a}
    carried: dict[int, int] = {}  # result index -> argument index
    carried_paths: set[str] = set()
    for j, a in enumerate(results):
        path = string_attr(a, STATE)
        if path is None:
            continue
        if path in carried_paths:
            raise PassError(f, f"state path {path} tags more than one result (result {j} again)")
        i = state_arg.get(path)
        if i is None or in_types[i] != out_types[j]:
            raise PassError(f, f"state result {j} ({path}) has no argument of the same path and type "
                               f"to carry it around the loop")
        carried[j] = i
        carried_paths.add(path)
    if len(carried) != len(state_arg):
        missing = sorted(set(state_arg) - {string_attr(results[j], STATE) for j in carried})
        raise PassError(f, f"state arguments {missing} have no matching result: the loop cannot carry them")
    step_args = [i for i, a in enumerate(args) if STEP_INDEX in a]
    i32 = rw.i32()
    for s in step_args:
        if in_types[s] != i32:
            raise PassError(f, f"step index argument {s} must be tensor<i32>, not {in_types[s]}")
    stop = _stop_result(f, results, out_types, carried)
    stopped_arg = _stopped_arg(f, args, in_types, stop)
    aux = [j for j in range(len(out_types)) if j not in carried and j != stop]

    _clone_as_body(f)
    block = f.body.blocks[0]
    for op in reversed(list(block.operations)):
        op.operation.erase()
    blocked = 0 < rows < k and bool(aux)
    hist_types = [_stacked(k, out_types[j]) for j in aux]
    with ir.InsertionPoint(block), f.location:
        zero = rw.scalar(0, i32)
        hist_init = rw.zeros if stop is None else _unwritten
        n_args = len(in_types)
        padded = [_stacked(-(-k // rows) * rows, out_types[j]) for j in aux] if blocked else hist_types  # whole blocks
        init = [zero, *block.arguments, *[hist_init(t) for t in padded]]
        if stop is not None:
            init.append(rw.scalar(0, ir.RankedTensorType(out_types[stop])) if stopped_arg is None
                        else block.arguments[stopped_arg])  # the "stopped" flag, last
        step = _Step(out_types, carried, aux, stop, step_args)
        loop = stablehlo.WhileOp([v.type for v in init], init)
        _condition(loop, lambda args: rw.scalar(k, i32), stop)

        body = loop.regions[1].blocks.append(*[v.type for v in init])
        with ir.InsertionPoint(body):
            i, state = body.arguments[0], list(body.arguments[1:1 + n_args])
            hist = list(body.arguments[1 + n_args:1 + n_args + len(aux)])
            flag = list(body.arguments[1 + n_args + len(aux):])
            if blocked:   # rows steps (fewer in the last block) writing a block of each history
                end = stablehlo.MinOp(stablehlo.AddOp(i, rw.scalar(rows, i32)).result, rw.scalar(k, i32)).result
                inner_init = [i, i, end, *state, *[hist_init(_stacked(rows, out_types[j])) for j in aux], *flag]
                inner = stablehlo.WhileOp([v.type for v in inner_init], inner_init)
                _condition(inner, lambda args: args[2], stop)
                inner_body = inner.regions[1].blocks.append(*[v.type for v in inner_init])
                with ir.InsertionPoint(inner_body):
                    j, first, last = inner_body.arguments[:3]
                    offset = stablehlo.SubtractOp(j, first).result
                    new_args, new_blocks, new_flag = step(j, offset, list(inner_body.arguments[3:3 + n_args]),
                                                          list(inner_body.arguments[3 + n_args:3 + n_args + len(aux)]))
                    stablehlo.ReturnOp([_next(j), first, last, *new_args, *new_blocks, *new_flag])
                out = list(inner.results)
                new_hist = [rw.write_rows(h, b, i) for h, b in zip(hist, out[3 + n_args:3 + n_args + len(aux)])]
                stablehlo.ReturnOp([out[0], *out[3:3 + n_args], *new_hist, *out[3 + n_args + len(aux):]])
            else:
                new_args, new_hist, new_flag = step(i, i, state, hist)
                stablehlo.ReturnOp([_next(i), *new_args, *new_hist, *new_flag])

        final = list(loop.results)
        for h, t in enumerate(hist_types):   # a blocked loop's histories, padded to whole blocks, cut to k rows
            if t != padded[h]:
                final[1 + n_args + h] = stablehlo.SliceOp(final[1 + n_args + h], [0] * t.rank, t.shape,
                                                          [1] * t.rank).result
        row = {j: 1 + n_args + h for h, j in enumerate(aux)}  # aux result -> its history's loop result
        new_results = [final[1 + carried[j]] if j in carried else final[0] if j == stop else final[row[j]]
                       for j in range(len(out_types))]
        if stop is not None:
            stopped: dict[str, ir.Attribute] = {STOPPED: ir.UnitAttr.get()}
            if RESULT in results[stop]:
                flat = ir.IntegerAttr(results[stop][RESULT])
                stopped[RESULT] = ir.IntegerAttr.get(flat.type, flat.value + 1)
            del results[stop][STOP]
            results[stop][STEPS_RUN] = ir.UnitAttr.get()
            new_results.insert(stop + 1, final[-1])
            results.insert(stop + 1, stopped)
        func.ReturnOp(new_results)
    f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(in_types, [v.type for v in new_results]))
    for j in aux:
        j += stop is not None and j > stop    # past the inserted stopped flag
        if SDY_SHARDING in results[j]:
            results[j][SDY_SHARDING] = _prepend_unsharded_dim(results[j][SDY_SHARDING])
    set_result_attrs(f, results)


def history_rows(module_op: ir.Operation, steps: int, max_bytes: int) -> int:
    """The ``rows`` option that keeps every buffer a loop of `steps` steps of this module's ``@main``
    touches at most `max_bytes`: the most rows of each aux result that fit, where every tensor of the
    module is that small and the histories of `steps` rows would not be; else 0 (one loop)."""
    sizes: list[int] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        for region in op.regions:
            for block in region.blocks:
                sizes.extend(_bytes(a.type) for a in block.arguments)
        sizes.extend(_bytes(r.type) for r in op.results)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    f = main_func(module_op)
    aux = [_bytes(t) for t, a in zip(f.type.results, result_attrs(f)) if STATE not in a and STOP not in a]
    if not aux or max(sizes) > max_bytes or any(n == 0 for n in aux):
        return 0
    rows = min(max_bytes // n for n in aux)
    return rows if rows < steps else 0


def _bytes(t: ir.Type) -> int:
    """The bytes of a tensor of static shape, 0 for other types (tokens), a huge number for a dynamic shape."""
    if not isinstance(t, ir.RankedTensorType):
        return 0
    t = ir.RankedTensorType(t)
    if not t.has_static_shape:
        return 2**62
    et = t.element_type
    part = ir.ComplexType(et).element_type if isinstance(et, ir.ComplexType) else et
    width = part.width if isinstance(part, (ir.IntegerType, ir.FloatType)) else 64
    count = 1
    for d in t.shape:
        count *= d
    return count * max(1, width // 8) * (2 if isinstance(et, ir.ComplexType) else 1)


class _Step:
    """One step inside a loop body: call @loopfuse_step on the carried arguments (a step index argument
    gets ``start + i``), carry its new state, write its aux results into row `row` of their histories."""

    def __init__(self, out_types: list, carried: dict, aux: list, stop: int | None, step_args: list):
        self.out_types, self.carried, self.aux, self.stop, self.step_args = out_types, carried, aux, stop, step_args

    def __call__(self, i: ir.Value, row: ir.Value, state: list, hist: list) -> tuple[list, list, list]:
        """(new arguments, new histories, [the stop flag] or [])."""
        call_args = list(state)
        for s in self.step_args:
            call_args[s] = stablehlo.AddOp(state[s], i).result
        outs = func.CallOp(self.out_types, ir.FlatSymbolRefAttr.get(BODY), call_args).results
        new_args = list(state)
        for j, arg in self.carried.items():
            new_args[arg] = outs[j]
        return new_args, [rw.write_row(h, outs[j], row) for h, j in zip(hist, self.aux)], \
            [] if self.stop is None else [outs[self.stop]]


def _condition(loop: stablehlo.WhileOp, limit, stop: int | None) -> None:
    """`loop`'s condition: its counter (first) below ``limit(arguments)``, and for a stopping loop its
    stopped flag (last) false."""
    cond = loop.regions[0].blocks.append(*[v.type for v in loop.operands])
    with ir.InsertionPoint(cond):
        lt = stablehlo.CompareOp(cond.arguments[0], limit(cond.arguments), stablehlo.ComparisonDirectionAttr.get("LT"))
        stablehlo.ReturnOp([lt.result if stop is None else _and_not(lt.result, cond.arguments[-1])])


def _next(i: ir.Value) -> ir.Value:
    return stablehlo.AddOp(i, rw.scalar(1, ir.RankedTensorType(i.type))).result


def _stacked(rows: int, t: ir.Type) -> ir.RankedTensorType:
    """The type of `rows` rows of values of type `t` (a history, or a block of one)."""
    rt = ir.RankedTensorType(t)
    return ir.RankedTensorType.get([rows, *rt.shape], rt.element_type)


def _stop_result(f: func.FuncOp, results: list[dict], out_types: list, carried: dict) -> int | None:
    """The index of the one result tagged loopfuse.stop (a tensor<i1>, not state), or None."""
    stops = [j for j, a in enumerate(results) if STOP in a]
    if not stops:
        return None
    if len(stops) > 1:
        raise PassError(f, f"results {stops} are all tagged {STOP}; a loop has one stop condition")
    j = stops[0]
    if j in carried:
        raise PassError(f, f"stop result {j} is also a state result ({STATE}); the stop flag is not state")
    if out_types[j] != ir.RankedTensorType.get([], ir.IntegerType.get_signless(1)):
        raise PassError(f, f"stop result {j} must be tensor<i1>, not {out_types[j]}")
    return j


def _stopped_arg(f: func.FuncOp, args: list[dict], in_types: list, stop: int | None) -> int | None:
    """The index of the one argument tagged loopfuse.stopped (a tensor<i1>, with a stop result), or None."""
    tagged = [i for i, a in enumerate(args) if STOPPED in a]
    if not tagged:
        return None
    if len(tagged) > 1:
        raise PassError(f, f"arguments {tagged} are all tagged {STOPPED}; a loop has one initial stopped flag")
    if stop is None:
        raise PassError(f, f"argument {tagged[0]} is tagged {STOPPED} but no result {STOP}: it starts a stopping loop")
    if in_types[tagged[0]] != ir.RankedTensorType.get([], ir.IntegerType.get_signless(1)):
        raise PassError(f, f"stopped argument {tagged[0]} must be tensor<i1>, not {in_types[tagged[0]]}")
    return tagged[0]


def _and_not(go: ir.Value, stopped: ir.Value) -> ir.Value:
    return stablehlo.AndOp(go, stablehlo.NotOp(stopped).result).result


def _unwritten(t: ir.RankedTensorType) -> ir.Value:
    """The initial history of a stopping loop: NaN for floating elements, NaN + NaN i for complex
    ones, else 0 (the rows of steps that do not run keep it)."""
    et = t.element_type
    if not isinstance(et, (ir.FloatType, ir.ComplexType)):
        return rw.zeros(t)
    part = ir.ComplexType(et).element_type if isinstance(et, ir.ComplexType) else et
    scalar = ir.RankedTensorType.get([], part)
    nan = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(scalar, ir.FloatAttr.get(part, float("nan")))).result
    if isinstance(et, ir.ComplexType):
        nan = stablehlo.ComplexOp(nan, nan).result
    return stablehlo.BroadcastInDimOp(t, nan, []).result


def _prepend_unsharded_dim(sharding: ir.Attribute) -> ir.Attribute:
    """#sdy.sharding of a result -> the same for its history, with a new unsharded step axis first."""
    t = sdy.TensorShardingAttr(sharding)
    step_axis = sdy.DimensionShardingAttr.get([], True)
    return sdy.TensorShardingAttr.get(t.mesh_or_ref, [step_axis, *t.dimension_shardings], t.replicated_axes,
                                      t.unreduced_axes)


def _clone_as_body(f: func.FuncOp) -> None:
    with ir.InsertionPoint(f.operation):
        body = f.operation.clone().opview
    body.attributes["sym_name"] = ir.StringAttr.get(BODY)
    body.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for name in ("arg_attrs", "res_attrs"):
        if name in body.attributes:
            del body.attributes[name]

