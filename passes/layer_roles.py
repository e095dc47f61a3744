"""Which ops of a step are the same work done once per layer: the analysis behind roll-layers.

Given a `Dataflow` of ``@main``'s block (after common-subexpression elimination, so per-layer copies
of a constant are one value) and a candidate `layer_runs.Run` of L layers, `analyze` finds *roles*:
an L-tuple of ops, one per layer (its *positions* 0 .. L-1), that compute alike. It works in three
steps, each checked by the next:

1. **Shift map** (discovery). The layers' leaves map layer l to layer l + 1 (the seeds); the map
   grows along uses (an op using a mapped value at operand k maps to the op using its image at
   operand k with the same signature, the k-th such use to the k-th) and then along operands (two
   unmapped producers of corresponding operands, with equal signatures), as LLVM's loop reroller
   and luminal's loop rolling match the iterations of an unrolled loop. Chains of the map are
   candidate roles.
2. **Positions.** A chain of exactly L ops is positions 0 .. L-1. A longer one also took in an op
   before the first layer or after the last (the map does not know where the run ends: the head's
   first LayerNorm looks like the next block's); of its windows of L ops, the one whose values
   cross fewest bytes between positions and to the rest of the program is kept (a block's input
   is carried into the next layer, not its two summands), chain by chain, a chain whose windows
   tie after the chains that follow it (`_cut_in_order`). The ops of shorter chains, placed after,
   count as neither (counted as the rest of the program, those of a decoder's first layer, which
   computes no input gradient, made the encoder's window of a chain through both stacks' backward
   ops the cheaper). A chain of L - 1 ops not anchored at
   position 0 is positions 1 .. L-1 with no op at position 0 (a *dead first position*, below);
   shorter chains are not roles. A chain of exactly L ops may be such a chain joined by one alike op
   after the run (a layer norm's ``2 (x - mean)`` by the MSE loss's ``2 (x - y)``): where it runs
   forward and its first op reads a value of position 1, it and the chains that read it are placed
   one late if fewer bytes then cross (`_one_late`).
3. **Validation** (exact). Every operand of a role must be, at every position l, one of:
   the layer's own leaf (`Seed`); one value the same for all positions, computed outside the run
   (`Invariant`); a value computed outside the run, another at each position (`PerLayer`: a
   per-layer constant such as a depth-scaled residual's ``1 / sqrt(2 (l + 1))``); the result of
   another role at the same position (`Internal`); the result of a role at position l - 1, and at
   position 0 a value from outside (`Carry`, forward: the block's input); or at position l + 1, and at
   position L - 1 a value from outside (`Carry`, backward: the cotangent the block's backward pass
   receives). A role with any other operand is dropped, and so are the roles that read it, until
   every remaining role is valid. Valid roles joined to none that reads the run's leaves (`_apart`:
   another stack's work) are then left out, and the rest validated again.

A dead first position: the first layer of a network that reads the data has no input gradient, so
the ops that compute it elsewhere (the transposed product, the residual's sum) are missing there.
Such a role's classes are read at positions 1 .. L-1, and at position 0 it reads what they name
there (its layer's leaf, the value at position 0 of another role, the next layer's cotangent, and for
a forward carry, the layer's input, the run's first value of that carry, which the roles with an op at
position 0 show: `_carried_in`; a normalization's input gradient reads it); a per-layer value, whose
position-0 operand the program does not show, drops it.
Its position-0 value then has no reader in the program: a role whose op exists at position 0 reads
real values only (a class naming a role with no op there is not found), no value is exported from a
position without an op, and a backward carry's value at position 0 leaves the run unread. So the
op runs there and its result is dropped: dead work, no changed value.

The valid roles then compute, position by position, exactly what the unrolled program computes:
any rewrite that runs role r's op at position l on the operands the classification names reads
the same values as the original op. `roll_layers` builds its loops from that.
"""
import bisect
from collections import Counter, deque
from dataclasses import dataclass, field

from .dataflow import ARG, Dataflow
from .layer_runs import Run
from .locations import described


@dataclass(frozen=True)
class Seed:
    leaf: int            # index into `Roles.seeds`


@dataclass(frozen=True)
class Invariant:
    value: int           # value id, the same at every position


@dataclass(frozen=True)
class PerLayer:
    values: tuple        # value id at each position, each computed outside the run


@dataclass(frozen=True)
class Internal:
    role: int
    result: int          # result index of that role's op


@dataclass(frozen=True)
class Carry:
    role: int
    result: int
    init: int            # value id from outside the run, read at the first position of the carry's direction
    backward: bool       # read from position l + 1 (init at L - 1), else from l - 1 (init at 0)


Operand = Seed | Invariant | PerLayer | Internal | Carry


@dataclass
class Roles:
    """The valid roles of one run; see the module docstring."""

    length: int
    seeds: list                          # per seed leaf: its value id at each position (a block argument)
    ops: list = field(default_factory=list)          # role -> op id at each position (None: a dead first position)
    operands: list = field(default_factory=list)     # role -> [Operand] per operand index (None: not classified yet)
    role_of: dict = field(default_factory=dict)      # op id -> (role, position)
    dropped: list = field(default_factory=list)      # why chains and roles were dropped (for the report)
    odd: Counter = field(default_factory=Counter)    # position -> operands that fit no class for want of it
    alike: int = 0                       # the roles valid before those of another stack are left out (`_apart`)

    def template(self, role: int) -> int:
        """The op id of `role` at its first position with an op: what a loop body runs again."""
        ops = self.ops[role]
        return ops[0] if ops[0] is not None else ops[1]

    def order(self, role: int) -> int:
        """Where `role` runs in a layer: the program position of its op at position 1 (every role has
        one there; at position 0 a role may have none)."""
        return self.ops[role][1]

    def reads(self) -> list[set]:
        """Per role, the roles whose values it reads (at its position, or carried from a neighbouring one)."""
        return [{c.role for c in found if isinstance(c, (Internal, Carry))} for found in self.operands]

    def value(self, g: Dataflow, role: int, result: int, position: int | None = None) -> int:
        """The value id of `role`'s `result` at `position` (default: the template's)."""
        return g.results[self.template(role) if position is None else self.ops[role][position]][result]

    def drop(self, g: Dataflow, bad: set, why: str) -> None:
        """Drop the roles `bad` (their ops stay as they are, outside the loops) and the roles that
        then have an operand of no class."""
        self.remove(g, bad, why)
        _validate(g, self)

    def prune(self, unneeded: set) -> None:
        """Remove the roles `unneeded`, which no role kept reads, at its layer or carried (their ops stay as
        they are: not a failure to match, so not in `dropped`)."""
        self._without(unneeded)

    def remove(self, g: Dataflow, bad: set, why: str) -> None:
        """Remove the roles `bad`, saying `why` in `dropped`."""
        self.dropped += [f"{_describe(g, self.template(r))}: {why}" for r in sorted(bad)]
        self._without(bad)

    def _without(self, bad: set) -> None:
        """The roles less `bad`, renumbered; the operand classes of a role that read one of them are
        unknown again (None: `_validate` classifies them), the others' stay. A class names the one role
        its values come from and is found from where the values' ops are placed, which removing other
        roles does not change."""
        keep = [r for r in range(len(self.ops)) if r not in bad]
        new = {r: n for n, r in enumerate(keep)}
        self.ops = [self.ops[r] for r in keep]
        self.role_of = _placed(self.ops)
        self.operands = [None if found is None or any(isinstance(c, (Internal, Carry)) and c.role in bad for c in found)
                         else [_renumbered(c, new) for c in found] for found in map(self.operands.__getitem__, keep)]


def analyze(g: Dataflow, run: Run, leaves: list[int]) -> "Layout":
    """The ops of `run` in `g` placed at its positions (steps 1 and 2); `Layout.roles` validates the
    run or a part of it (step 3). `leaves[leaf]`: the value id of a state leaf."""
    length = run.length
    seeds = [[leaves[per_layer[layer][suffix]] for layer in range(length)]
             for _, per_layer in sorted(run.families.items()) for suffix in sorted(per_layer[0])]
    placed, dropped = _position(g, length, seeds, _chains(g, seeds))
    return Layout(length, seeds, placed, dropped)


@dataclass
class Layout:
    """The shift map's chains of one run placed at its positions: per chain, its ops and the positions
    of its first op that fit (one, but for a chain shorter than the run whose place program order
    leaves open: the ops of one layer's boundary, ``act(x) @ w`` after the layer before's ``@ w``,
    belong to either layer); `dropped` says which chains could not be placed."""

    length: int
    seeds: list
    placed: list         # (chain, [offset, ...]): the chain's k-th op at position k + offset
    dropped: list

    def roles(self, g: Dataflow, first: int = 0, last: int = 0) -> Roles:
        """The valid roles of the run without its first `first` and last `last` layers (an unlike stem or
        head block, left as it is): a chain with an op at each of the part's positions, or at each but
        its first (a dead first position), is a role, at the first of its offsets that gives it that;
        one with fewer is not. Valid roles that are another stack's work (`_apart`) are then left out and
        the others validated again: what read them reads outside values (an encoder's output, read by
        every layer of a decoder, is one value from outside the decoder's run, not its encoder role's
        value at one position)."""
        apart: set = set()          # the ops, per position, of the chains left out
        roles = self._valid(g, first, last, apart)
        alike = len(roles.ops)
        while other := _apart(roles):
            apart |= {tuple(roles.ops[r]) for r in other}
            roles = self._valid(g, first, last, apart)
        roles.alike = alike
        return roles

    def _valid(self, g: Dataflow, first: int, last: int, apart: set) -> Roles:
        """`roles` less `_apart`'s step: the chains `apart` (their ops per position) left out."""
        lo, hi = first, self.length - last
        n = hi - lo
        roles = Roles(n, [per[lo:hi] for per in self.seeds], dropped=list(self.dropped))
        for chain, offsets in self.placed:
            parts = [([None] * t + chain + [None] * (self.length - len(chain) - t))[lo:hi] for t in offsets]
            have = [sum(o is not None for o in part) for part in parts]
            fit = [part for part, k in zip(parts, have) if k == n or k == n - 1 and part[0] is None]
            if fit and tuple(fit[0]) not in apart:
                roles.ops.append(fit[0])
            elif not fit and max(have):
                part = parts[have.index(max(have))]
                roles.dropped.append(f"{_describe(g, next(o for o in part if o is not None))} has its like in "
                                     f"{max(have)} of the {n} layers")
        roles.role_of = _placed(roles.ops)
        roles.operands = [None] * len(roles.ops)
        _validate(g, roles)
        return roles


# ---- 1. the shift map ------------------------------------------------------------------------
def _chains(g: Dataflow, seeds: list) -> list[list[int]]:
    """Chains of the shift map (op ids, layer l's op before layer l + 1's)."""
    next_op: dict[int, int] = {}
    prev_op: dict[int, int] = {}
    next_value: dict[int, int] = {}
    work: deque = deque()
    producers: deque = deque()
    for chain in seeds:
        for a, b in zip(chain, chain[1:]):
            next_value[a] = b
            work.append((a, b))

    def link(o: int, p: int) -> None:
        if o == p or o in next_op or p in prev_op or g.signature[o] != g.signature[p]:
            return
        next_op[o], prev_op[p] = p, o
        for r, s in zip(g.results[o], g.results[p]):
            if r not in next_value:
                next_value[r] = s
                work.append((r, s))
        for a, b in zip(g.operands[o], g.operands[p]):
            pa, pb = g.owner[a], g.owner[b]
            if a != b and a not in next_value and pa != ARG and pb != ARG and \
                    g.results[pa].index(a) == g.results[pb].index(b):
                producers.append((pa, pb))

    while work or producers:
        while work:
            v, w = work.popleft()
            mine, theirs = _uses_by_kind(g, v), _uses_by_kind(g, w)
            for kind, ops in mine.items():
                other = theirs.get(kind, ())
                if len(other) == len(ops):
                    for o, p in zip(ops, other):
                        link(o, p)
        if producers:
            o, p = producers.popleft()
            if o not in next_op and p not in prev_op:
                link(o, p)
    chains = []
    for start in next_op:
        if start in prev_op:
            continue
        chain = [start]
        while chain[-1] in next_op and len(chain) <= len(next_op):
            chain.append(next_op[chain[-1]])
        chains.append(chain)
    return chains


def _uses_by_kind(g: Dataflow, v: int) -> dict:
    """(signature, operand index) -> the ops using `v` so, in program order (each op once per kind)."""
    out: dict = {}
    for op, k in g.users[v]:
        ops = out.setdefault((g.signature[op], k), [])
        if not ops or ops[-1] != op:
            ops.append(op)
    return out


# ---- 2. positions ----------------------------------------------------------------------------
def _position(g: Dataflow, length: int, seeds: list, chains: list) -> tuple[list, list]:
    """(`Layout.placed`; why chains were not placed): exact-length chains as they are, longer ones cut
    to their cheapest window, shorter ones (a layer unlike the others has no op of theirs) where their
    ops read their layers' leaves, else where program order puts them between the placed ops (a
    layer's forward ops run after the layer before's, its backward ops before): every such place,
    the fewest bytes crossing first (`_short_fits`)."""
    seed_layer = {v: l for per in seeds for l, v in enumerate(per)}

    def anchors(chain: list) -> set:
        """The position of the chain's first op, by each op that reads its layer's own leaf."""
        return {seed_layer[v] - k for k, o in enumerate(chain) for v in g.operands[o] if v in seed_layer}

    exact = [chain for chain in chains if len(chain) == length]
    long = [chain for chain in chains if len(chain) > length]
    short = [chain for chain in chains if len(chain) < length]
    placed: dict = {o: l for chain in exact for l, o in enumerate(chain)}
    for chain in long + short:       # short ones too, until the long ones are cut: not yet placed, not outside
        placed.update((o, _UNPLACED) for o in chain)
    start: dict[int, int] = {}

    def cut(i: int, s: int) -> None:
        start[i] = s
        placed.update((o, k - s if 0 <= k - s < length else _OUTSIDE) for k, o in enumerate(long[i]))

    for i, chain in enumerate(long):      # a chain whose op reads layer l's own leaf has that op at l; its
        found = {-a for a in anchors(chain)}     # first at position 1: the run's first layer lacks it (it reads
        if len(found) == 1 and -1 <= min(found) <= len(chain) - length:     # the data), the chain goes on past
            cut(i, found.pop())                                             # the run (into a stack after it)
    binary = [i for i in range(len(long)) if i not in start and len(long[i]) == length + 1]
    for i, s in _cut_binary(g, long, binary, placed, length).items():
        cut(i, s)
    _cut_in_order(g, long, [i for i in range(len(long)) if i not in start], placed, length, cut)
    late = _one_late(g, exact, [anchors(chain) for chain in exact], placed, length)
    for i in late:          # positions 1 .. L-1 (a dead first position), its last op after the run
        placed.update((o, k + 1 if k + 1 < length else _OUTSIDE) for k, o in enumerate(exact[i]))
    out = [(chain[:-1], [1]) if i in late else (chain, [0]) for i, chain in enumerate(exact)] + \
        [(chain[max(start[i], 0):start[i] + length], [max(-start[i], 0)]) for i, chain in enumerate(long)]
    for chain in short:
        for o in chain:
            del placed[o]
    dropped = []
    anchored = {}
    for i, chain in enumerate(short):
        found = anchors(chain)
        if len(found) == 1 and 0 <= min(found) <= length - len(chain):
            anchored[i] = found.pop()
            placed.update((o, anchored[i] + k) for k, o in enumerate(chain))
    order = sorted((o, l) for o, l in placed.items() if l is not _UNPLACED and l >= 0)
    fits = _short_fits(g, short, anchored, {i: _between(order, chain, length) for i, chain in enumerate(short)},
                       placed, length)
    for i, chain in enumerate(short):
        if fits[i]:
            out.append((chain, fits[i]))
        else:
            dropped.append(f"{_describe(g, chain[0])} has its like in {len(chain)} of the {length} layers")
    return out, dropped


def _one_late(g: Dataflow, exact: list, anchors: list, placed: dict, length: int) -> set[int]:
    """The chains of exactly L ops (`exact`, at positions 0 .. L-1 in `placed`, the longer chains cut;
    `anchors`: each one's `_position` anchors) that start at position 1 instead: ops of the input
    gradient, which the run's first layer lacks where it reads the data, joined by one alike op after the
    run (a mean-subtracting norm's ``2 (x - mean)`` by the MSE loss's ``2 (x - y)`` after the last
    layer), their last op then outside.
    Such a chain runs forward (each op after the one before it, in program order) and its first op reads
    a value of position 1 (the layer's ``x - mean``), which no forward op of position 0 can (a backward op
    reads the cotangent from position 1: a carry); the chains that read its values are one late with it.
    So the candidates are the chains not placed by a leaf that program order lets start at 1 (between the
    ops of the chains placed by their leaves: `_between`), forward with a first op that reads a value at
    position 1, or with a first op that reads a candidate's; each is a chain of L + 1 ops whose first is
    missing, cut at 0 (one late) or 1 (as found) by `_cut_binary`."""
    skeleton = sorted((o, l) for chain, found in zip(exact, anchors) if found == {0} for l, o in enumerate(chain))
    first = {chain[0]: i for i, (chain, found) in enumerate(zip(exact, anchors))
             if not found and 1 in _between(skeleton, chain[:-1], length)}
    todo = [i for o, i in first.items()
            if o < exact[i][1] and any(placed.get(g.owner[v]) == 1 for v in g.operands[o])]
    candidates = set(todo)
    while todo:
        for v in g.results[exact[todo.pop()][0]]:
            for q, _ in g.users[v]:
                if (i := first.get(q)) is not None and i not in candidates:
                    candidates.add(i)
                    todo.append(i)
    order = sorted(candidates)
    cuts = _cut_binary(g, [[None, *exact[i]] for i in order], list(range(len(order))), placed, length, missing=True)
    return {order[n] for n, s in cuts.items() if s == 0}


def _cut_in_order(g: Dataflow, long: list, rest: list, placed: dict, length: int, cut) -> None:
    """``cut(i, start)`` each chain `rest` (indices into `long`) at the window that makes the fewest bytes cross
    (`_crossing`), in order; a chain whose cheapest windows tie waits for the chains after it, and where all
    wait, the first takes its first cheapest. Two stacks of the same block: every chain runs through both,
    and the few that read the run's leaves are placed first (`_position`); taken in order, the chains next to
    them are then placed by them, and the others, tied until their neighbours are, follow."""
    counts: dict = {}                  # `_uses_at` of `placed` as it stands: emptied by every cut
    while rest:
        waiting: list = []
        first = None                   # the first waiting chain and its first cheapest window
        for i in rest:
            windows = range(len(long[i]) - length + 1)
            cost = sorted((_crossing(g, placed, long[i], s, length, counts), s) for s in windows)
            if len(cost) > 1 and cost[0][0] == cost[1][0]:
                waiting.append(i)
                first = first or (i, cost[0][1])
            else:
                cut(i, cost[0][1])
                counts.clear()
        if first is not None and waiting == rest:
            cut(*first)
            counts.clear()
            waiting = rest[1:]
        rest = waiting


def _short_fits(g: Dataflow, short: list, anchored: dict, between: dict, placed: dict, length: int) -> dict:
    """Chain index -> the offsets of each short chain, best first: an anchored chain's one; else the offsets
    program order allows (`between`), the fewest bytes crossing first (then the lowest). A chain may touch
    no placed op, only other short chains (a layer norm's backward where the run's first layer computes no
    input gradient): its offsets all cost the same until those are placed. So chains are placed in rounds, each
    placing (into `placed`) the chains whose best offset costs strictly less than their next, until a round
    places none; the others keep their order by cost as it then is."""
    fits = {i: [t] for i, t in anchored.items()}
    pending = [i for i in range(len(short)) if i not in anchored]
    while pending:
        decided = []
        counts: dict = {}             # `_uses_at` of `placed`, which a round leaves as it is until its end
        for i in pending:
            cost = {t: _crossing(g, placed, short[i], -t, length, counts) for t in between[i]}
            fits[i] = sorted(cost, key=lambda t: (cost[t], t))
            if fits[i] and (len(fits[i]) == 1 or cost[fits[i][0]] < cost[fits[i][1]]):
                decided.append(i)
        if not decided:
            break
        for i in decided:
            placed.update((o, fits[i][0] + k) for k, o in enumerate(short[i]))
        pending = [i for i in pending if i not in decided]
    return fits


def _between(order: list, chain: list, length: int) -> list[int]:
    """The offsets t (the chain's k-th op at position k + t) that put each of `chain`'s ops between
    the positions of the placed ops next to it in program order (`order`: (op id, position), sorted)."""
    ids = [o for o, _ in order]
    fits = []
    for t in range(length - len(chain) + 1):
        for k, o in enumerate(chain):
            at = bisect.bisect_left(ids, o)
            near = [order[j][1] for j in (at - 1, at) if 0 <= j < len(order)]
            if near and not min(near) <= k + t <= max(near):
                break
        else:
            fits.append(t)
    return fits


def _placed(ops: list) -> dict:
    """op id -> (role, position), for the roles' ops `ops`."""
    return {o: (r, l) for r, per in enumerate(ops) for l, o in enumerate(per) if o is not None}


_OUTSIDE, _UNPLACED = -1, None


def _cut_binary(g: Dataflow, long: list, chains: list, placed: dict, length: int,
                missing: bool = False) -> dict[int, int]:
    """Windows for chains of L + 1 ops (`chains`, indices into `long`): each is cut at its start (0: its
    first op at position 0) or after its first op (1), all together, so that the fewest bytes cross
    between positions (a tie: 0): a minimum cut, as PyTorch's partitioner cuts a graph into saved and
    recomputed. `missing`: each chain's first op is None, missing (`_one_late`: a tie is then 1, and only
    values crossing `within` the run count).

    Chain c cut at s puts its k-th op at position k - s. Its values read by (or read from) placed ops
    cost the same whatever the other chains do (the terminal edges); a value between the k-th ops of
    two chains crosses when the two are cut differently, unless a placed op reads it at the reader's
    position already (an edge between them, one way or both), counted at the boundaries between two
    layers (0 < k < L), where every layer's boundary is alike. Values between the k-th op of one chain
    and another position of the other are left out of the model."""
    index = {i: n for n, i in enumerate(chains)}
    chain_of = {o: (i, k) for i in chains for k, o in enumerate(long[i])}
    source, sink = len(chains), len(chains) + 1
    capacity: dict = {}

    def add(a: int, b: int, c: int) -> None:
        if c:
            capacity[a, b] = capacity.get((a, b), 0) + c
            capacity.setdefault((b, a), 0)

    here = {**placed, **{o: _UNPLACED for j in chains for o in long[j]}}
    counts: dict = {}                      # `_uses_at` of `here`
    for i in chains:
        cost = [_crossing(g, here, long[i], s, length, counts, within=missing) for s in (0, 1)]
        add(source, index[i], cost[1] + (not missing))    # on the sink side, i is cut at 1 and pays cost[1]
        add(index[i], sink, cost[0] + missing)            # ... on the source side at 0

    def at(k: int) -> int:
        return k if 0 <= k < length else _OUTSIDE

    for c in chains:                       # c's k-th op reads a value of a's k-th op, at an inner boundary
        for k, o in enumerate(long[c][1:length], start=1):
            for v in set(g.operands[o]):
                p = g.owner[v]
                if p not in chain_of or chain_of[p][1] != k or chain_of[p][0] == c:
                    continue
                a = chain_of[p][0]
                fixed = set(_uses_at(g, here, v, counts)) - {_UNPLACED}
                if at(k - 1) != at(k) and at(k - 1) not in fixed:    # a at 0, c at 1: c reads it a position early
                    add(index[a], index[c], g.nbytes(v))
                if at(k) != at(k - 1) and at(k) not in fixed:        # a at 1, c at 0
                    add(index[c], index[a], g.nbytes(v))
    reachable = _min_cut(capacity, source, sink)
    return {i: 0 if index[i] in reachable else 1 for i in chains}


def _min_cut(capacity: dict, source: int, sink: int) -> set:
    """The nodes on the source side of a minimum source-sink cut (Dinic: augmenting paths along a
    level graph of shortest paths, a phase at a time; the residual graph of any maximum flow leaves
    the same nodes reachable); `capacity` maps (from, to) to a capacity, with both directions present."""
    out: dict = {}
    for a, b in capacity:
        out.setdefault(a, []).append(b)
    flow = dict.fromkeys(capacity, 0)
    while True:
        level = {source: 0}
        queue = deque([source])
        while queue:
            a = queue.popleft()
            for b in out.get(a, ()):
                if b not in level and capacity[a, b] > flow[a, b]:
                    level[b] = level[a] + 1
                    queue.append(b)
        if sink not in level:
            return set(level)
        arc = dict.fromkeys(level, 0)          # the next edge of a node to try in this phase
        while True:
            path = [source]
            while path and path[-1] != sink:
                a = path[-1]
                edges = out.get(a, ())
                while arc[a] < len(edges) and not (level.get(edges[arc[a]]) == level[a] + 1
                                                   and capacity[a, edges[arc[a]]] > flow[a, edges[arc[a]]]):
                    arc[a] += 1
                if arc[a] < len(edges):
                    path.append(edges[arc[a]])
                else:                          # a dead end for this phase
                    path.pop()
                    if path:
                        arc[path[-1]] += 1
            if not path:
                break
            steps = list(zip(path, path[1:]))
            push = min(capacity[e] - flow[e] for e in steps)
            for a, b in steps:
                flow[a, b] += push
                flow[b, a] -= push


def _crossing(g: Dataflow, placed: dict, chain: list, start: int, length: int, counts: dict | None = None,
              within: bool = False) -> int:
    """Bytes of the values that would newly cross between positions (a value read at a position, or
    outside, other than its producer's) if `chain` were cut at `start`, given the ops `placed` so far
    (ops of uncut chains do not count). A value that crosses to a position already is not counted again.
    `counts`: the caller's `_uses_at` cache, while `placed` stays as it is. `within`: only values read at
    one position of the run and computed at another count (`_one_late`: a cut that leaves one op more
    outside the run reads a value from outside at one position fewer, which is no reason to cut there)."""
    mine = {o: (k - start if 0 <= k - start < length else _OUTSIDE) for k, o in enumerate(chain) if o is not None}
    counts = {} if counts is None else counts
    mine_uses: dict = {}                # value -> the chain's ops using it, once per use
    for o in mine:
        for v in g.operands[o]:
            mine_uses.setdefault(v, []).append(o)

    def position(op: int):
        return mine[op] if op in mine else placed.get(op, _OUTSIDE)

    def crosses_already(v: int, to) -> bool:
        """Another op than the chain's reads `v` at position `to`, not its producer's."""
        if to == position(g.owner[v]):
            return False
        return _uses_at(g, placed, v, counts).get(to, 0) > sum(placed.get(q, _OUTSIDE) == to for q in mine_uses.get(v, ()))

    new = set()
    for o, at in mine.items():
        for v in g.operands[o]:
            p = g.owner[v]
            if p != ARG and position(p) is not _UNPLACED and position(p) != at and not crosses_already(v, at) \
                    and not (within and _OUTSIDE in (at, position(p))):
                new.add((v, at))
        for v in g.results[o]:
            for q, _ in g.users[v]:
                to = position(q)
                if to is not _UNPLACED and to != at and not crosses_already(v, to) \
                        and not (within and _OUTSIDE in (at, to)):
                    new.add((v, to))
    return sum(g.nbytes(v) for v, _ in new)


def _uses_at(g: Dataflow, placed: dict, v: int, counts: dict) -> Counter:
    """Position (by `placed`) -> how many uses of value `v` are there; cached in `counts`."""
    found = counts.get(v)
    if found is None:
        found = counts[v] = Counter(placed.get(q, _OUTSIDE) for q, _ in g.users[v])
    return found


def _describe(g: Dataflow, op: int) -> str:
    return described(g.ops[op])


# ---- 3. validation ---------------------------------------------------------------------------
def _validate(g: Dataflow, roles: Roles) -> None:
    """Classify the role operands not classified yet (`Roles.operands`' None: every role's at first, after
    a drop those of the roles that read a dropped one); drop roles with an operand that fits no class,
    until none is left. A class names the one role its values come from, so after a drop only the roles
    reading a dropped role are classified again; the others' classes stay, renumbered."""
    seed_at = {v: (s, l) for s, per in enumerate(roles.seeds) for l, v in enumerate(per)}

    def classes(ops: list) -> list:
        template = ops[0] if ops[0] is not None else ops[1]
        return [_classify(g, roles, seed_at, [None if o is None else g.operands[o][k] for o in ops])
                for k in range(len(g.operands[template]))]

    def classify() -> list:
        stale = [r for r, found in enumerate(roles.operands) if found is None]
        for r in stale:
            roles.operands[r] = classes(roles.ops[r])
        return stale

    shared = _read_everywhere(g, roles)
    if shared:
        roles.remove(g, shared, "one of its values is read at every layer")
    for r in classify():      # where the first failures point (not their knock-on drops)
        for k, c in enumerate(roles.operands[r]):
            if c is None:
                roles.odd.update(_odd_positions(g, roles, seed_at, [None if o is None else g.operands[o][k]
                                                                     for o in roles.ops[r]]))
    while True:
        bad = {r for r, found in enumerate(roles.operands) if any(c is None for c in found)}
        if not bad:
            return
        for r in sorted(bad):
            k = next(k for k, c in enumerate(roles.operands[r]) if c is None)
            roles.dropped.append(f"{_describe(g, roles.template(r))} has its like in {roles.length - 1} of the "
                                 f"{roles.length} layers" if roles.ops[r][0] is None else
                                 f"{_describe(g, roles.template(r))}: its operand {k} is not the same kind of value at "
                                 "every layer")
        roles._without(bad)
        classify()


def _read_everywhere(g: Dataflow, roles: Roles) -> set:
    """Roles computed from outside values only (a per-layer constant) one of whose values a role reads at
    every position: a value the same at every layer cannot be a role's (computed anew per layer in a
    loop), so its role is dropped and its ops stay outside the loops, the readers reading them as
    values from outside (the merged view makes this: one layer's ``broadcast(0.5)``, a per-layer scale,
    is also the constant a GELU reads in every layer)."""
    def from_outside(r: int) -> bool:      # the role's ops read no role's value: a per-layer constant
        return all(g.owner[v] == ARG or g.owner[v] not in roles.role_of for o in roles.ops[r] if o is not None
                   for v in g.operands[o])

    out = set()
    for ops in roles.ops:
        template = ops[0] if ops[0] is not None else ops[1]
        for k in range(len(g.operands[template])):
            values = {g.operands[o][k] for o in ops if o is not None}
            if len(values) == 1 and g.owner[v := values.pop()] != ARG and g.owner[v] in roles.role_of \
                    and from_outside(r := roles.role_of[g.owner[v]][0]):
                out.add(r)
    return out


def _apart(roles: Roles) -> set:
    """The roles that are not this run's work: the groups of roles, joined by the values roles read of each
    other (either way), none of which reads the run's leaves. The shift map's chains reach another stack
    through the stacks' shared residual stream, and where it has as many layers as the run, its chains are
    as long: an encoder's residual adds, tanh and its derivative (an encoder layer's values read per layer),
    seen from a decoder's run whose blocks read the encoder's output; a decoder's bias broadcasts and moment
    decays, seen from the encoder's. They stay as they are, rather than computed in the run's loops and
    exported per layer, and what reads them reads outside values. A block's own work reads its leaves, or
    joins what does: a linear block's backward, which reads none, is read by the update of its leaves."""
    reads = roles.reads()
    near = [set(read) for read in reads]
    for r, read in enumerate(reads):
        for q in read:
            near[q].add(r)
    joined = {r for r, found in enumerate(roles.operands) if any(isinstance(c, Seed) for c in found)}
    work = list(joined)
    while work:
        for q in near[work.pop()] - joined:
            joined.add(q)
            work.append(q)
    return set(range(len(roles.ops))) - joined


def _odd_positions(g: Dataflow, roles: Roles, seed_at: dict, values: list) -> set:
    """The positions at which an operand that fits no class reads another kind of value than at most
    positions (a layer's own leaf, another role's value at the same or a neighbouring position, a value
    from outside), but for the first or last position of a carry, which reads from outside."""
    kinds: dict[int, tuple] = {}
    for l, v in enumerate(values):
        if v is None:
            continue
        at = None if g.owner[v] == ARG else roles.role_of.get(g.owner[v])
        kinds[l] = (("seed", seed_at[v][0], seed_at[v][1] - l) if v in seed_at else
                    ("role", at[0], at[1] - l, g.results[g.owner[v]].index(v)) if at else ("outside", v))
    common: tuple = Counter(kinds.values()).most_common(1)[0][0]
    if common[0] != "role":
        return {l for l, kind in kinds.items() if kind != common} if common[0] == "seed" else set()
    carried_from = {0: -1, roles.length - 1: 1}     # where a carry's first value comes from outside
    return {l for l, kind in kinds.items() if kind != common and not (
        kind[0] == "outside" and carried_from.get(l) == common[2])}


def _renumbered(c: Operand, new: dict) -> Operand:
    if isinstance(c, Internal):
        return Internal(new[c.role], c.result)
    if isinstance(c, Carry):
        return Carry(new[c.role], c.result, c.init, c.backward)
    return c


def _classify(g: Dataflow, roles: Roles, seed_at: dict, values: list) -> Operand | None:
    """The class of one role operand from its value at each position (None at a dead first
    position: the class is read from the others; see the module docstring)."""
    length = roles.length
    dead = values[0] is None
    known = values[1:] if dead else values
    first = known[0]
    if first in seed_at:
        s, l = seed_at[first]
        return Seed(s) if l == int(dead) and all(v == roles.seeds[s][i + dead] for i, v in enumerate(known)) else None
    placed = [None if v is None or g.owner[v] == ARG else roles.role_of.get(g.owner[v]) for v in values]
    if all(p is None for p in placed):
        if any(v in seed_at for v in known):
            return None
        if all(v == first for v in known):
            return Invariant(first)
        if dead or any(g.arg_number(v) is not None for v in values) and g.block.owner.operation.name == "stablehlo.while":
            return None        # a loop body's carried values: stacked anew every trip (a micro-batch's sums)
        return PerLayer(tuple(values))
    # a role's value: the same position, or the previous / next one with an outside value at the end
    r = next(p[0] for p in placed if p is not None)
    v = next(v for v, p in zip(values, placed) if p is not None)
    result = g.results[g.owner[v]].index(v)
    at = [p[1] if p is not None and p[0] == r else None for p in placed]
    if at[dead:] == list(range(dead, length)) and _same_result(g, known, result):
        return Internal(r, result)
    if length > 1 and placed[0] is None and at[1:] == list(range(length - 1)) and _same_result(g, values[1:], result):
        init = _carried_in(g, roles, r, result) if dead else values[0]
        if init is not None:
            return Carry(r, result, init, backward=False)
    if length > 1 and placed[-1] is None and at[dead:-1] == list(range(1 + dead, length)) \
            and _same_result(g, values[dead:-1], result):
        return Carry(r, result, values[-1], backward=True)
    return None


def _carried_in(g: Dataflow, roles: Roles, role: int, result: int) -> int | None:
    """The value from outside the run that a role with an op at position 0 reads there where it reads `role`'s
    `result` of the position before at the others: the run's first value of that forward carry (a layer's input,
    the data at the first layer), or None where no role reads it so."""
    for ops in roles.ops:
        if ops[0] is None:
            continue
        for v0, v1 in zip(g.operands[ops[0]], g.operands[ops[1]]):
            owner = g.owner[v1]
            if (owner != ARG and roles.role_of.get(owner) == (role, 0) and g.results[owner].index(v1) == result
                    and (g.owner[v0] == ARG or g.owner[v0] not in roles.role_of)):
                return v0
    return None


def _same_result(g: Dataflow, values: list, result: int) -> bool:
    return all(g.results[g.owner[v]].index(v) == result for v in values)
