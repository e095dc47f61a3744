"""`largest_batch`: the largest batch size whose memory plan fits a limit, from compiled figures alone."""
from dataclasses import dataclass, replace
from typing import Callable

import jax
import numpy as np

from .. import validate
from ..compile import compiler
from ..memory.memory_plan import TRACED, Floor, MemoryPlan, Programs, candidates, choose, limit_bytes
from ..memory.memory_report import size_text
from ..state import static_leaves
from ..state.data import Dataset
from .step import Step


@dataclass(frozen=True)
class BatchFit:
    """`largest_batch`'s answer: the largest `batch_size` whose plan fits the limit, that `plan` (its
    `MemoryPlan`), the least peak found at each batch size probed (`probes`, bytes) and the `compiles` the
    search took; `capped` where `max_batch` itself fits."""

    batch_size: int
    plan: MemoryPlan
    probes: dict
    compiles: int
    capped: bool

    def __str__(self) -> str:
        probes = ", ".join(f"{b}: {size_text(p)}" for b, p in sorted(self.probes.items()))
        return (f"largest batch under memory_limit {size_text(self.plan.limit)}: {self.batch_size}"
                f"{' (max_batch)' if self.capped else ''}, {self.plan.chosen}; the least peak at each batch size "
                f"probed: {probes}; {self.compiles} program(s) compiled\n{self.plan}")


def largest_batch(step, state, make_batch: Callable[[int], object], memory_limit: int | str | None = None, *,
                  max_batch: int = 2**16) -> BatchFit:
    """The largest batch size whose plan fits `memory_limit`, from compiled figures alone (nothing runs, so
    nothing runs out of memory), with the plan it needs.

    `step` is a `Step` (its options kept; its `memory_limit` where `memory_limit` is None) or a step function;
    ``make_batch(n)`` builds a batch of `n` examples. The sizes tried are ``unit * 2**k`` up to `max_batch`,
    `unit` being the step's `micro_batches` (1 when it gives none: with more slices any batch whose arrays
    fit would run, as gradient accumulation) times the devices the batch is split over. A binary search over
    k compiles, at each size it probes, the plan of the least memory in that many slices (the least remat
    budget); the answer is the largest size where that fits, with the plan `compile_step(...,
    memory_limit=...)` of the step's options chooses there: O(log(max_batch)) compiles, and a few more for the
    plan. Where even `unit` examples do not fit, the `MemoryLimitError` of that size.
    """
    max_batch = validate.steps(max_batch, "max_batch")
    if not isinstance(step, Step):
        step = Step(step)
    limit = step.options.memory_limit if memory_limit is None else validate.memory_limit(memory_limit)
    if limit is None:
        raise ValueError("largest_batch needs a memory_limit (bytes, a size such as \"2GiB\", or \"device\")")
    state = static_leaves.wrap(state)     # (an equinox model's function leaves: its structure)
    own = step._for(state)
    options = replace(own.options, memory_limit=limit)
    slices = options.micro_batches or 1
    devices = len(options.placement.devices) if options.placement is not None else 1
    unit = slices * devices
    if unit > max_batch:
        raise ValueError(f"max_batch={max_batch} is below the smallest batch the step can split ({unit})")
    top = (max_batch // unit).bit_length() - 1          # sizes unit * 2**k, k = 0 .. top
    batches: dict[int, object] = {}
    programs: dict[int, Programs] = {}

    def programs_at(k: int) -> Programs:
        if k not in programs:
            batches[k] = own._serve(_of_rows(make_batch(unit << k), unit << k))
            programs[k] = Programs.traced(own.fn, options, state, batches[k], {})
            programs[k].lowered(TRACED)        # first: a plan whose pass declines is the step as traced
        return programs[k]

    least = candidates(replace(options, micro_batches=slices), [])[-1]   # the most recompute in `slices`
    bytes_limit = limit_bytes(limit, options.program_devices)
    probes: dict[int, int] = {}
    lo, hi = -1, top + 1                  # the largest k known to fit, the least known not to
    while hi - lo > 1:
        k = (lo + hi) // 2
        at = programs_at(k)
        probes[unit << k] = at.compiled(at.same_as(least) or least).memory.peak
        lo, hi = (k, hi) if probes[unit << k] <= bytes_limit else (lo, k)
    k = max(lo, 0)
    at = programs_at(k)
    found = choose(at, bytes_limit, candidates(options, compiler.slice_counts(batches[k], options.placement)))
    if isinstance(found, Floor):
        raise found.error(at)
    return BatchFit(unit << k, found, probes, sum(p.compiles for p in programs.values()), capped=lo == top)


def _of_rows(batch, n: int):
    """`batch`, checked to hold `n` examples (a `Dataset` of that batch size, or a leaf with an axis of `n`, the
    examples' wherever it is): a size that `make_batch` ignores would be probed as another and fit falsely."""
    if isinstance(batch, Dataset):
        sizes = {batch.batch_size}
    else:
        sizes = {d for x in jax.tree_util.tree_leaves(batch) for d in np.shape(x)}
    if n not in sizes:
        raise ValueError(f"make_batch({n}) returned a batch without {n} examples (its leaves' axes: "
                         f"{sorted(sizes)}): largest_batch probes each size with the batch make_batch builds for it")
    return batch
