"""Device-resident datasets that a compiled loop slices per step, with no host round trip."""
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import validate
from ..errors import StateMismatchError, warn
from .leaves import leaf_name


@partial(jax.tree_util.register_dataclass, data_fields=["arrays", "key"], meta_fields=["batch_size"])
@dataclass(frozen=True)
class Dataset:
    """A pytree of arrays with a common leading axis of N examples, served in batches.

    Step ``i`` gets batch ``i mod (N // batch_size)`` of epoch ``i // (N // batch_size)``; with a
    ``key`` the examples are reshuffled each epoch by ``permutation(fold_in(key, epoch))``.
    A trailing partial batch is dropped. A compiled step copies host (numpy) arrays to the device
    once, at the first call that uses this Dataset, and computes each epoch's order once.

    Examples:
        >>> import jax.numpy as jnp, numpy as np
        >>> import loopfuse
        >>> data = loopfuse.Dataset({"x": np.arange(10.0)}, batch_size=4)
        >>> data.num_examples, data.batches_per_epoch  # examples 8 and 9 are dropped
        (10, 2)
        >>> def fn(total, batch):
        ...     return total + batch["x"].sum(), {}
        >>> total, _ = loopfuse.compile_step(fn, steps=3)(jnp.float32(0), data)
        >>> total.item()  # batches 0, 1 and (the next epoch's) 0: 6 + 22 + 6
        34.0
    """

    arrays: Any
    batch_size: int
    key: Any = None

    def __post_init__(self):
        object.__setattr__(self, "batch_size", validate.steps(self.batch_size, "Dataset batch_size"))

    @property
    def num_examples(self) -> int:
        return jax.tree_util.tree_leaves(self.arrays)[0].shape[0]

    @property
    def batches_per_epoch(self) -> int:
        return self.num_examples // self.batch_size

    def validate(self) -> None:
        """Raise StateMismatchError naming the leaf whose leading axis disagrees."""
        leaves = jax.tree_util.tree_leaves_with_path(self.arrays)
        if not leaves:
            raise StateMismatchError("Dataset has no arrays")
        for path, leaf in leaves:
            if jnp.ndim(leaf) == 0:
                raise StateMismatchError(f"{leaf_name('Dataset', path)} is a scalar; every leaf needs a "
                                         "leading example axis")
        n = leaves[0][1].shape[0]
        for path, leaf in leaves:
            if leaf.shape[0] != n:
                raise StateMismatchError(
                    f"{leaf_name('Dataset', path)} has shape {tuple(leaf.shape)}; every leaf "
                    f"needs the same leading example axis ({n})")
        if not 0 < self.batch_size <= n:
            raise StateMismatchError(f"Dataset batch_size={self.batch_size} must be in 1..{n} (examples)")

    def batch(self, step: jax.Array | np.integer | int) -> Any:
        """The batch for global step `step` (an int32 scalar, traced in a compiled step)."""
        nb = self.batches_per_epoch
        start = (step % nb) * self.batch_size
        if self.key is None:
            return jax.tree_util.tree_map(
                lambda a: jax.lax.dynamic_slice_in_dim(a, start, self.batch_size, axis=0), self.arrays)
        order = jax.random.permutation(jax.random.fold_in(self.key, step // nb), self.num_examples)
        rows = jax.lax.dynamic_slice_in_dim(order, start, self.batch_size)
        return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=0), self.arrays)

    def served(self, start: int, steps: int, sharding: jax.sharding.Sharding) -> "Dataset":
        """What a compiled call of `steps` steps from global step `start` takes: the arrays on
        `sharding` (placed once per Dataset) and, with a key, the orders of the epochs those steps
        touch (each computed and placed once, see `_order`), so the call only slices and gathers."""
        cache = self.__dict__.setdefault("_served", {})
        arrays = cache.get(sharding)
        if arrays is None:
            arrays = cache[sharding] = jax.tree_util.tree_map(lambda a: jax.device_put(a, sharding), self.arrays)
        if self.key is None:
            return Dataset(arrays, self.batch_size)
        nb = self.batches_per_epoch
        ring = (nb + steps - 2) // nb + 1  # the most epochs `steps` consecutive steps can touch
        first, last = start // nb, (start + steps - 1) // nb
        if cache.get("ring_of") != (sharding, ring, first, last):
            if cache.get("orders_on") != sharding:
                cache["orders"], cache["orders_on"] = {}, sharding
            orders = cache["orders"]  # epoch -> its order on `sharding`
            for e in [e for e in orders if e < first]:
                del orders[e]
            for e in range(first, last + 1):
                if e not in orders:
                    orders[e] = _order(self.key, e, self.num_examples, sharding)
            by_row = {e % ring: orders[e] for e in range(first, last + 1)}  # other rows: never read
            cache["ring"] = jnp.stack([by_row.get(r, orders[first]) for r in range(ring)])
            cache["ring_of"] = (sharding, ring, first, last)
        return _Ordered(arrays, self.batch_size, orders=cache["ring"])


@partial(jax.tree_util.register_dataclass, data_fields=["arrays", "orders"], meta_fields=["batch_size", "key"])
@dataclass(frozen=True)
class _Ordered(Dataset):
    """A shuffled Dataset as a compiled call takes it: ``orders[e % R]`` is epoch e's order."""

    orders: Any = None

    def batch(self, step: jax.Array | np.integer | int) -> Any:
        nb = self.batches_per_epoch
        row = (step // nb) % self.orders.shape[0]
        rows = jax.lax.dynamic_slice(self.orders, (row, (step % nb) * self.batch_size), (1, self.batch_size))[0]
        return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=0, mode="clip"), self.arrays)


HOST_SORT_PLATFORMS = ("cpu",)  # where `epoch_order`'s host sort beats XLA's (~10x on CPU)


def _order(key, epoch: int, n: int, sharding: jax.sharding.Sharding) -> jax.Array:
    """``permutation(fold_in(key, epoch), n)`` on `sharding`: on a CPU the host sort (`epoch_order`),
    placed; elsewhere jax's own permutation on the device, dispatched asynchronously, so the
    calls queued behind it do not wait for the host."""
    device: Any = next(iter(sharding.device_set))   # jaxlib's Device has no type stubs
    if device.platform in HOST_SORT_PLATFORMS:
        return jax.device_put(epoch_order(key, epoch, n), sharding)
    return jax.device_put(_permutation(jax.device_put(key, sharding), epoch, n), sharding)


@partial(jax.jit, static_argnums=2)
def _permutation(key, epoch, n: int):
    return jax.random.permutation(jax.random.fold_in(key, epoch), n)


def epoch_order(key, epoch: int, n: int) -> np.ndarray:
    """``permutation(fold_in(key, epoch), n)`` as host int32, bitwise.

    jax sorts ``arange(n)`` by fresh random uint32 bits, stably, in a few rounds (an XLA sort:
    ~40 ms at n = 60,000 and ~1 s at n = 1,000,000 on CPU); NumPy sorts the same bits ~10x faster. The
    first use for each (n, key type) is checked against `jax.random.permutation` itself, which
    is used instead from then on if they differ.
    """
    kind = (n, str(getattr(key, "dtype", None)), np.shape(key))
    if _FAST_ORDER_OK.get(kind) is False:
        return np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
    rounds = int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
    x, position = np.arange(n, dtype=np.int32), np.arange(n, dtype=np.uint64)
    for bits in np.asarray(_sort_bits(key, epoch, n, rounds)):
        # A stable sort by bits = a sort of (bits, position) pairs packed into uint64 (6x faster).
        x = x[np.sort(bits.astype(np.uint64) << np.uint64(32) | position) & np.uint64(0xFFFFFFFF)]
    if kind not in _FAST_ORDER_OK:
        reference = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
        _FAST_ORDER_OK[kind] = bool(np.array_equal(x, reference))
        if not _FAST_ORDER_OK[kind]:
            warn("loopfuse: the host shuffle no longer matches jax.random.permutation; "
                 "using jax.random.permutation (slower) for this Dataset size")
            return reference
    return x


_FAST_ORDER_OK: dict = {}  # (n, key dtype, key shape) -> whether epoch_order's host sort matched jax


@partial(jax.jit, static_argnums=(2, 3))
def _sort_bits(key, epoch, n: int, rounds: int):
    """The uint32 sort keys of each round of ``permutation(fold_in(key, epoch), n)``."""
    key, out = jax.random.fold_in(key, epoch), []
    for _ in range(rounds):
        key, subkey = jax.random.split(key)
        out.append(jax.random.bits(subkey, (n,), jnp.uint32))
    return jnp.stack(out)
