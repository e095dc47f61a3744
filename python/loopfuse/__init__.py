"""loopfuse: compile the whole optimization step, and the whole inner loop, through MLIR to XLA."""
from .data import Dataset
from .errors import DonatedArrayError, LoopfuseError, StateMismatchError
from .runtime import MemoryStats
from .step import CompiledStep, compile_step

__all__ = ["compile_step", "CompiledStep", "Dataset", "MemoryStats", "LoopfuseError", "StateMismatchError",
           "DonatedArrayError"]
