"""Candidate runs of repeated layers, from the key paths of the state leaves (``loopfuse.state``).

A model written as a Python loop over its layers has state leaves whose paths differ only in one
index, however the layers are held: a list or tuple index, ``[0]['blocks'][3]['up']['kernel']`` (a
list of parameter dicts, a flax nnx ``nnx.List``), ``.layers[3].weight`` (an equinox list of modules,
``eqx.nn.Sequential``); or a dict key or attribute ending in the index, ``['params']['Block_3']``
(flax linen's ``@nn.compact`` submodules), ``['h_3']``, ``['layer3']``, ``['3']``, ``['w3']`` (leaves
with no container at all), or one of the ``/``-separated names of a dict key (haiku's module paths:
``['block_3/linear']['w']``, ``['mlp/~/linear_3']``; haiku numbers a name's modules from the second,
``linear``, ``linear_1``, .., so an unnumbered name counts as index 0 beside numbered ones); lists of
lists give one index per level. The optimizer's moments mirror
them (``[1][0].mu['blocks'][3]['up']['kernel']``), also where the optimizer keeps the list in pieces, under
numbers before its index (``optax.multi_transform`` with a label per layer or group of layers:
``[1].inner_states['l3'].inner_state[0].mu['blocks'][3]``, the other layers masked out). A *family* is the
leaves under one such index (the path up to it, and the key with ``*`` for the number, the prefix) by
position; a *run* is a range of consecutive indices in which every family has the same leaves (suffixes)
with the same types, and the
families of one run are those sharing its range and its leaves: the parameters and each moment, but
for two stacks of the same block (``['enc']``, ``['dec']``, each with its moments), which the step reads
one after the other (`_stacks`). A mirror over part of a run (moments kept only for the layers an optimizer
trains, or for some leaves of each) is a run of its own, which `sub_partner` joins to that part. Runs
of outer indices come first (a block before the layer norms inside it). The paths only propose runs;
`roll-layers` rolls one only where the ops that read and write its leaves are the same for every layer.

Examples:
    >>> paths = ["[0]['b'][0]['w']", "[0]['b'][1]['w']", "[0]['b'][2]['w']", "[1].mu['b'][0]['w']",
    ...          "[1].mu['b'][1]['w']", "[1].mu['b'][2]['w']", "[0]['head']"]
    >>> types = ["f32[4,4]"] * 6 + ["f32[4]"]
    >>> [(r.start, r.stop, sorted(r.families)) for r in runs(paths, types)]
    [(0, 3, ["[0]['b']", "[1].mu['b']"])]
    >>> runs(paths, types)[0].families["[0]['b']"]     # layer -> {suffix: leaf number}
    [{"['w']": 0}, {"['w']": 1}, {"['w']": 2}]
    >>> linen = ["['params']['Block_0']['Dense_0']", "['params']['Block_1']['Dense_0']", "['params']['Dense_0']"]
    >>> [(r.start, r.stop, list(r.families)) for r in runs(linen, ["f32[4,4]"] * 3)]
    [(0, 2, ["['params']['Block_*']"])]
    >>> haiku = ["['block/linear']['w']", "['block_1/linear']['w']", "['block_2/linear']['w']", "['linear']['w']"]
    >>> [(r.start, r.stop, list(r.families)) for r in runs(haiku, ["f32[4,4]"] * 3 + ["f32[4,1]"])]
    [(0, 3, ["['block_*']"])]
"""
import math
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]|\.[^.\[]+")
_INDEX = re.compile(r"\[(\d+)\]|(\[['\"]|\.)(.*?)(\d+)(['\"]\])?")
_KEY = re.compile(r"(\[['\"]|\.)(.*?)(['\"]\])?")
_NUMBERED = re.compile(r"(.*?)(\d+)")


@dataclass(frozen=True)
class Run:
    """Layers ``start .. stop - 1`` of one list: per family (prefix), per layer, suffix -> leaf number."""

    start: int
    stop: int
    families: dict

    @property
    def length(self) -> int:
        return self.stop - self.start

    def trimmed(self, first: int, last: int) -> "Run":
        """The run without its first `first` and last `last` layers."""
        return Run(self.start + first, self.stop - last,
                   {prefix: layers[first:len(layers) - last] for prefix, layers in self.families.items()})

    def leaves(self, layer: int) -> list[int]:
        """The leaf numbers of layer `layer` (0-based within the run), families and suffixes in order."""
        return [per_layer[layer][s] for _, per_layer in sorted(self.families.items()) for s in sorted(per_layer[layer])]


def tokens(path: str) -> list[str]:
    """A key path as jax's ``keystr`` writes it, split into its keys (``[0]``, ``['a']``, ``.b``)."""
    found = _TOKEN.findall(path)
    if "".join(found) != path:
        return [path]       # not a keystr path: one opaque key
    return found


def runs(paths: list, types: list, min_length: int = 2) -> list[Run]:
    """The candidate runs of the leaves with key `paths` (None: not a state leaf) and `types` (any
    comparable description of shape and dtype): outer indices first, then longest first."""
    lists: dict = {}   # prefix -> index -> {suffix: leaf}
    depth: dict = {}   # prefix -> (keys before its index, names before it in its key)
    unnumbered: dict = {}   # prefix -> {suffix: leaf}: haiku's first module of a name (``linear``, then ``linear_1``)
    pieces: dict = {}       # a prefix with every number before its index starred -> the prefixes it stars
    for leaf, path in enumerate(paths):
        if path is None:
            continue
        keys = tokens(path)
        parsed = [_indices(key) for key in keys]
        for at, carried in enumerate(parsed):
            for within, (name, index, rest) in enumerate(carried):
                prefix, suffix = "".join(keys[:at]) + name, rest + "".join(keys[at + 1:])
                if index is None:
                    unnumbered.setdefault(prefix, {})[suffix] = leaf
                    continue
                lists.setdefault(prefix, {}).setdefault(index, {})[suffix] = leaf
                depth[prefix] = (at, within)
                starred = "".join(_starred(k, f) for k, f in zip(keys[:at], parsed)) + name
                if starred != prefix:
                    pieces.setdefault(starred, set()).add(prefix)
    for prefix, layers in lists.items():
        if 0 not in layers and prefix in unnumbered:
            layers[0] = unnumbered[prefix]
    for prefixes in pieces.values():
        if (joined := _pieces(sorted(prefixes), lists)) is not None:
            name, layers = joined
            lists[name], depth[name] = layers, depth[min(prefixes)]
    found: dict = {}   # (start, stop, layer signature) -> families
    for prefix, layers in lists.items():
        def shape(i):
            return _signature(layers[i], types)
        indices = sorted(layers)
        start = 0
        while start < len(indices):
            stop = start + 1
            while (stop < len(indices) and indices[stop] == indices[stop - 1] + 1
                   and shape(indices[stop]) == shape(indices[start])):
                stop += 1
            if stop - start >= min_length:
                span = (indices[start], indices[stop - 1] + 1, shape(indices[start]))
                found.setdefault(span, {})[prefix] = [layers[i] for i in indices[start:stop]]
            start = stop
    out = [Run(start, stop, part) for (start, stop, _), families in found.items() for part in _stacks(families)]
    return sorted(out, key=lambda r: (min(depth[p] for p in r.families), -r.length * len(r.families), r.start))


def _starred(key: str, indices: list) -> str:
    """`key` (its `_indices`) with ``*`` for each number it carries."""
    if all(index is None for _, index, _ in indices):
        return key
    if not indices[0][0]:
        return "[*]"
    m = _KEY.fullmatch(key)
    assert m is not None      # `_indices` found a number in it
    names = [(n.group(1) + "*") if (n := _NUMBERED.fullmatch(name)) else name for name in m.group(2).split("/")]
    return m.group(1) + "/".join(names) + (m.group(3) or "")


def _pieces(prefixes: list, lists: dict) -> tuple[str, dict] | None:
    """One family from the lists at `prefixes`, which differ only in numbers before their index, where
    their layers are disjoint: the pieces of one list, as ``optax.multi_transform`` with a label per layer
    (or per group of layers) keeps it, layer 3's moments under ``['l3']`` and the list's index 3, the other
    layers masked out; (its name, with ``*`` for the numbers that differ, its layers), or None.

    Examples:
        >>> paths = [f"[1]['l{i}'][0].mu['b'][{i}]" for i in range(3)] + [f"[0]['b'][{i}]" for i in range(3)]
        >>> [(r.length, sorted(r.families)) for r in runs(paths, ["f32[4]"] * 6)]
        [(3, ["[0]['b']", "[1]['l*'][0].mu['b']"])]
        >>> groups = [f"[1]['g{i // 2}'][0].mu['b'][{i}]" for i in range(4)] + [f"[0]['b'][{i}]" for i in range(4)]
        >>> [(r.length, sorted(r.families)) for r in runs(groups, ["f32[4]"] * 8)][0]     # a label per two layers
        (4, ["[0]['b']", "[1]['g*'][0].mu['b']"])
        >>> from_one = [f"[1]['l{i + 1}'][0].mu['b'][{i}]" for i in range(3)] + paths[3:]   # the embeddings as 0
        >>> [(r.length, sorted(r.families)) for r in runs(from_one, ["f32[4]"] * 6)]
        [(3, ["[0]['b']", "[1]['l*'][0].mu['b']"])]
        >>> [r.length for r in runs([f"[0][{i}][{j}]" for i in range(2) for j in range(2)], ["f32[4]"] * 4)]
        [2, 2, 2]
    """
    if len(prefixes) < 2 or sum(len(lists[p]) for p in prefixes) != len({i for p in prefixes for i in lists[p]}):
        return None
    parts = [tokens(p) for p in prefixes]
    name = "".join(key if len({keys[at] for keys in parts}) == 1 else _starred(key, _indices(key))
                   for at, key in enumerate(parts[0]))
    return name, {index: layer for p in prefixes for index, layer in lists[p].items()}


def _stacks(families: dict) -> list[dict]:
    """`families` (prefix -> layers) of one span and leaves, split into one group per last key of the prefix
    where every such key has the same roots, the keys before it: two stacks of the same block, each with its
    mirrors (``[0]['enc']``, ``[1].mu['enc']`` and ``[0]['dec']``, ``[1].mu['dec']``); else one group (the
    parameters and each moment: ``[0]['blocks']``, ``[1].mu['blocks']``, or a bare list's ``[0]``, ``[1].mu``).

    Examples:
        >>> [sorted(g) for g in _stacks(dict.fromkeys(["[0]['enc']", "[0]['dec']", "[1].mu['enc']", "[1].mu['dec']"]))]
        [["[0]['enc']", "[1].mu['enc']"], ["[0]['dec']", "[1].mu['dec']"]]
        >>> [sorted(g) for g in _stacks(dict.fromkeys(["[0]", "[1].mu", "[1].nu"]))]
        [['[0]', '[1].mu', '[1].nu']]
    """
    roots: dict = {}      # last key -> {the prefix before it: the prefix}
    for prefix in families:
        last = _last_key(prefix)
        roots.setdefault(last, {})[prefix.removesuffix(last)] = prefix
    if len(roots) < 2 or len({frozenset(r) for r in roots.values()}) > 1:
        return [families]
    return [{prefix: families[prefix] for prefix in r.values()} for r in roots.values()]


def _last_key(prefix: str) -> str:
    """The last key of a family's prefix: the list's name (``['enc']`` of ``[1].mu['enc']``)."""
    return (tokens(prefix) or [""])[-1]


def _indices(key: str) -> list[tuple[str, int | None, str]]:
    """The indices one key of a path carries, each as (the key with ``*`` for it, the index, the rest of
    the key): a list index (``[3]``: the key is the index); a number ending a dict key or attribute,
    or one of its ``/``-separated names (haiku's module paths, ``['block_3/linear']``: the layer is what
    is under ``block_3``, the rest of the key belongs to the leaf's suffix); and a name that would be
    numbered ``name_*`` has index None, for haiku's first module of that name, which it does not number."""
    m = _INDEX.fullmatch(key)
    if m and m.group(1):
        return [("", int(m.group(1)), "")]
    m = _KEY.fullmatch(key)
    if m is None or (m.group(1) == ".") == bool(m.group(3)):
        return []
    opening, closing, names = m.group(1), m.group(3) or "", m.group(2).split("/")
    found: list[tuple[str, int | None, str]] = []
    for k, name in enumerate(names):
        numbered = _NUMBERED.fullmatch(name)
        head = opening + "/".join(names[:k]) + ("/" if k else "")
        rest = "/".join(names[k + 1:])
        if numbered:
            found.append((head + numbered.group(1) + "*" + closing, int(numbered.group(2)), rest))
        elif name:
            found.append((head + name + "_*" + closing, None, rest))
    return found


def with_partners(run: Run, others: list[Run], first_use: list) -> Run:
    """`run` joined by those of `others` whose layers the step reads interleaved with its own (each one's layer
    l first read before either one's layer l + 1; `first_use[leaf]`: the first op reading the leaf, or None),
    over the layers both hold where one's span holds the other's: the modules of one layer held apart, as a
    loop over haiku's or linen's modules names them (``layer_norm_3``, ``linear_3``), not stacks read one
    after the other (a decoder's after an encoder's), which stay apart.

    Examples:
        >>> paths = ["['ln']['s']", "['ln_1']['s']", "['linear']['w']", "['linear_1']['w']"]
        >>> found = runs(paths, ["f32[4]", "f32[4]", "f32[4,4]", "f32[4,4]"])
        >>> [list(r.families) for r in found]
        [["['ln_*']"], ["['linear_*']"]]
        >>> sorted(with_partners(found[0], found[1:], [1, 3, 2, 4]).families)    # ln, linear, ln_1, linear_1
        ["['linear_*']", "['ln_*']"]
        >>> sorted(with_partners(found[0], found[1:], [1, 2, 3, 4]).families)    # ln, ln_1, then linear, linear_1
        ["['ln_*']"]

        Over the layers of both, where one list goes on (a head module of the same kind after the blocks):

        >>> head = runs(paths + ["['linear_2']['w']"], ["f32[4]", "f32[4]", "f32[4,4]", "f32[4,4]", "f32[4,4]"])
        >>> [(sorted(j.families), j.start, j.stop) for j in (with_partners(head[1], [head[0]], [1, 3, 2, 4, 5]),
        ...                                                   with_partners(head[0], [head[1]], [1, 3, 2, 4, 5]))]
        [(["['linear_*']", "['ln_*']"], 0, 2), (["['linear_*']", "['ln_*']"], 0, 2)]

        Not a run inside one of its layers (a linen block's two layer norms, ``LayerNorm_0`` and ``LayerNorm_1``):

        >>> blocks = [f"['Block_{b}']['LayerNorm_{n}']['scale']" for b in range(3) for n in range(2)]
        >>> found = runs(blocks, ["f32[4]"] * 6)
        >>> [(r.start, r.stop) for r in found]
        [(0, 3), (0, 2)]
        >>> list(with_partners(found[0], found[1:], [1, 2, 3, 4, 5, 6]).families)
        ["['Block_*']"]
    """
    def first(r: Run, layer: int) -> float:     # inf: the step reads none of the layer's leaves
        return min((first_use[leaf] for leaf in r.leaves(layer) if first_use[leaf] is not None), default=math.inf)

    def held(r: Run) -> set[int]:
        return {leaf for layer in range(r.length) for leaf in r.leaves(layer)}
    for other in others:
        start, stop = max(run.start, other.start), min(run.stop, other.stop)
        inside = (run.start, run.stop) == (start, stop) or (other.start, other.stop) == (start, stop)
        if stop - start < 2 or not inside or set(other.families) & set(run.families) or held(other) & held(run):
            continue     # not the modules of one of its layers (a linen block's LayerNorm_0, LayerNorm_1)
        # over the layers of both only: one list may go on (a head module of the same kind after the blocks)
        mine_run, other = (r.trimmed(start - r.start, r.stop - stop) for r in (run, other))
        mine, theirs = ([first(r, l) for l in range(stop - start)] for r in (mine_run, other))
        if math.inf not in mine + theirs and all(mine[l] < theirs[l + 1] and theirs[l] < mine[l + 1]
                                                 for l in range(stop - start - 1)):
            run = Run(start, stop, {**mine_run.families, **other.families})
    return run


def sub_partner(run: Run, others: list[Run]) -> Run:
    """`run`'s part over the layers of the first of `others` that mirrors part of it, joined by it; else `run`.
    A mirror holds, in each of its families, leaves of each layer that one of `run`'s families holds too,
    over some of `run`'s layers or over all of them with fewer leaves each, under the same last key (the
    list's name): an optimizer keeps moments for the layers it trains only where the first ones are frozen
    (``optax.multi_transform`` with ``optax.set_to_zero``, or ``optax.masked``), and for each layer's
    adapters only (LoRA's, the base weights frozen). A run under another name is another stack (an
    encoder's blocks beside a decoder's, whose blocks hold more leaves), and so is a run over the same
    layers with the same leaves (`_stacks`).

    Examples:
        >>> paths = [f"[0]['b'][{l}]['w']" for l in range(4)] + [f"[1].mu['b'][{l}]['w']" for l in (2, 3)]
        >>> params, moments = runs(paths, ["f32[2]"] * 6)
        >>> part = sub_partner(params, [moments])
        >>> (part.start, part.stop, sorted(part.families))
        (2, 4, ["[0]['b']", "[1].mu['b']"])
        >>> [sorted(layer.values()) for layer in part.families["[0]['b']"]]
        [[2], [3]]
        >>> lora = [f"[0]['b'][{l}]['{k}']" for l in range(2) for k in "aw"] + [f"[1].mu['b'][{l}]['a']" for l in range(2)]
        >>> params, moments = runs(lora, ["f32[2]", "f32[2,2]"] * 2 + ["f32[2]"] * 2)
        >>> sorted(sub_partner(params, [moments]).families)
        ["[0]['b']", "[1].mu['b']"]
        >>> stacks = [f"[0]['enc'][{l}]['a']" for l in range(2)] + [f"[0]['dec'][{l}]['{k}']" for l in range(2) for k in "ac"]
        >>> enc, dec = runs(stacks, ["f32[2]"] * 6)                 # a decoder block: the encoder's, and more
        >>> sorted(dec.families), sub_partner(dec, [enc]) is dec
        (["[0]['dec']"], True)
    """
    mine = [(_last_key(prefix), set(layers[0])) for prefix, layers in run.families.items()]
    for other in others:
        held = [(_last_key(prefix), set(layers[0])) for prefix, layers in other.families.items()]
        if run.start <= other.start and other.stop <= run.stop and not set(other.families) & set(run.families) \
                and all(any(k == key and h <= s for key, s in mine) for k, h in held) \
                and (other.length < run.length or not all(x in mine for x in held)):
            part = run.trimmed(other.start - run.start, run.stop - other.stop)
            return Run(other.start, other.stop, {**part.families, **other.families})
    return run


def keyed_runs(paths: list, types: list, first_use: list, min_length: int = 2) -> list[Run]:
    """Runs of layers held under keys that say nothing of their order (``['blocks']['cedar']``,
    ``['blocks']['alder']``, ...), where the paths propose none by an index: a family is the leaves
    under one key of a dict, per key (a layer of two or more leaves; not an attribute, which names a
    field of a class, such as an optimizer state's ``.mu`` and ``.nu``), and the layers of
    a run are the keys of alike layers (the same leaves, of the same types), in the order the step
    first reads them (`first_use[leaf]`: an op's position, or None); families with the same keys
    (an optimizer's moments mirror the parameters) are one run, in that order. Longest first.

    Examples:
        >>> paths = [f"[{s}]['b']['{k}']['{w}']" for s in (0, 1) for k in ("elm", "ash") for w in ("w", "v")]
        >>> first = [5, 6, 1, 2, 20, 21, 22, 23]       # ash runs first; the moments are read by the update
        >>> [(r.length, {f: [sorted(l.values()) for l in ls] for f, ls in r.families.items()})
        ...  for r in keyed_runs(paths, ["f32[2]"] * 8, first)]
        [(2, {"[0]['b'][*]": [[2, 3], [0, 1]], "[1]['b'][*]": [[6, 7], [4, 5]]})]
    """
    families: dict = {}     # prefix -> key -> {suffix: leaf}
    for leaf, path in enumerate(paths):
        if path is None:
            continue
        keys = tokens(path)
        for at, key in enumerate(keys):
            if key.startswith("['") and not _INDEX.fullmatch(key):
                families.setdefault("".join(keys[:at]), {}).setdefault(key, {})["".join(keys[at + 1:])] = leaf
    found: dict = {}        # (keys, layer signature) -> {family name: {key: layer}}
    for prefix, layers in families.items():
        alike: dict = {}
        for key, layer in layers.items():
            if len(layer) >= 2 and all(first_use[leaf] is not None for leaf in layer.values()):
                alike.setdefault(_signature(layer, types), []).append(key)
        for signature, keys in alike.items():
            if len(keys) >= min_length:
                found.setdefault((frozenset(keys), signature), {})[prefix + "[*]"] = {k: layers[k] for k in keys}
    out = []
    for (keys, _), fams in found.items():
        order = sorted(keys, key=lambda k: min(min(first_use[leaf] for leaf in fam[k].values()) for fam in fams.values()))
        out.append(Run(0, len(order), {name: [fam[k] for k in order] for name, fam in fams.items()}))
    return sorted(out, key=lambda r: -r.length * len(r.families))


def _signature(layer: dict, types) -> tuple:
    """A layer's leaves by suffix and type: two layers of one run have the same."""
    return tuple(sorted((s, types[leaf]) for s, leaf in layer.items()))
