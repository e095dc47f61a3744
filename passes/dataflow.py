"""A read-only Python view of one block's dataflow, for analyses that visit every op many times.

The MLIR bindings answer "what are this op's operands" through a C++ call each time, and an
op's Python handle is not stable as a dict key while the IR changes. `Dataflow` reads a block
once into integer ids: ops are numbered in program order, values are numbered (the block's
arguments first, then each op's results), and each op gets an interned structural signature:
its name, attributes, operand and result types and, for ops with regions, the regions' contents
with their values numbered locally. Two ops with the same signature compute the same function of
their operands. A value that a region uses from outside its op counts as one more operand of the
op (so two ops are only alike when they capture alike values too).

`common_subexpressions` merges ops of a block that compute the same signature on the same
operands (an MLIR ``cse`` restricted to side-effect-free ops), reading the block through a
`Dataflow`.
"""
from dataclasses import dataclass, field

from jaxlib.mlir import ir

from .dead_code import has_side_effects

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

    @classmethod
    def of(cls, block: ir.Block) -> "Dataflow":
        g = cls(block)
        texts: dict = {}      # type or attribute -> its text: printing is most of the reading
        types: list = []      # value id -> its type's text
        for a in block.arguments:
            types.append(_text(a.type, texts))
            g._value(a, ARG)
        id_of, users = g.id_of, g.users
        for n, view in enumerate(block.operations):
            op = view.operation
            direct = tuple([id_of[v] for v in op.operands])
            results = []
            for r in op.results:
                types.append(_text(r.type, texts))
                results.append(g._value(r, n))
            captured: list = []
            key = _signature(op, captured, texts, types=(tuple([types[v] for v in direct]), tuple([types[r] for r in results])))
            g.ops.append(op)
            g.signature.append(g.signatures.setdefault(key, len(g.signatures)))
            operands = direct + tuple([id_of[v] for v in captured]) if captured else direct
            g.operands.append(operands)
            for k, v in enumerate(operands):
                users[v].append((n, k))
            g.results.append(tuple(results))
        return g

    def _value(self, value: ir.Value, owner: int) -> int:
        i = len(self.values)
        self.values.append(value)
        self.owner.append(owner)
        self.users.append([])
        self.id_of[value] = i
        return i

    def _merged(self, gone: set, rename: list) -> "Dataflow":
        """The Dataflow of the block after the ops `gone` were erased, uses of values renamed by
        `rename` (value id -> value id), as `Dataflow.of` reads it, without reading the block again;
        read again where an op's region captures two values that became one (its signature changes)."""
        direct = {n: len(self.ops[n].operands) for n, operands in enumerate(self.operands)
                  if n not in gone and any(rename[v] != v for v in operands)}
        if any(len({rename[v] for v in self.operands[n][k:]}) < len(self.operands[n]) - k for n, k in direct.items()):
            return Dataflow.of(self.block)
        keep = [n for n in range(len(self.ops)) if n not in gone]
        new_op = {n: i for i, n in enumerate(keep)}
        values = [v for v, o in enumerate(self.owner) if o == ARG or o not in gone]
        new_value = {v: i for i, v in enumerate(values)}
        g = Dataflow(self.block, signatures=self.signatures)
        g.ops = [self.ops[n] for n in keep]
        g.signature = [self.signature[n] for n in keep]
        g.operands = [tuple(new_value[rename[v]] for v in self.operands[n]) for n in keep]
        g.results = [tuple(new_value[v] for v in self.results[n]) for n in keep]
        g.values = [self.values[v] for v in values]
        g.owner = [o if o == ARG else new_op[o] for o in (self.owner[v] for v in values)]
        g.users = [[] for _ in values]
        for n, operands in enumerate(g.operands):
            for k, v in enumerate(operands):
                g.users[v].append((n, k))
        g.id_of = {value: i for i, value in enumerate(g.values)}
        return g

    def arg_number(self, value: int) -> int | None:
        """The block argument number of value id `value`, or None for an op result."""
        return value if self.owner[value] == ARG else None

    def nbytes(self, value: int) -> int:
        """Bytes of a statically shaped tensor value (0 for other types)."""
        n = self.sizes.get(value)
        if n is None:
            n = self.sizes[value] = tensor_bytes(self.values[value].type)
        return n


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
               types: tuple | None = None) -> tuple:
    """(name, attributes, operand types, result types, regions) of `op`; the regions' ops are
    numbered locally (`outer` maps values defined in enclosing regions of the same top-level op);
    values from outside the top-level op are appended to `captured` and referred to by position.
    `types`: the operand and result types' texts, where the caller has them."""
    attrs = op.attributes
    named = tuple(sorted((a.name, _text(a.attr, texts)) for a in (attrs[i] for i in range(len(attrs)))))
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
                        if v not in captured:
                            captured.append(v)
                        refs.append(("outer", captured.index(v)))
                body.append((_signature(inner, captured, texts, local), tuple(refs)))
                for r in inner.results:
                    local[r] = len(local)
            blocks.append((tuple(_text(a.type, texts) for a in block.arguments), tuple(body)))
        regions.append(tuple(blocks))
    return (*key, tuple(regions))


def common_subexpressions(g: Dataflow, pure_callees=frozenset()) -> Dataflow:
    """Merge the side-effect-free ops of `g`'s block that repeat an earlier op's signature on the same
    operands: uses of the later op's results go to the earlier one's, and the later op is erased.
    Returns the block's `Dataflow` after (`g` no longer describes it). Exact: the merged op computed
    the same function of the same values."""
    seen: dict = {}
    rename = list(range(len(g.values)))       # value id -> the value id it is merged into
    merged = []
    for n, op in enumerate(g.ops):
        if not g.results[n] or has_side_effects(op, pure_callees):
            continue
        first = seen.setdefault((g.signature[n], tuple(rename[v] for v in g.operands[n])), n)
        if first == n:
            continue
        for mine, theirs in zip(g.results[n], g.results[first]):
            rename[mine] = theirs
        merged.append(n)
    for n in merged:
        for mine in g.results[n]:
            g.values[mine].replace_all_uses_with(g.values[rename[mine]])
    for n in reversed(merged):
        g.ops[n].erase()
    return g._merged(set(merged), rename) if merged else g
