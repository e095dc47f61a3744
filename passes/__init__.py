"""The loopfuse pass library: StableHLO module in, StableHLO module out.

Each pass is a `ModulePass` (a frozen dataclass whose fields are its typed options) in its own
module. A pipeline is the mlir-opt textual form, ``builtin.module(alias-state,wrap-loop{steps=8},cse)``;
names not in ``PASSES`` are handed to MLIR's own pass registry (canonicalize, cse, inline ...).
"""
from .alias_state import AliasState
from .canonicalize import FoldSlices
from .cond_to_select import CondToSelect
from .drop_unused_outputs import DropUnusedOutputs
from .flatten_update import FlattenUpdate
from .fold_init import FoldInit
from .micro_batch import MicroBatch
from .module_pass import ModulePass, PassError, PassOptionError
from .pack_state import PackState
from .roll_layers import RollLayers
from .simplify import Simplify
from .wrap_loop import WrapLoop

PASSES: dict[str, type[ModulePass]] = {p.name: p for p in (
    AliasState, CondToSelect, DropUnusedOutputs, FlattenUpdate, FoldInit, FoldSlices, MicroBatch, PackState, RollLayers,
    Simplify, WrapLoop)}
