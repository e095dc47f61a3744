"""loopfuse: compile the whole optimization step, and the whole inner loop, through MLIR to XLA.

The public names are imported on first use (PEP 562), so that tools which need only the pass
library and MLIR (loopfuse-opt) start without importing jax.
"""
import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it (under loopfuse)
_EXPORTS = {
    "compile_step": "drivers.step", "Step": "drivers.step", "StepOptions": "compile.options",
    "fit": "drivers.fitting", "FitResult": "drivers.results",
    "Dataset": "state.data", "pack": "state.packed", "PackedState": "state.packed",
    "MemoryStats": "run.runtime", "MemoryReport": "memory.memory_report",
    "minimize": "drivers.solve", "Solution": "drivers.results", "Ensemble": "drivers.ensemble",
    "per_member": "drivers.ensemble", "gtol": "drivers.convergence", "ftol": "drivers.convergence",
    "GradOnly": "drivers.backends", "CompiledStep": "drivers.backends", "CompiledLoop": "drivers.backends",
    "Reverse": "drivers.backends", "Forward": "drivers.backends",
    "LoopfuseError": "errors", "StateMismatchError": "errors", "DonatedArrayError": "errors", "FitError": "drivers.results",
    "MiscompileError": "errors", "AuxPathError": "errors", "MemoryReportError": "errors", "MemoryLimitError": "errors",
    "InitFoldError": "errors", "CheckpointError": "errors",
    "largest_batch": "drivers.batch_fit", "BatchFit": "drivers.batch_fit", "MemoryPlan": "memory.memory_plan",
    "PipelineError": "compile.pipeline", "CacheWarning": "compile.cache",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .compile.cache import CacheWarning
    from .compile.options import StepOptions
    from .compile.pipeline import PipelineError
    from .drivers.backends import CompiledLoop, CompiledStep, Forward, GradOnly, Reverse
    from .drivers.batch_fit import BatchFit, largest_batch
    from .drivers.convergence import ftol, gtol
    from .drivers.ensemble import Ensemble, per_member
    from .drivers.fitting import fit
    from .drivers.results import FitError, FitResult, Solution
    from .drivers.solve import minimize
    from .drivers.step import Step, compile_step
    from .errors import (AuxPathError, CheckpointError, DonatedArrayError, InitFoldError, LoopfuseError,
                         MemoryLimitError, MemoryReportError, MiscompileError, StateMismatchError)
    from .memory.memory_plan import MemoryPlan
    from .memory.memory_report import MemoryReport
    from .run.runtime import MemoryStats
    from .state.data import Dataset
    from .state.packed import PackedState, pack

def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loopfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
