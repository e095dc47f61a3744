"""loopfuse: compile the whole optimization step, and the whole inner loop, through MLIR to XLA."""
from .backends import CompiledLoop, CompiledStep, Forward, GradOnly, Reverse
from .data import Dataset
from .errors import DonatedArrayError, FitError, LoopfuseError, StateMismatchError
from .fit import FitResult, fit
from .runtime import MemoryStats
from .solve import Solution, minimize
from .step import Step, StepOptions, compile_step

__all__ = ["compile_step", "Step", "StepOptions", "fit", "FitResult", "Dataset", "MemoryStats", "minimize", "Solution",
           "GradOnly", "CompiledStep", "CompiledLoop", "Reverse", "Forward", "LoopfuseError",
           "StateMismatchError", "DonatedArrayError", "FitError"]
