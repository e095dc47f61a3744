"""What loopfuse knows about one pytree leaf: its dtype, weak type and abstract value, whether it
is a typed PRNG key (which crosses the executable boundary as its raw uint32 data), and its path.

A path is spelled two ways, each for its own readers: `dotted` (``metrics.acc``, ``loss[0]``) is how a user
names aux leaves (``keep_aux``, the progress bar); `keyed` (jax's ``['metrics']['acc']``) is how loopfuse
names a state or batch leaf (the IR's state tags, checkpoints, packed layouts), and `leaf_name` a leaf in
messages. All live here.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> spec(0.5), dtype(jnp.arange(3.0)), is_weak(jnp.asarray(0.1))
    (ShapeDtypeStruct(shape=(), dtype=float32, weak_type=True), dtype('float32'), True)
    >>> is_differentiable(0.5), is_differentiable(3), is_differentiable(jnp.array([True]))
    (True, False, False)
    >>> spec(jax.random.key(0))                       # a typed key travels as its raw data
    ShapeDtypeStruct(shape=(2,), dtype=uint32)
    >>> dotted_paths({"metrics": {"acc": 1.0}, "loss": [2.0]})
    ['loss[0]', 'metrics.acc']
    >>> keyed_paths({"metrics": {"acc": 1.0}, "loss": [2.0]})
    ["['loss'][0]", "['metrics']['acc']"]
    >>> leaf_name("batch", "['x']"), leaf_name("batch", ())
    ("batch leaf ['x']", 'the batch')
"""
import jax
import jax.numpy as jnp
import numpy as np

from ..errors import AuxPathError, StateMismatchError


# ---- dtype, weak type, abstract value ---------------------------------------------------------
def is_weak(x) -> bool:
    """Whether jax.jit traces `x` as a weakly typed value (Python scalars, `jnp.asarray(0.1)`)."""
    a = x if isinstance(x, jax.ShapeDtypeStruct) else getattr(x, "aval", None)
    return a.weak_type if a is not None else type(x) in (int, float, complex)


def dtype(x) -> np.dtype:
    """The dtype a step traces `x` as (float64 host arrays are float32 without jax_enable_x64;
    a typed key keeps its key dtype)."""
    d = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return d if jax.dtypes.issubdtype(d, jax.dtypes.extended) else jax.dtypes.canonicalize_dtype(d)


def is_differentiable(x) -> bool:
    """Whether `x` traces as a floating or complex value, one `jax.grad` takes a derivative by (an integer, a bool
    or a typed key does not)."""
    return jnp.issubdtype(dtype(x), jnp.inexact)


def aval(x) -> jax.core.ShapedArray:
    """The abstract value of `x`, weak type and key dtype included (what a signature is keyed by:
    each traces differently)."""
    try:
        return x.aval
    except AttributeError:  # numpy arrays, Python scalars and jax.ShapeDtypeStruct
        return jax.core.ShapedArray(np.shape(x), dtype(x), weak_type=is_weak(x))


def spec(x) -> jax.ShapeDtypeStruct:
    """The abstract value `x` is traced and passed as: `aval`'s, a typed key as its raw uint32 data."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if is_key(x):
        return jax.ShapeDtypeStruct(jax.random.key_data(x).shape, jnp.uint32)
    return jax.ShapeDtypeStruct(np.shape(x), dtype(x), weak_type=is_weak(x))


def input_spec(what: str, path, x) -> jax.ShapeDtypeStruct:
    """`spec` of an input leaf, or a StateMismatchError naming the leaf that is no array."""
    try:
        s = spec(x)
        ok = jnp.issubdtype(s.dtype, jnp.number) or jnp.issubdtype(s.dtype, jnp.bool_)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise StateMismatchError(f"{leaf_name(what, path)} is {type(x).__name__} "
                                 f"{x!r:.60}, not a numeric array or scalar")
    return s


def is_deleted(x) -> bool:
    """Whether `x` is a jax Array whose buffer is gone (an earlier call donated it)."""
    return isinstance(x, jax.Array) and x.is_deleted()


# ---- typed PRNG keys --------------------------------------------------------------------------
def is_key(x) -> bool:
    """Whether `x` is a typed PRNG key array (it crosses the executable boundary as raw data)."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def raw(x):
    """`x` as the executable takes it: a typed key as its raw uint32 data, anything else as it is."""
    return jax.random.key_data(x) if is_key(x) else x


def key_impls(leaves) -> list:
    """Per leaf: its PRNG key implementation if it is a typed key, else None."""
    return [jax.random.key_impl(x) if is_key(x) else None for x in leaves]


def wrap_keys(raw_leaves, impls) -> list:
    """Raw uint32 key data back to typed keys where `impls` (see `key_impls`) names an implementation
    (None, an aux leaf the caller did not keep, stays None)."""
    return [a if impl is None or a is None else jax.random.wrap_key_data(a, impl=impl)
            for a, impl in zip(raw_leaves, impls)]


# ---- paths --------------------------------------------------------------------------------------
def dotted(path) -> str:
    """A key path as `a.b[0]` (the form `keep_aux` entries use)."""
    out = ""
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out += ("." if out else "") + str(k.key)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out += ("." if out else "") + k.name
        else:
            out += f"[{getattr(k, 'idx', k)}]"
    return out


def dotted_paths(tree) -> list[str]:
    """The `dotted` path of each leaf of `tree`, in leaf order."""
    return [dotted(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def keyed(path) -> str:
    """A key path as jax spells it (``['a']['b'][0]``; the whole tree: "")."""
    return jax.tree_util.keystr(tuple(path))


def leaf_name(what: str, path) -> str:
    """The leaf at `path` (a key path or its `keyed` string) of the `what` pytree, as a message names it:
    ``batch leaf ['x']``, or ``the batch`` where the tree is that one leaf."""
    k = path if isinstance(path, str) else keyed(path)
    return f"{what} leaf {k}" if k else f"the {what}"


def keyed_paths(tree, is_leaf=None) -> list[str]:
    """The `keyed` path of each leaf of `tree`, in leaf order (`is_leaf` as for jax.tree_util)."""
    return [keyed(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]


def _under(path: str, k: str) -> bool:
    return path == k or path.startswith(k + ".") or path.startswith(k + "[")


def aux_kept(aux_paths: list, keep_aux) -> list:
    """Per aux leaf: whether `keep_aux` asks for it; an entry naming no aux leaf is an AuxPathError."""
    if keep_aux is None:
        return [True] * len(aux_paths)
    unknown = [k for k in keep_aux if not any(_under(p, k) for p in aux_paths)]
    if unknown:
        raise AuxPathError(f"keep_aux names {', '.join(map(repr, unknown))}, which is no aux leaf or subtree; "
                           f"the step's aux leaves are {aux_paths}")
    return [any(_under(p, k) for k in keep_aux) for p in aux_paths]


# ---- a state and its update -----------------------------------------------------------------------
def _few(paths: list[str], n: int = 5) -> str:
    """The first `n` of `paths`, each cut to a readable length, and how many more."""
    shown = ", ".join(repr(_short(p)) for p in paths[:n])
    return f"[{shown}" + (f", and {len(paths) - n} more]" if len(paths) > n else "]")


def _short(x, n: int = 120) -> str:
    text = str(x)
    return text if len(text) <= n else text[:n] + "..."


def check_same_state(state, new_state) -> None:
    """new_state must have state's tree structure, shapes and dtypes; name the first leaf that differs."""
    old, old_def = jax.tree_util.tree_flatten_with_path(state)
    new, new_def = jax.tree_util.tree_flatten_with_path(new_state)
    if old_def != new_def:  # type: ignore[operator]  # jax's PyTreeDef names an unstubbed jaxlib class
        old_paths = {keyed(p) for p, _ in old}
        new_paths = {keyed(p) for p, _ in new}
        missing, extra = sorted(old_paths - new_paths), sorted(new_paths - old_paths)
        kinds = "" if type(new_state) is type(state) else (
            f"the step returns (new_state, aux), and its new state is of type {type(new_state).__name__} where the "
            f"state given is of type {type(state).__name__}; ")
        raise StateMismatchError((
            f"the new state's pytree structure differs from the input state's: {kinds}"
            + (f"missing leaves {_few(missing)} " if missing else "") + (f"extra leaves {_few(extra)} " if extra else "")
            + ("" if kinds else f"(input {_short(old_def)}, output {_short(new_def)})")).rstrip())
    for (path, a), (_, b) in zip(old, new):
        # a typed key by its key type (the executable takes its raw data: a raw key leaf has the same spec)
        shown = [f"{x.dtype}{list(x.shape)}" if is_key(x) else f"{s.dtype}{list(s.shape)}"
                 for x, s in ((a, spec(a)), (b, spec(b)))]
        if shown[0] != shown[1]:
            raise StateMismatchError(
                f"{leaf_name('state', path)} enters the step as {shown[0]} but leaves it as {shown[1]}; an update "
                "must keep each leaf's shape and dtype")
