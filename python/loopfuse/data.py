"""Device-resident datasets that a compiled loop slices per step, with no host round trip."""
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from .errors import StateMismatchError


@partial(jax.tree_util.register_dataclass, data_fields=["arrays", "key"], meta_fields=["batch_size"])
@dataclass(frozen=True)
class Dataset:
    """A pytree of arrays with a common leading axis of N examples, served in batches.

    Step ``i`` gets batch ``i mod (N // batch_size)`` of epoch ``i // (N // batch_size)``; with a
    ``key`` the examples are reshuffled each epoch by ``permutation(fold_in(key, epoch))``.
    A trailing partial batch is dropped.
    """

    arrays: Any
    batch_size: int
    key: Any = None

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
        n = leaves[0][1].shape[0] if leaves[0][1].ndim else None
        for path, leaf in leaves:
            if leaf.ndim == 0 or leaf.shape[0] != n:
                raise StateMismatchError(
                    f"Dataset leaf {jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)}; every leaf "
                    f"needs the same leading example axis ({n})")
        if not 0 < self.batch_size <= n:
            raise StateMismatchError(f"Dataset batch_size={self.batch_size} must be in 1..{n} (examples)")

    def batch(self, step):
        """The batch for global step `step` (a traced int32 scalar)."""
        nb = self.batches_per_epoch
        start = (step % nb) * self.batch_size
        if self.key is None:
            return jax.tree_util.tree_map(
                lambda a: jax.lax.dynamic_slice_in_dim(a, start, self.batch_size, axis=0), self.arrays)
        order = jax.random.permutation(jax.random.fold_in(self.key, step // nb), self.num_examples)
        rows = jax.lax.dynamic_slice_in_dim(order, start, self.batch_size)
        return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=0), self.arrays)
