"""Checkpoints of a chunked run (`fit`, `minimize`) with orbax's CheckpointManager.

A checkpoint at step ``s`` holds three orbax items: ``state`` (the state after ``s`` steps; typed PRNG
keys as their raw key data), ``history`` (the aux history of steps ``0..s``, leaves in flat order;
absent when aux has no leaves) and ``meta`` (JSON: ``s``, each leaf's path, shape and dtype (of a
`PackedState`: of each leaf it packs, the path saying where it lives), and ``stopped``: the retcode
of a run that a step ended, "until" or "non_finite", else null).
orbax writes each checkpoint into a temporary folder and renames it when complete, so a process
killed at any moment, also during a save, leaves the previous checkpoint restorable. A save is written
in the background while the run goes on, and the next save first waits for it: a kill loses the steps
since the last completed save, up to two intervals when it lands while a save is still being written.

`check_directory` refuses a checkpoint folder orbax would misuse before anything runs: "", a file, a
path under a file, or a folder holding entries orbax takes for steps (numbered) that are neither loopfuse
checkpoints nor what a kill left of an old one orbax was deleting (orbax would fail to restore them, or
delete them to keep the newest `keep`).

orbax-checkpoint is an optional dependency (``pip install loopfuse[checkpoint]``), imported here only.
"""
import fcntl
import os
import re
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from .. import settings, validate
from ..errors import CheckpointError, StateMismatchError
from .leaves import dtype, key_impls, keyed_paths, raw, wrap_keys
from .packed import PackedState


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError("checkpoint_dir= needs orbax-checkpoint: pip install 'loopfuse[checkpoint]' "
                          "(or pip install orbax-checkpoint)") from e
    return ocp


def _leaf_specs(tree) -> list:
    """[path, shape, dtype] of each leaf (dtypes canonical, as a step traces them)."""
    return [[path, list(np.shape(x)), str(dtype(x))]
            for path, x in zip(keyed_paths(tree), jax.tree_util.tree_leaves(tree))]


def _state_specs(state) -> list:
    """`_leaf_specs` of the state; of a `PackedState`, those of the leaves it packs, each path saying
    where the leaf lives (so a checkpoint of another layout of the same buffers is refused)."""
    if not isinstance(state, PackedState):
        return _leaf_specs(state)
    paths = keyed_paths(state.layout.treedef.unflatten([0] * state.layout.treedef.num_leaves))
    return [[f"{path} (.buffers[{b}] at {at})", list(shape), str(state.layout.buffer_dtypes[b])] if b is not None
            else [f"{path} (.kept[{at}])", *_leaf_specs(state.kept[at])[0][1:]]
            for path, shape, (b, at) in zip(paths, state.layout.shapes, state.layout.places)]


# The entry names orbax's CheckpointManager takes for steps (its standard name format, no prefix: "0", "12",
# not "012"): it restores the latest and deletes the oldest beyond `keep`. Its temporary folders of a save in
# progress or killed ("12.orbax-checkpoint-tmp...") do not match; it removes those itself.
_STEP_NAME = re.compile(r"^(0|[1-9]\d*)$")   # as orbax matches it (re.search)
_META = "meta"      # the item every checkpoint of ours holds (see the module docstring)
# What a checkpoint folder of ours holds: its items and orbax's files. A process killed while orbax deleted an
# old checkpoint (keep=) leaves some of them, never the latest checkpoint's.
_CHECKPOINT_NAMES = {"state", "history", _META, "_CHECKPOINT_METADATA", "commit_success.txt"}


def check_directory(directory: str | os.PathLike) -> Path:
    """`directory` (``checkpoint_dir=``, ``~`` expanded) as an absolute Path, once checked: a folder orbax may
    create or use. Raises, before anything runs and touching nothing, TypeError for another type than a path,
    and ValueError for "" (no folder: pass None for no checkpoints), a file, a path under a file, or a folder
    holding entries named like steps that are neither checkpoints of ours (a ``meta`` item) nor what a kill
    left of an old one that orbax was deleting (a user's folder or file), which orbax would fail to restore
    (the latest) or delete to keep the newest `keep`.
    """
    validate.folder(directory, "checkpoint_dir")
    if os.fspath(directory) == "":
        raise ValueError("checkpoint_dir='' names no folder (it would checkpoint into the current directory): "
                         "pass a folder, or None for no checkpoints")
    path = Path(os.path.abspath(settings.path(directory)))
    given = f"checkpoint_dir={os.fspath(directory)!r}" + (f" ({path})" if os.fspath(directory) != str(path) else "")
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if not existing.is_dir():
        what = "exists" if existing == path else f"cannot be created: {existing} exists"
        raise ValueError(f"{given} {what} and is not a folder; pass a folder (a new one, or one holding this "
                         "run's checkpoints), or None for no checkpoints")
    if existing != path:
        return path
    steps = sorted((int(p.name), p) for p in path.iterdir() if _STEP_NAME.search(p.name))

    def ours(p: Path, latest: bool) -> bool:
        return p.is_dir() and ((p / _META).is_dir() or not latest and all(
            entry.name in _CHECKPOINT_NAMES for entry in p.iterdir()))

    foreign = [p for i, (_, p) in enumerate(steps) if not ours(p, latest=i == len(steps) - 1)]
    if foreign:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in foreign[:5])
        names += f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise ValueError(
            f"{given} holds {names}: named like checkpoints, but not loopfuse checkpoints (a '{_META}' item), so "
            "orbax would fail to restore them or delete them (keep=); move them elsewhere or use another "
            "checkpoint_dir (nothing was touched)")
    return path


class Checkpoints:
    """Save and restore one run's checkpoints in `directory`, keeping the newest `keep` (None: all);
    `directory` must pass `check_directory` (checked first)."""

    def __init__(self, directory: str | os.PathLike, keep: int | None):
        path = check_directory(directory)
        ocp = self._ocp = _orbax()
        self.directory = str(path)
        self._lock = _locked(path)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._saved: int | None = self._manager.latest_step()

    def check(self, template, num_steps: int) -> None:
        """Refuse the latest checkpoint if another program wrote it: other state leaves, shapes or
        dtypes than `template`, or more than `num_steps` steps (StateMismatchError naming the first)."""
        if self._saved is None:
            return
        meta = self._meta()
        self._compare(self._where(), "state leaf", meta["state"], _state_specs(template))
        if meta["steps"] > num_steps:
            raise StateMismatchError(
                f"{self._where()} has run {meta['steps']} steps, more than num_steps={num_steps}; pass num_steps >= "
                f"{meta['steps']} or use another checkpoint_dir (nothing was overwritten)")

    def restore(self, template, history_paths: list[str]):
        """The latest checkpoint as ``(steps, state, history leaves, stopped)``, or None when there is none.

        `template` (the caller's state, already `check`ed) gives the structure, dtypes and shardings;
        `history_paths` are this step's aux paths, which the checkpoint's must equal.
        """
        if self._saved is None:
            return None
        ocp, meta = self._ocp, self._meta()
        saved_paths = [p for p, _, _ in meta["history"]]
        if saved_paths != history_paths:
            raise StateMismatchError(
                f"{self._where()} was written by another program: its aux history has paths {saved_paths}, this "
                f"step's aux has {history_paths}; use another checkpoint_dir (nothing was overwritten)")
        leaves, treedef = jax.tree_util.tree_flatten(template)
        items = {"state": ocp.args.StandardRestore([self._abstract(x) for x in leaves])}
        if saved_paths:
            items["history"] = ocp.args.StandardRestore()
        restored = self._read(lambda: self._manager.restore(self._saved, args=ocp.args.Composite(**items)))
        state = wrap_keys(restored["state"], key_impls(leaves))
        history = [np.asarray(h) for h in restored["history"]] if saved_paths else []
        return meta["steps"], jax.tree_util.tree_unflatten(treedef, state), history, meta["stopped"]

    def _meta(self) -> dict:
        ocp = self._ocp
        return self._read(lambda: self._manager.restore(self._saved, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"])

    def _read(self, read: Callable):
        """`read()` of the latest checkpoint; what orbax, tensorstore or json raise on a damaged one (an item
        missing, a file cut short, a checksum off) as a `CheckpointError` naming it and the one before it."""
        try:
            return read()
        except Exception as e:
            cause = str(e).strip().split("\n", 1)[0][:300]
            earlier = [s for s in self._manager.all_steps() if s < self._saved]
            before = (f"move {self._saved} out of the folder to resume from the checkpoint before it (step "
                      f"{max(earlier)})" if earlier else "move it out of the folder to start over (no checkpoint is before it)")
            raise CheckpointError(f"{self._where()} cannot be read ({type(e).__name__}: {cause}); if it is damaged, "
                                  f"{before}, or use another checkpoint_dir (nothing was changed)") from e

    def _where(self) -> str:
        return f"the checkpoint of step {self._saved} in {self.directory}"

    @staticmethod
    def _compare(where: str, what: str, saved: list, here: list) -> None:
        saved_map, here_map = {p: (s, d) for p, s, d in saved}, {p: (s, d) for p, s, d in here}
        for path in [p for p, _, _ in here] + [p for p, _, _ in saved if p not in here_map]:   # tree order
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
        x = raw(x)
        sharding = (x.sharding if isinstance(x, jax.Array) else
                    jax.sharding.make_single_device_sharding(jax.devices()[0]))
        return jax.ShapeDtypeStruct(np.shape(x), dtype(x), sharding=sharding)

    def save(self, steps: int, state, history: Any, stopped: str | None = None, wait: bool = False) -> None:
        """Save the checkpoint of step `steps`; `history` is the aux history of steps ``0..steps``;
        `stopped`: the retcode of a run that its last step ended (None: it may go on).

        Unless `wait`, the files are written in the background; the device-to-host copy is done when
        this returns, so the state may be donated next.
        """
        if steps == self._saved:
            return
        ocp = self._ocp
        leaves = [raw(x) for x in jax.tree_util.tree_leaves(state)]
        history_leaves = jax.tree_util.tree_leaves(history)
        meta = {"steps": steps, "stopped": stopped, "state": _state_specs(state),
                "history": [[p, s[1:], d] for p, s, d in _leaf_specs(history)]}
        items = {"state": ocp.args.StandardSave(leaves), "meta": ocp.args.JsonSave(meta)}
        if history_leaves:
            items["history"] = ocp.args.StandardSave(history_leaves)
        self._manager.save(steps, args=ocp.args.Composite(**items))
        self._saved = steps
        if wait:
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for the save in flight and release the manager and the folder."""
        try:
            self._manager.wait_until_finished()
            self._manager.close()
        finally:
            if self._lock is not None:
                self._lock.close()


_LOCK = ".loopfuse-run.lock"    # held by the run that checkpoints into the folder (its first process)


def _locked(path: Path):
    """The open lock file of `path`, held (``flock``) until it is closed: a second run checkpointing into the same
    folder is a ValueError (two runs' saves and deletions interleaved failed inside orbax or tensorstore). The
    processes of one multi-host run share the folder: its first process alone holds the lock. None where
    the file system has no locks."""
    if jax.process_index() != 0:
        return None
    path.mkdir(parents=True, exist_ok=True)
    lock = open(path / _LOCK, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(f"checkpoint_dir={str(path)!r} is in use: another run checkpoints into it now (it holds "
                         f"{_LOCK}); give each run a folder of its own (nothing was touched)") from None
    except OSError:     # no locks on this file system
        pass
    return lock


class CarriedAs:
    """`Checkpoints` of a state that a driver carries in another layout than the caller's (its layers
    stacked, `chunks.carried`): checked, saved and restored in the caller's layout, so a checkpoint
    does not depend on how a run carried its state. `outside(state)`: the caller's layout of a carried
    state; `inside(state)`: the carried layout of the caller's."""

    def __init__(self, checkpoints: Checkpoints, outside, inside):
        self.checkpoints, self.outside, self.inside = checkpoints, outside, inside

    def check(self, template, num_steps: int) -> None:
        self.checkpoints.check(self.outside(template), num_steps)

    def restore(self, template, history_paths: list[str]):
        restored = self.checkpoints.restore(self.outside(template), history_paths)
        if restored is None:
            return None
        steps, state, history, stopped = restored
        return steps, self.inside(state), history, stopped

    def save(self, steps: int, state, history: Any, stopped: str | None = None, wait: bool = False) -> None:
        self.checkpoints.save(steps, self.outside(state), history, stopped, wait)

    def close(self) -> None:
        self.checkpoints.close()
