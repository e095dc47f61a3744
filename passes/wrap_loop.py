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
is small (``xla.SEQUENTIAL_BYTES``): a long history is such a buffer, a block of it need not be.
Safe for the same reasons: the same steps run in the same order on the same state, each history row
is written once (rows of steps that never ran keep their initial value), and the stop ends both
loops after the same step.
"""
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy, stablehlo

from . import rewriter as rw
from .functions import (arg_attrs, find_function, function, main_func, make_private, result_attrs, retype,
                        set_result_attrs, string_attr)
from .module_pass import ModulePass, PassError, option
from .vocabulary import BODY, RESULT, SDY_SHARDING, STATE, STEP_INDEX, STEPS_RUN, STOP, STOPPED


@dataclass(frozen=True)
class WrapLoop(ModulePass):
    """The wrap-loop pass; its one option, ``steps``, is K. Built from pipeline text:

    Examples:
        >>> from loopfuse.compile.pass_manager import parse_pipeline
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
        main = main_func(module_op)
        if find_function(module_op, BODY) is not None:
            raise PassError(main, f"the module already has @{BODY}: wrap-loop has run on it (it runs once)")
        _wrap(main, self.steps, self.rows)


@dataclass(frozen=True)
class _Signature:
    """What each argument and result of ``@main`` is to the loop (indices into its arguments and results)."""

    in_types: list
    out_types: list
    carried: dict[int, int]     # state result -> the argument it is carried into
    step_args: list[int]        # arguments tagged loopfuse.step_index
    stop: int | None            # the result tagged loopfuse.stop
    stopped_arg: int | None     # the argument tagged loopfuse.stopped (the stopped flag's initial value)
    aux: list[int]              # the other results, one history each

    @property
    def flag_group(self) -> str | None:
        """The name of the loops' group carrying the stopped flag, for a stopping loop."""
        return None if self.stop is None else "flag"


def _wrap(f: func.FuncOp, k: int, rows: int) -> None:
    sig = _signature(f)
    results = result_attrs(f)
    _clone_as_body(f)
    block = f.body.blocks[0]
    for op in reversed(list(block.operations)):
        op.operation.erase()
    with ir.InsertionPoint(block), f.location:
        new_results = _loop(sig, list(block.arguments), k, rows)
        func.ReturnOp(new_results)
    retype(f)
    set_result_attrs(f, _new_result_attrs(sig, results))


def _signature(f: func.FuncOp) -> _Signature:
    """The roles of ``@main``'s arguments and results, checked (a `PassError` naming the first problem)."""
    args, results = arg_attrs(f), result_attrs(f)
    in_types, out_types = list(f.type.inputs), list(f.type.results)
    carried = _carried(f, args, results)
    step_args = [i for i, a in enumerate(args) if STEP_INDEX in a]
    for s in step_args:
        if in_types[s] != rw.i32():
            raise PassError(f, f"step index argument {s} must be tensor<i32>, not {in_types[s]}")
    stop = _stop_result(f, results, out_types, carried)
    stopped_arg = _stopped_arg(f, args, in_types, stop)
    aux = [j for j in range(len(out_types)) if j not in carried and j != stop]
    for j in aux:
        if not isinstance(out_types[j], ir.RankedTensorType):
            raise PassError(f, f"result {j} is {out_types[j]}: wrap-loop keeps histories of ranked tensors only")
    return _Signature(in_types, out_types, carried, step_args, stop, stopped_arg, aux)


def _carried(f: func.FuncOp, args: list[dict], results: list[dict]) -> dict[int, int]:
    """State result -> the argument of the same ``loopfuse.state`` path and type, which the loop
    carries it into; every state argument has one such result."""
    in_types, out_types = list(f.type.inputs), list(f.type.results)
    state_arg = {path: i for i, a in enumerate(args) if (path := string_attr(a, STATE)) is not None}
    carried: dict[int, int] = {}
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
    return carried


def _loop(sig: _Signature, args: list, k: int, rows: int) -> list[ir.Value]:
    """Build the loop of `k` steps (in blocks of `rows`, where 0 < rows < k) over ``@main``'s
    arguments `args`; returns ``@main``'s new results."""
    blocked = 0 < rows < k and bool(sig.aux)
    unwritten = rw.zeros if sig.stop is None else _unwritten
    zero = rw.scalar(0)
    padded = -(-k // rows) * rows if blocked else k     # a blocked loop's histories: whole blocks
    hist = [unwritten(_stacked(padded, sig.out_types[j])) for j in sig.aux]
    flag = [] if sig.stop is None else [
        rw.scalar(0, ir.RankedTensorType(sig.out_types[sig.stop])) if sig.stopped_arg is None else args[sig.stopped_arg]]
    loop = rw.Loop.build(zero, k, {"state": args, "hist": hist, "flag": flag}, stop=sig.flag_group)
    with ir.InsertionPoint(loop.body):
        if blocked:
            _block_of_steps(sig, loop, k, rows, unwritten)
        else:
            state, hist, flag = _step(sig, loop.counter, loop.counter, loop.arg("state"), loop.arg("hist"))
            loop.next(state=state, hist=hist, flag=flag)
    state = loop.result("state")
    history = dict(zip(sig.aux, (rw.static_rows(h, 0, k) for h in loop.result("hist"))))  # cut to k rows
    outs = [state[sig.carried[j]] if j in sig.carried else loop.final_counter if j == sig.stop else history[j]
            for j in range(len(sig.out_types))]
    if sig.stop is not None:
        outs.insert(sig.stop + 1, loop.result("flag")[0])
    return outs


def _block_of_steps(sig: _Signature, loop: rw.Loop, k: int, rows: int, unwritten) -> None:
    """The body of the loop over blocks: an inner loop over the block's steps (`rows`, fewer in the
    last block) writing a block of each history, then the blocks written into the histories."""
    i = loop.counter
    end = stablehlo.MinOp(stablehlo.AddOp(i, rw.scalar(rows)).result, rw.scalar(k)).result
    inner = rw.Loop.build(i, "last", {"first": [i], "last": [end], "state": loop.arg("state"),
                                      "hist": [unwritten(_stacked(rows, sig.out_types[j])) for j in sig.aux],
                                      "flag": loop.arg("flag")}, stop=sig.flag_group)
    with ir.InsertionPoint(inner.body):
        j = inner.counter
        offset = stablehlo.SubtractOp(j, *inner.arg("first")).result
        state, blocks, flag = _step(sig, j, offset, inner.arg("state"), inner.arg("hist"))
        inner.next(first=inner.arg("first"), last=inner.arg("last"), state=state, hist=blocks, flag=flag)
    hist = [rw.write_rows(h, b, i) for h, b in zip(loop.arg("hist"), inner.result("hist"))]
    loop.next(inner.final_counter, state=inner.result("state"), hist=hist, flag=inner.result("flag"))


def _new_result_attrs(sig: _Signature, results: list[dict]) -> list[dict]:
    """``@main``'s result attributes after the rewrite: a stopping loop's stop result becomes the
    steps run, followed by the stopped flag; an aux result's sharding gains the history's axis."""
    results = [dict(a) for a in results]
    if sig.stop is not None:
        stopped: dict[str, ir.Attribute] = {STOPPED: ir.UnitAttr.get()}
        if RESULT in results[sig.stop]:
            flat = ir.IntegerAttr(results[sig.stop][RESULT])
            stopped[RESULT] = ir.IntegerAttr.get(flat.type, flat.value + 1)
        del results[sig.stop][STOP]
        results[sig.stop][STEPS_RUN] = ir.UnitAttr.get()
        results.insert(sig.stop + 1, stopped)
    for j in sig.aux:
        j += sig.stop is not None and j > sig.stop    # past the inserted stopped flag
        if SDY_SHARDING in results[j]:
            results[j][SDY_SHARDING] = _prepend_unsharded_dim(results[j][SDY_SHARDING])
    return results


def history_rows(module_op: ir.Operation, steps: int, max_bytes: int) -> int:
    """The ``rows`` option that keeps every buffer a loop of `steps` steps of this module's ``@main``
    touches at most `max_bytes`: the most rows of each aux result that fit, where every tensor of the
    module is that small and the histories of `steps` rows would not be; else 0 (one loop)."""
    f = main_func(module_op)
    aux = [_bytes(t) for t, a in zip(f.type.results, result_attrs(f)) if STATE not in a and STOP not in a]
    if not aux or any(n == 0 for n in aux):
        return 0
    small = True

    def visit(op: ir.Operation) -> ir.WalkResult:     # stops at the first tensor over max_bytes
        nonlocal small
        values = [a for region in op.regions for block in region.blocks for a in block.arguments]
        small = all(_bytes(v.type) <= max_bytes for v in [*values, *op.results])
        return ir.WalkResult.ADVANCE if small else ir.WalkResult.INTERRUPT

    module_op.walk(visit)
    if not small:
        return 0
    rows = min(max_bytes // n for n in aux)
    return rows if rows < steps else 0


def step_work(module_op: ir.Operation) -> tuple[int, int]:
    """``(ops, bytes)`` one call of the module's ``@main`` runs: its ops and the bytes of their results, a
    called function's once per call (constants, returns and calls themselves left out). A step's time grows
    with both (a kernel's fixed cost, the values it writes); a loop of `steps` steps runs `steps` times them.

    Examples:
        >>> from loopfuse.compile.mlir_context import parse_module
        >>> step_work(parse_module('''
        ... func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        ...   %0 = func.call @twice(%x) : (tensor<4xf32>) -> tensor<4xf32>
        ...   %1 = func.call @twice(%0) : (tensor<4xf32>) -> tensor<4xf32>
        ...   return %1 : tensor<4xf32>
        ... }
        ... func.func private @twice(%x: tensor<4xf32>) -> tensor<4xf32> {
        ...   %0 = stablehlo.add %x, %x : tensor<4xf32>
        ...   return %0 : tensor<4xf32>
        ... }''').operation)
        (2, 32)
    """
    totals: dict[str, tuple[int, int]] = {}

    def total(name: str) -> tuple[int, int]:
        if name not in totals:
            totals[name] = (0, 0)        # a recursive call counts nothing more
            ops = values = 0

            def visit(op: ir.Operation) -> ir.WalkResult:
                nonlocal ops, values
                if op.name == "func.call":
                    n, b = total(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
                    ops, values = ops + n, values + b
                elif op.name not in _NO_WORK:
                    ops, values = ops + 1, values + sum(_bytes(r.type) for r in op.results)
                return ir.WalkResult.ADVANCE

            function(module_op, name).operation.walk(visit)
            totals[name] = (ops, values)
        return totals[name]
    return total("main")


_NO_WORK = ("func.func", "func.return", "stablehlo.return", "stablehlo.constant")


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


def _step(sig: _Signature, i: ir.Value, row: ir.Value, state: list, hist: list) -> tuple[list, list, list]:
    """One step inside a loop body: call @loopfuse_step on the carried arguments `state` (a step index
    argument gets ``start + i``), carry its new state, write its aux results into row `row` of their
    histories `hist`. Returns (the new arguments, the new histories, [the stop flag] or [])."""
    call_args = list(state)
    for s in sig.step_args:
        call_args[s] = stablehlo.AddOp(state[s], i).result
    outs = func.CallOp(sig.out_types, ir.FlatSymbolRefAttr.get(BODY), call_args).results
    new_args = list(state)
    for j, arg in sig.carried.items():
        new_args[arg] = outs[j]
    return new_args, [rw.write_row(h, outs[j], row) for h, j in zip(hist, sig.aux)], \
        [] if sig.stop is None else [outs[sig.stop]]


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


def _unwritten(t: ir.RankedTensorType) -> ir.Value:
    """The initial history of a stopping loop: NaN for floating elements, NaN + NaN i for complex
    ones, else 0 (the rows of steps that do not run keep it)."""
    et = t.element_type
    if not isinstance(et, (ir.FloatType, ir.ComplexType)):
        return rw.zeros(t)
    part = ir.ComplexType(et).element_type if isinstance(et, ir.ComplexType) else et
    nan = rw.splat(ir.FloatAttr.get(part, float("nan")))
    if isinstance(et, ir.ComplexType):
        nan = stablehlo.ComplexOp(nan, nan).result
    return rw.broadcast(nan, t.shape)


def _prepend_unsharded_dim(sharding: ir.Attribute) -> ir.Attribute:
    """#sdy.sharding of a result -> the same for its history, with a new unsharded step axis first."""
    t = sdy.TensorShardingAttr(sharding)
    step_axis = sdy.DimensionShardingAttr.get([], True)
    return sdy.TensorShardingAttr.get(t.mesh_or_ref, [step_axis, *t.dimension_shardings], t.replicated_axes,
                                      t.unreduced_axes)


def _clone_as_body(f: func.FuncOp) -> None:
    with ir.InsertionPoint(f.operation):
        body = f.operation.clone().opview
    make_private(body, BODY)

