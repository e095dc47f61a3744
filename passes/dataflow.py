"""A read-only Python view of one block's dataflow, for analyses that visit every op many times.

The MLIR bindings answer "what are this op's operands" through a C++ call each time, and an
op's Python handle is not stable as a dict key while the IR changes. `Dataflow` reads a block
once into integer ids: ops are numbered in program order, values are numbered (the block's
arguments first, then each op's results), and each op gets an interned structural signature:
its name, attributes, operand and result types and, for ops with regions, the regions' contents
with their values numbered locally. Two ops with the same signature compute the same function of
their operands. A value that a region uses from outside its op counts as one more operand of the
op (so two ops are only alike when they capture alike values too). A ``func.call`` is named in its
signature by its callee's body, not its name (`callee_classes`): jax gives each traced copy of a
function (a ``fori_loop``'s body in every layer) a name of its own.

``Dataflow.of(block, pure_callees)`` reads the block as common-subexpression elimination would leave
it, without editing it: an op free of effects (`dead_code.has_side_effects`; calls of the functions
`pure_callees` names count as free) that computes an earlier op's signature on the same operands is
left out, and its results read as the earlier op's (`merged` lists such ops). A transformation that
acts on that view first makes the block match it (`merge`). The analysis does not merge for good:
measured, the merged ops of a GPT step (its per-layer constants, its causal mask call) change the
last bits XLA computes (a parameter leaf in 1 ulp, 8 of 1024 elements), so a step that no pass
rewrites must reach XLA as traced.
"""
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from jaxlib.mlir import ir

from .dead_code import has_side_effects
from .functions import enclosing_module, module_functions

ARG = -1   # `Dataflow.owner` of a block argument


@dataclass
class Dataflow:
    """Ops and values of one block, by integer id (see the module docstring)."""

    block: ir.Block
    ops: list = field(default_factory=list)             # op id -> ir.Operation
    signature: list = field(default_factory=list)       # op id -> interned signature id
    operands: list = field(default_factory=list)        # op id -> tuple of value ids (captured ones last)
    results: list = field(default_factory=list)         # op id -> tuple of value ids
    values: list = field(default_factory=list)          # value id -> ir.Value
    owner: list = field(default_factory=list)           # value id -> op id, or ARG
    users: list = field(default_factory=list)           # value id -> [(op id, operand index)]
    id_of: dict = field(default_factory=dict)           # ir.Value -> value id
    signatures: dict = field(default_factory=dict)      # signature tuple -> id
    sizes: dict = field(default_factory=dict)           # value id -> `nbytes`, once asked
    merged: list = field(default_factory=list)          # (op left out, the value ids its results read as)
    facts: dict = field(default_factory=dict)           # (fact, value id) -> its answer, once asked (`cached`)

    @classmethod
    def of(cls, block: ir.Block, pure_callees: frozenset | None = None, outside=()) -> "Dataflow":
        """The block's dataflow; with `pure_callees` (not None), as if alike ops were merged (see the
        module docstring). A value the block reads from outside it (a loop body's captured values;
        `outside` names some in advance) is numbered like a block argument (owner `ARG`), after them."""
        g = cls(block)
        texts: dict = callee_classes(enclosing_module(block.owner.operation))   # also: a call's callee -> its class

        types: list = []      # value id -> its type's text
        id_of, users = g.id_of, g.users

        def vid(v: ir.Value) -> int:
            i = id_of.get(v)
            if i is None:
                types.append(_text(v.type, texts))
                i = g._value(v, ARG)
            return i

        for v in [*block.arguments, *outside]:
            vid(v)
        first: dict = {}      # (signature id, operands) -> op id, for the merge
        for view in block.operations:
            op = view.operation
            n = len(g.ops)
            direct = tuple([vid(v) for v in op.operands])
            op_results = list(op.results)
            result_types = tuple([_text(r.type, texts) for r in op_results])
            captured: list = []
            key = _signature(op, captured, texts, types=(tuple([types[v] for v in direct]), result_types),
                             canonical=lambda v: g.values[vid(v)])
            signature = g.signatures.setdefault(key, len(g.signatures))
            operands = direct + tuple([id_of[v] for v in captured]) if captured else direct
            if pure_callees is not None and op.results and not has_side_effects(op, pure_callees):
                earlier = first.setdefault((signature, operands), n)
                if earlier != n:
                    g.merged.append((op, g.results[earlier]))
                    for r, same in zip(op.results, g.results[earlier]):
                        id_of[r] = same
                    continue
            results = []
            for r, t in zip(op_results, result_types):
                types.append(t)
                results.append(g._value(r, n))
            g.ops.append(op)
            g.signature.append(signature)
            g.operands.append(operands)
            for k, v in enumerate(operands):
                users[v].append((n, k))
            g.results.append(tuple(results))
        return g

    def merge(self) -> None:
        """Make the block what this view reads: the `merged` ops' uses read the values they merged
        into, and the ops are erased (`erase`)."""
        for op, same in self.merged:
            for r, v in zip(op.results, same):
                r.replace_all_uses_with(self.values[v])
        for op, _ in reversed(self.merged):
            self.erase(op)
        self.merged = []

    def erase(self, op: ir.Operation) -> None:
        """Erase `op` and forget its results: `id_of` holds only values of ops alive. MLIR reuses an
        erased op's memory for the ops built after it, and an `ir.Value` is equal to (and hashes as)
        any other at the same address, so a value built later would otherwise find the erased one's id.
        A transformation erases every op this view numbered through here while it uses the view."""
        for r in op.results:
            self.id_of.pop(r, None)
        self.facts.clear()
        op.erase()

    def cached(self, fact: Callable[["Dataflow", int], Any], value: int) -> Any:
        """``fact(self, value)``, asked once: a fact of the IR around a value that analyses ask again and
        again (which slice of which buffer it is). The answers hold while the IR stays as the view read it;
        `erase` forgets them, but a rewrite that only adds ops or redirects uses must ask nothing after it."""
        key = (fact, value)
        if key not in self.facts:
            self.facts[key] = fact(self, value)
        return self.facts[key]

    def _value(self, value: ir.Value, owner: int) -> int:
        i = len(self.values)
        self.values.append(value)
        self.owner.append(owner)
        self.users.append([])
        self.id_of[value] = i
        return i

    def arg_number(self, value: int) -> int | None:
        """The block argument number of value id `value`, or None for an op result or a value from outside."""
        return value if value < len(self.block.arguments) else None

    def nbytes(self, value: int) -> int:
        """Bytes of a statically shaped tensor value (0 for other types)."""
        n = self.sizes.get(value)
        if n is None:
            n = self.sizes[value] = tensor_bytes(self.values[value].type)
        return n


def callee_classes(module_op: ir.Operation) -> dict:
    """callee attribute of a ``func.call`` -> the attribute naming the first function of the module
    whose body is the same (the functions' texts, their names left out and the calls in them named by
    class, compared), to stand for it in op signatures; ``@main`` is nobody's callee."""
    functions = {f.sym_name.value: f for f in module_functions(module_op) if f.sym_name.value != "main"}
    names: dict = {name: name for name in functions}
    texts: dict = {}

    def by_class(m: re.Match) -> str:
        return "@" + names.get(m[1], m[1])

    while True:
        first: dict = {}
        new = {}
        for name, f in functions.items():
            text = _CALLEE.sub(by_class, texts.get(name) or f.operation.get_asm(use_local_scope=True, assume_verified=True))
            texts[name] = text
            new[name] = first.setdefault(text.replace("@" + names[name], "@", 1), name)
        if new == names:
            return {ir.FlatSymbolRefAttr.get(name): str(ir.FlatSymbolRefAttr.get(cls)) for name, cls in names.items()}
        names = new


_CALLEE = re.compile(r"@([A-Za-z0-9_.$-]+)")


def tensor_bytes(t: ir.Type) -> int:
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
        return 0
    n = 1
    for d in t.shape:
        n *= d
    width = t.element_type.width if hasattr(t.element_type, "width") else 32
    return n * max(width, 8) // 8


def _text(x, texts: dict) -> str:
    """str(x) of a type or an attribute, printed once per `texts` (they are uniqued: equal ones are one)."""
    s = texts.get(x)
    if s is None:
        s = texts[x] = str(x)
    return s


def _signature(op: ir.Operation, captured: list, texts: dict, outer: dict | None = None,
               types: tuple | None = None, canonical=lambda v: v) -> tuple:
    """(name, attributes, operand types, result types, regions) of `op`; the regions' ops are
    numbered locally (`outer` maps values defined in enclosing regions of the same top-level op);
    values from outside the top-level op are appended to `captured` (as `canonical` maps them: the
    value a merged one reads as) and referred to by position. `types`: the operand and result
    types' texts, where the caller has them."""
    attrs = op.attributes
    named = tuple(sorted([(name, _text(attrs[name], texts)) for name in attrs])) if len(attrs) else ()
    key: tuple = (op.name, named, *(types or (tuple(_text(v.type, texts) for v in op.operands),
                                              tuple(_text(r.type, texts) for r in op.results))))
    if len(op.regions) == 0:
        return key
    local = dict(outer or {})
    regions = []
    for region in op.regions:
        blocks = []
        for block in region.blocks:
            for a in block.arguments:
                local[a] = len(local)
            body = []
            for view in block.operations:
                inner = view.operation
                refs = []
                for v in inner.operands:
                    if v in local:
                        refs.append(("local", local[v]))
                    else:
                        v = canonical(v)
                        if v not in captured:
                            captured.append(v)
                        refs.append(("outer", captured.index(v)))
                body.append((_signature(inner, captured, texts, local, canonical=canonical), tuple(refs)))
                for r in inner.results:
                    local[r] = len(local)
            blocks.append((tuple(_text(a.type, texts) for a in block.arguments), tuple(body)))
        regions.append(tuple(blocks))
    return (*key, tuple(regions))
