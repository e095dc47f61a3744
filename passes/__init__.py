"""The loopfuse pass library: StableHLO module in, StableHLO module out.

Each pass lives in its own module and exposes ``run(module_op, **options)``. A pipeline is
the mlir-opt textual form, ``builtin.module(alias-state,wrap-loop{steps=8},canonicalize)``;
names not in ``PASSES`` are handed to MLIR's own pass registry (canonicalize, cse, inline ...).
"""
from . import alias_state, drop_unused_outputs, flatten_update, simplify, wrap_loop

PASSES = {
    "alias-state": alias_state.run,
    "drop-unused-outputs": drop_unused_outputs.run,
    "flatten-update": flatten_update.run,
    "simplify": simplify.run,
    "wrap-loop": wrap_loop.run,
}
