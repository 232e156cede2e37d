"""How many trials fit on a GPU at once, and which batch sizes: pure functions, no I/O, no torch.

The formula is seed 002's `HardwareBudget::plan_hyperopt`: keep 20% of VRAM free for the CUDA
allocator and fragmentation, size each trial at the minimum batch (the conservative estimate),
fit as many trials as the rest allows (at least 1, at most the swarm), then give each trial an
equal share and let the batch grow into what is left of it after the model's overhead.

`plan_node` applies it to every GPU of a host and adds the limits that VRAM does not see: the
host's CPU cores for CPU-bound work (RL environments), and a user's explicit `--concurrency`.
`usable_cpu_cores` (at the bottom) is the one function here that reads the machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.base import MemoryModel
    from orchestrator.gpu.base import Device

SAFETY_MARGIN = 0.20

# What bound a GPU's concurrency, in the words the plan prints.
LIMITS = ("vram", "swarm", "cpu", "user", "budget", "no gpu")


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


# --- a whole node -------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPlan:
    """What one GPU runs: at most `slots` trials at once, each with a batch size in `batch_bounds`.

    `strategy` is the seed's VRAM-only plan for this GPU. `slots` is a cap on trials at once: how
    many of the smallest fit its usable VRAM, lowered by the swarm, the CPU cores for CPU-bound
    work, the user's --concurrency and the study's budget; beneath it the supervisor admits each
    trial by its own footprint. `batch_bounds` is what fits on this GPU alone, so the sampler can
    try every batch size that fits. `limited_by` names the limit that bound `slots`: vram, swarm,
    cpu, user, budget, or "no gpu" (the CPU-only plan).
    """

    device: Device | None
    strategy: HyperoptStrategy
    slots: int
    batch_bounds: tuple[int, int]
    limited_by: str
    memory_model: MemoryModel
    memory_model_source: str

    @property
    def total_mb(self) -> float:
        return float(self.device.total_mb) if self.device is not None else 0.0

    @property
    def usable_mb(self) -> float:
        return HardwareBudget(self.total_mb).available_mb

    @property
    def per_trial_mb(self) -> float:
        """A trial's estimate at the minimum batch (what concurrency is sized by)."""
        return self.strategy.per_trial_memory_mb

    @property
    def reserved_mb(self) -> float:
        return self.per_trial_mb * self.slots

    @property
    def largest_trial_mb(self) -> float:
        """A trial's estimate at the upper batch bound: it fits the usable VRAM alone."""
        return self.memory_model.planned_mb(self.batch_bounds[1])

    @property
    def typical_trial_mb(self) -> float:
        """A trial's estimate at the middle of the batch range (log scale)."""
        low, high = self.batch_bounds
        return self.memory_model.planned_mb(round(math.sqrt(low * high)))

    def trials_at_once(self, trial_mb: float) -> int:
        """How many trials of `trial_mb` fit the usable VRAM together, within `slots`."""
        if self.device is None or trial_mb <= 0:
            return self.slots
        return max(1, min(self.slots, int(self.usable_mb // trial_mb)))

    @property
    def fits(self) -> bool:
        """False when even one trial at the minimum batch needs more than the usable VRAM."""
        return self.device is None or self.per_trial_mb <= self.usable_mb

    def as_dict(self) -> dict[str, Any]:
        device = self.device
        return {
            "device": None
            if device is None
            else {
                "index": device.index,
                "name": device.name,
                "uuid": device.uuid,
                "kind": device.kind,
                "total_mb": device.total_mb,
            },
            "usable_mb": self.usable_mb,
            "memory_model": {
                "model_overhead_mb": self.memory_model.model_overhead_mb,
                "per_sample_mb": self.memory_model.per_sample_mb,
                "source": self.memory_model_source,
            },
            "per_trial_mb": self.per_trial_mb,
            "vram_slots": self.strategy.max_concurrent_trials,
            "slots": self.slots,
            "limited_by": self.limited_by,
            "batch_bounds": list(self.batch_bounds),
            "reserved_mb": self.reserved_mb,
            "largest_trial_mb": self.largest_trial_mb,
            "typical_trial_mb": self.typical_trial_mb,
            "at_once": {
                "smallest": self.trials_at_once(self.per_trial_mb),
                "typical": self.trials_at_once(self.typical_trial_mb),
                "largest": self.trials_at_once(self.largest_trial_mb),
            },
            "fits": self.fits,
        }


@dataclass(frozen=True)
class NodePlan:
    gpus: tuple[GpuPlan, ...]
    cpu_cores: int
    cpu_bound: bool

    @property
    def total_slots(self) -> int:
        return sum(gpu.slots for gpu in self.gpus)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cpu_cores": self.cpu_cores,
            "cpu_bound": self.cpu_bound,
            "total_slots": self.total_slots,
            "gpus": [gpu.as_dict() for gpu in self.gpus],
        }


def plan_node(
    devices: Sequence[Device],
    memory_model: MemoryModel,
    *,
    cpu_bound: bool,
    cpu_cores: int,
    swarm_size: int = 20,
    min_batch: int = 64,
    max_batch: int = 4096,
    memory_model_source: str = "declared",
    concurrency: int | None = None,
    gpu_memory_models: Mapping[str, tuple[MemoryModel, str]] | None = None,
    budget_trials: int | None = None,
) -> NodePlan:
    """One plan per GPU of a host (or one CPU-only plan when there is no GPU: a slot per core for
    CPU-bound work, one slot otherwise).

    For CPU-bound work the slots of all GPUs add up to at most `cpu_cores`, shared fairly (each GPU
    keeps at least 1 slot, so a host with fewer cores than GPUs still uses every GPU once).
    `concurrency` is a user's cap per GPU: it lowers a plan, never raises it past VRAM;
    `budget_trials` (the study's budget) caps it too: a 12-trial study never runs 39 at once.
    A GPU's batch bounds are what fits on it alone: the supervisor admits trials by their own
    footprint (`orchestrator.run.admission`), so no batch size is given up to run more at once.
    `gpu_memory_models` maps a GPU name to a (model, source) measured on that kind of GPU; it
    replaces `memory_model` on devices of that name.
    """
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores={cpu_cores} must be at least 1")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be at least 1")
    measured = gpu_memory_models or {}

    if not devices:
        strategy = HardwareBudget.cpu_only().plan_hyperopt(
            memory_model.model_overhead_mb,
            memory_model.per_sample_mb,
            min_batch,
            max_batch,
            swarm_size,
        )
        slots, limited_by = _cpu_only_slots(
            cpu_bound, cpu_cores, swarm_size, concurrency, budget_trials
        )
        only = GpuPlan(
            None,
            strategy,
            slots,
            strategy.batch_size_bounds,
            limited_by,
            memory_model,
            memory_model_source,
        )
        return NodePlan((only,), cpu_cores, cpu_bound)

    models: list[tuple[MemoryModel, str]] = []
    strategies: list[HyperoptStrategy] = []
    vram_limits: list[str] = []
    for device in devices:
        model, source = measured.get(device.name, (memory_model, memory_model_source))
        budget = HardwareBudget(device.total_mb)
        strategy = budget.plan_hyperopt(
            model.model_overhead_mb, model.per_sample_mb, min_batch, max_batch, swarm_size
        )
        fit = budget.trials_that_fit(model.model_overhead_mb, model.per_sample_mb, min_batch)
        models.append((model, source))
        strategies.append(strategy)
        vram_limits.append("swarm" if fit > swarm_size else "vram")

    caps = {"user": concurrency, "budget": budget_trials}
    wants = [
        min([s.max_concurrent_trials, *(cap for cap in caps.values() if cap is not None)])
        for s in strategies
    ]
    shares = share_cores(wants, cpu_cores) if cpu_bound else wants

    plans = []
    for device, (model, source), strategy, vram_limit, want, slots in zip(
        devices, models, strategies, vram_limits, wants, shares, strict=True
    ):
        if slots < want:
            limited_by = "cpu"
        elif want < strategy.max_concurrent_trials:
            limited_by = "user" if want == concurrency else "budget"
        else:
            limited_by = vram_limit
        upper = batch_upper_bound(
            HardwareBudget(device.total_mb).available_mb,
            1,
            model.model_overhead_mb,
            model.per_sample_mb,
            min_batch,
            max_batch,
        )
        plans.append(
            GpuPlan(device, strategy, slots, (min_batch, upper), limited_by, model, source)
        )
    return NodePlan(tuple(plans), cpu_cores, cpu_bound)


def _cpu_only_slots(
    cpu_bound: bool,
    cpu_cores: int,
    swarm_size: int,
    concurrency: int | None,
    budget_trials: int | None,
) -> tuple[int, str]:
    """Without a GPU, CPU-bound trials (RL: one torch thread each) get a core each; other work
    runs one at a time, its torch threads using every core."""
    if not cpu_bound:
        return 1, "no gpu"
    limits = {"cpu": cpu_cores, "swarm": swarm_size}
    if concurrency is not None:
        limits["user"] = concurrency
    if budget_trials is not None:
        limits["budget"] = budget_trials
    limited_by = min(limits, key=lambda name: limits[name])
    return limits[limited_by], limited_by


def share_cores(wants: Sequence[int], cores: int) -> list[int]:
    """Split `cores` over GPUs that want `wants` slots: round-robin, one core at a time.

    Every GPU gets at least 1; no GPU gets more than it wants; the shares differ by at most one
    between GPUs that wanted more than they got. The sum is at most max(cores, len(wants)).
    """
    given = [1] * len(wants)
    left = cores - len(wants)
    while left > 0:
        progressed = False
        for i, want in enumerate(wants):
            if left > 0 and given[i] < want:
                given[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return given


def threads_per_trial(cpu_cores: int, total_slots: int, *, cpu_bound: bool = False) -> int:
    """Torch threads for one trial. CPU-bound work (RL: small networks, environment steps) runs
    fastest on one thread each, the planner already keeping trials within the cores; other work
    shares the host's cores among the trials that run at once."""
    if cpu_bound:
        return 1
    return max(1, cpu_cores // max(1, total_slots))


# --- reading the machine (not pure) -------------------------------------------------------


def usable_cpu_cores() -> int:
    """Cores this process may use: its CPU affinity, lowered by a cgroup CPU quota if one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores)


def _cgroup_quota_cores(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    try:
        text = (root / "cpu.max").read_text()  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
    except OSError:
        text = None
    if text is not None:
        return cores_from_quota(*(text.split() + ["", ""])[:2])
    try:  # cgroup v1
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text()
    except OSError:
        return None
    return cores_from_quota(quota.strip(), period.strip())


def cores_from_quota(quota: str, period: str) -> int | None:
    """Whole cores a cgroup quota allows (a 1.5-core quota runs 1 busy process without throttling)."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None  # "max": no quota
    if quota_us <= 0 or period_us <= 0:
        return None  # v1 writes -1 for no quota
    return max(1, quota_us // period_us)
