"""loopfuse: compile the whole optimization step, and the whole inner loop, through MLIR to XLA."""
from .data import Dataset
from .fit import FitResult, fit
from .errors import DonatedArrayError, LoopfuseError, StateMismatchError
from .runtime import MemoryStats
from .step import Step, compile_step

__all__ = ["compile_step", "Step", "fit", "FitResult", "Dataset", "MemoryStats", "LoopfuseError", "StateMismatchError",
           "DonatedArrayError"]
