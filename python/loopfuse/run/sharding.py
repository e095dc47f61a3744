"""Placement of state and batch leaves on a 1-D device mesh for XLA's SPMD partitioner.

``"data"``: the batch is split along its leading axis over the mesh axis ``data``; params and
optimizer state are replicated, so XLA inserts the gradient all-reduce. ``"params"``: as
``"data"``, and in addition every state leaf of at least `min_shard_bytes` whose leading axis
divides by the device count is split along that axis (optimizer state follows its param).
``"members"`` (an ensemble's, see `ensemble`): every state leaf is split along its leading (member)
axis, each device holding its share of the members; the batch is replicated.
"""
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..errors import StateMismatchError

AXIS = "data"
MODES = ("data", "params", "members")


class Placement:
    """NamedShardings for each kind of leaf on a mesh over `devices`."""

    def __init__(self, devices, mode: str = "data", min_shard_bytes: int = 1 << 20):
        if mode not in MODES:
            raise ValueError(f"sharding must be one of {MODES}, got {mode!r}")
        devices = list(devices)
        if not devices:
            raise ValueError("devices must name at least one device")
        self.devices, self.mode, self.min_shard_bytes = devices, mode, min_shard_bytes
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.split = NamedSharding(self.mesh, P(AXIS))

    def state(self, spec) -> NamedSharding:
        n = len(self.devices)
        if self.mode == "members":
            return self.split
        big = np.prod(spec.shape, dtype=np.int64) * np.dtype(spec.dtype).itemsize >= self.min_shard_bytes
        if self.mode == "params" and spec.shape and spec.shape[0] % n == 0 and big:
            return self.split
        return self.replicated

    def batch(self, name: str, spec) -> NamedSharding:
        """Split along the leading axis; scalars (e.g. a hyperparameter in the batch) are replicated. `name`: the
        leaf as a message names it (`leaves.leaf_name`)."""
        n = len(self.devices)
        if not spec.shape or self.mode == "members":
            return self.replicated
        if spec.shape[0] % n:
            raise StateMismatchError(
                f"{name} has shape {tuple(spec.shape)}: its leading (batch) axis must divide "
                f"evenly over the {n} devices for sharding='data'")
        return self.split

    def constrain_batch(self, batch_size: int, batch):
        """Inside a trace: split a batch sliced from a replicated Dataset along the mesh."""
        if batch_size % len(self.devices):
            raise StateMismatchError(f"Dataset batch_size={batch_size} must divide evenly over the "
                                     f"{len(self.devices)} devices for sharding='data'")
        return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, self.split), batch)
