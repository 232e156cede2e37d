"""One GPU's VRAM budget: how many trials of a memory model fit at once, and the batch that fits.

The rule, `HardwareBudget.plan_hyperopt`: keep 20% of VRAM free for the CUDA context, the
allocator and fragmentation, size each trial at the minimum batch (the conservative estimate),
fit as many trials as the rest allows (at least 1, at most the swarm), then give each trial an
equal share and let the batch grow into what is left of it after the model's overhead.
Pure functions, no I/O, no torch; `orchestrator.planning.planner` applies it to a whole host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SAFETY_MARGIN = 0.20


@dataclass(frozen=True)
class HyperoptStrategy:
    max_concurrent_trials: int
    batch_size_bounds: tuple[int, int]
    per_trial_memory_mb: float
    total_reserved_mb: float


@dataclass(frozen=True)
class HardwareBudget:
    gpu_memory_mb: float

    @classmethod
    def cpu_only(cls) -> HardwareBudget:
        return cls(gpu_memory_mb=0)

    @property
    def available_mb(self) -> float:
        return self.gpu_memory_mb * (1.0 - SAFETY_MARGIN)

    def trials_that_fit(
        self, model_overhead_mb: float, per_sample_mb: float, min_batch: int
    ) -> float:
        """How many trials at the minimum batch fit in the usable VRAM, before any cap (may be inf)."""
        per_trial_mb = model_overhead_mb + min_batch * per_sample_mb
        if per_trial_mb <= 0:
            return math.inf
        ratio = self.available_mb / per_trial_mb
        return ratio if math.isinf(ratio) else float(math.floor(ratio))

    def plan_hyperopt(
        self,
        model_overhead_mb: float,
        per_sample_mb: float,
        min_batch: int,
        max_batch: int,
        swarm_size: int,
    ) -> HyperoptStrategy:
        _check_inputs(
            self.gpu_memory_mb, model_overhead_mb, per_sample_mb, min_batch, max_batch, swarm_size
        )
        per_trial_mb = model_overhead_mb + min_batch * per_sample_mb
        if self.gpu_memory_mb == 0:
            return HyperoptStrategy(1, (min_batch, max_batch), per_trial_mb, per_trial_mb)

        fit = self.trials_that_fit(model_overhead_mb, per_sample_mb, min_batch)
        concurrency = int(max(1, min(swarm_size, fit)))
        upper = batch_upper_bound(
            self.available_mb, concurrency, model_overhead_mb, per_sample_mb, min_batch, max_batch
        )
        return HyperoptStrategy(
            max_concurrent_trials=concurrency,
            batch_size_bounds=(min_batch, upper),
            per_trial_memory_mb=per_trial_mb,
            total_reserved_mb=per_trial_mb * concurrency,
        )


def batch_upper_bound(
    available_mb: float,
    concurrency: int,
    model_overhead_mb: float,
    per_sample_mb: float,
    min_batch: int,
    max_batch: int,
) -> int:
    """The largest batch that fits one trial's equal share of `available_mb`, within [min, max]."""
    batch_budget = available_mb / concurrency - model_overhead_mb
    if batch_budget > 0 and per_sample_mb > 0:
        ratio = batch_budget / per_sample_mb  # may overflow to inf for a vanishing per-sample cost
        return int(max_batch) if ratio >= max_batch else int(max(min_batch, math.floor(ratio)))
    if batch_budget > 0:
        return int(max_batch)  # batch size costs nothing measurable
    return int(min_batch)


def _check_inputs(
    gpu_memory_mb: float,
    model_overhead_mb: float,
    per_sample_mb: float,
    min_batch: int,
    max_batch: int,
    swarm_size: int,
) -> None:
    if gpu_memory_mb < 0:
        raise ValueError(
            f"gpu_memory_mb={gpu_memory_mb} is negative: give the GPU's total VRAM in MB"
        )
    if model_overhead_mb < 0 or per_sample_mb < 0:
        raise ValueError("model_overhead_mb and per_sample_mb must be zero or more")
    if min_batch < 1 or max_batch < min_batch:
        raise ValueError(f"batch bounds ({min_batch}, {max_batch}) must satisfy 1 <= min <= max")
    if swarm_size < 1:
        raise ValueError(f"swarm_size={swarm_size} must be at least 1")
