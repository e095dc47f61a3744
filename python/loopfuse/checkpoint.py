"""Checkpoints of a chunked run (`fit`, `minimize`) with orbax's CheckpointManager.

A checkpoint at step ``s`` holds three orbax items: ``state`` (the state after ``s`` steps; typed PRNG
keys as their raw key data), ``history`` (the aux history of steps ``0..s``, leaves in flat order;
absent when aux has no leaves) and ``meta`` (JSON: ``s`` and each leaf's path, shape and dtype).
orbax writes each checkpoint into a temporary folder and renames it when complete, so a process
killed at any moment, also during a save, leaves the previous checkpoint restorable.

orbax-checkpoint is an optional dependency (``pip install loopfuse[checkpoint]``), imported here only.
"""
import os
from typing import Any

import jax
import numpy as np

from .errors import StateMismatchError


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError("checkpoint_dir= needs orbax-checkpoint: pip install 'loopfuse[checkpoint]' "
                          "(or pip install orbax-checkpoint)") from e
    return ocp


def _leaf_specs(tree) -> list:
    """[path, shape, dtype] of each leaf (dtypes canonical, as a step traces them)."""
    specs = []
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        dtype = x.dtype if _is_key(x) else jax.dtypes.canonicalize_dtype(np.result_type(x))
        specs.append([jax.tree_util.keystr(path), list(np.shape(x)), str(dtype)])
    return specs


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class Checkpoints:
    """Save and restore one run's checkpoints in `directory`, keeping the newest `keep` (None: all)."""

    def __init__(self, directory: str | os.PathLike, keep: int | None):
        ocp = self._ocp = _orbax()
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._saved: int | None = self._manager.latest_step()

    def restore(self, template, num_steps: int, history_paths: list[str]):
        """The latest checkpoint as ``(steps, state, history leaves)``, or None when there is none.

        `template` (the caller's state) gives the structure, dtypes and shardings; a checkpoint of
        another program (other leaves, shapes or dtypes, other aux paths, more than `num_steps`
        steps) raises StateMismatchError naming the first mismatch.
        """
        step = self._saved
        if step is None:
            return None
        ocp = self._ocp
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        where = f"the checkpoint of step {step} in {self.directory}"
        self._check(where, "state leaf", meta["state"], _leaf_specs(template))
        saved_paths = [p for p, _, _ in meta["history"]]
        if saved_paths != history_paths:
            raise StateMismatchError(
                f"{where} was written by another program: its aux history has paths {saved_paths}, this step's "
                f"aux has {history_paths}; use another checkpoint_dir (nothing was overwritten)")
        if meta["steps"] > num_steps:
            raise StateMismatchError(
                f"{where} has run {meta['steps']} steps, more than num_steps={num_steps}; pass num_steps >= "
                f"{meta['steps']} or use another checkpoint_dir (nothing was overwritten)")
        leaves, treedef = jax.tree_util.tree_flatten(template)
        abstract = [self._abstract(x) for x in leaves]
        items = {"state": ocp.args.StandardRestore(abstract)}
        if saved_paths:
            items["history"] = ocp.args.StandardRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        state = [jax.random.wrap_key_data(r, impl=jax.random.key_impl(x)) if _is_key(x) else r
                 for x, r in zip(leaves, restored["state"])]
        history = [np.asarray(h) for h in restored["history"]] if saved_paths else []
        return meta["steps"], jax.tree_util.tree_unflatten(treedef, state), history

    @staticmethod
    def _check(where: str, what: str, saved: list, here: list) -> None:
        saved_map, here_map = {p: (s, d) for p, s, d in saved}, {p: (s, d) for p, s, d in here}
        for path in here_map.keys() | saved_map.keys():
            if path not in saved_map or path not in here_map:
                has, lacks = ("this state", "the checkpoint") if path not in saved_map else ("the checkpoint", "this state")
                raise StateMismatchError(
                    f"{where} was written by another program: {what} {path} is in {has}, not in {lacks}; "
                    "use another checkpoint_dir (nothing was overwritten)")
            (s_shape, s_dtype), (h_shape, h_dtype) = saved_map[path], here_map[path]
            if s_shape != h_shape or s_dtype != h_dtype:
                raise StateMismatchError(
                    f"{where} was written by another program: {what} {path} is {s_dtype}{s_shape} there, "
                    f"{h_dtype}{h_shape} here; use another checkpoint_dir (nothing was overwritten)")
        if [p for p, _, _ in saved] != [p for p, _, _ in here]:
            raise StateMismatchError(f"{where} was written by another program: its {what}s are in another "
                                     "tree order; use another checkpoint_dir (nothing was overwritten)")

    @staticmethod
    def _abstract(x):
        """Where and how to restore a leaf like `x`: its shape, dtype and sharding (typed keys as key data)."""
        if _is_key(x):
            x = jax.random.key_data(x)
        sharding = x.sharding if isinstance(x, jax.Array) else jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(np.result_type(x)), sharding=sharding)

    def save(self, steps: int, state, history: Any) -> None:
        """Start saving the checkpoint of step `steps` (the device-to-host copy is done when this returns,
        so the state may be donated next); `history` is the aux history of steps ``0..steps``."""
        if steps == self._saved:
            return
        ocp = self._ocp
        leaves = [jax.random.key_data(x) if _is_key(x) else x for x in jax.tree_util.tree_leaves(state)]
        history_leaves = jax.tree_util.tree_leaves(history)
        meta = {"steps": steps, "state": _leaf_specs(state),
                "history": [[p, s[1:], d] for p, s, d in _leaf_specs(history)]}
        items = {"state": ocp.args.StandardSave(leaves), "meta": ocp.args.JsonSave(meta)}
        if history_leaves:
            items["history"] = ocp.args.StandardSave(history_leaves)
        self._manager.save(steps, args=ocp.args.Composite(**items))
        self._saved = steps

    def close(self) -> None:
        """Wait for the save in flight and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()
