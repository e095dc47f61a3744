"""loopfuse: compile the whole optimization step, and the whole inner loop, through MLIR to XLA.

The public names are imported on first use (PEP 562), so that tools which need only the pass
library and MLIR (loopfuse-opt) start without importing jax.
"""
import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {
    "compile_step": "step", "Step": "step", "StepOptions": "options",
    "fit": "fitting", "FitResult": "results",
    "Dataset": "data", "pack": "packed", "PackedState": "packed",
    "MemoryStats": "runtime", "MemoryReport": "memory_report",
    "minimize": "solve", "Solution": "results", "Ensemble": "ensemble", "per_member": "ensemble", "gtol": "convergence", "ftol": "convergence",
    "GradOnly": "backends", "CompiledStep": "backends", "CompiledLoop": "backends", "Reverse": "backends",
    "Forward": "backends",
    "LoopfuseError": "errors", "StateMismatchError": "errors", "DonatedArrayError": "errors", "FitError": "results",
    "MiscompileError": "errors", "AuxPathError": "errors", "MemoryReportError": "errors", "MemoryLimitError": "errors",
    "largest_batch": "batch_fit", "BatchFit": "batch_fit", "MemoryPlan": "memory_plan",
    "PipelineError": "pipeline", "CacheWarning": "cache",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .convergence import ftol, gtol
    from .backends import CompiledLoop, CompiledStep, Forward, GradOnly, Reverse
    from .cache import CacheWarning
    from .data import Dataset
    from .ensemble import Ensemble, per_member
    from .packed import PackedState, pack
    from .errors import (AuxPathError, DonatedArrayError, LoopfuseError, MemoryLimitError, MemoryReportError,
                         MiscompileError, StateMismatchError)
    from .batch_fit import BatchFit, largest_batch
    from .memory_plan import MemoryPlan
    from .memory_report import MemoryReport
    from .fitting import fit
    from .pipeline import PipelineError
    from .runtime import MemoryStats
    from .results import FitError, FitResult, Solution
    from .solve import minimize
    from .options import StepOptions
    from .step import Step, compile_step


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loopfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
