"""A host's plan: how many trials fit on each GPU at once, and which batch sizes. Pure, no torch.

The VRAM rule for one GPU is `HardwareBudget.plan_hyperopt` in
`orchestrator.planning.hardware_budget` (20% kept free, each trial sized at the smallest batch, at
most the swarm). `plan_node` applies it to every GPU of a host and adds the limits that VRAM
does not see: the host's CPU cores for CPU-bound work (RL environments, shared out by
`orchestrator.planning.cpu_cores`), a user's explicit `--concurrency`, and the study's budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN
from orchestrator.planning.cpu_cores import share_cores
from orchestrator.planning.hardware_budget import (
    HardwareBudget,
    HyperoptStrategy,
    batch_upper_bound,
)
from orchestrator.record.study.spec import StudySpec

if TYPE_CHECKING:
    from adapters.base import MemoryModel
    from orchestrator.gpu.base import Device

# What bound a GPU's concurrency, in the words the plan prints.
LIMITS = ("vram", "swarm", "cpu", "user", "budget", "no gpu")


@dataclass(frozen=True)
class GpuPlan:
    """What one GPU runs: at most `slots` trials at once, each with a batch size in `batch_bounds`.

    `strategy` is the VRAM-only plan for this GPU (`HardwareBudget.plan_hyperopt`). `slots` caps
    the trials at once: how many of the smallest fit its usable VRAM, lowered by the swarm, the
    CPU cores for CPU-bound work, the user's --concurrency and the study's budget; beneath it the
    supervisor admits each trial by its own footprint. `batch_bounds` is what fits on this GPU
    alone, so the sampler can try every batch size that fits. `limited_by` names the limit that
    bound `slots`: vram, swarm, cpu, user, budget, or "no gpu" (the CPU-only plan).
    """

    device: Device | None
    strategy: HyperoptStrategy
    slots: int
    batch_bounds: tuple[int, int]
    limited_by: str
    memory_model: MemoryModel
    memory_model_source: str
    # The most trials one process may train as a fused group here (--fuse auto): what fits the
    # usable VRAM at the minimum batch with what a process pays once counted once, within the
    # swarm, --concurrency and the budget. Not the cores: a group is one process.
    group_members: int = 1

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
                "per_process_mb": self.memory_model.per_process_mb,
                "source": self.memory_model_source,
            },
            "per_trial_mb": self.per_trial_mb,
            "vram_slots": self.strategy.max_concurrent_trials,
            "slots": self.slots,
            "limited_by": self.limited_by,
            "group_members": self.group_members,
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
    swarm_size: int = StudySpec.swarm_size,
    min_batch: int = BATCH_SIZE_MIN,
    max_batch: int = BATCH_SIZE_MAX,
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
    footprint (`orchestrator.run.pool.admission`), so no batch size is given up to run more at once.
    `gpu_memory_models` maps a GPU name to a (model, source) measured on that kind of GPU; it
    replaces `memory_model` on devices of that name.
    """
    _check_node_inputs(cpu_cores, concurrency)
    if not devices:
        only = cpu_only_plan(
            memory_model,
            memory_model_source,
            cpu_bound=cpu_bound,
            cpu_cores=cpu_cores,
            swarm_size=swarm_size,
            batch_bounds=(min_batch, max_batch),
            caps=(concurrency, budget_trials),
        )
        return NodePlan((only,), cpu_cores, cpu_bound)
    measured = gpu_memory_models or {}
    models = [measured.get(d.name, (memory_model, memory_model_source)) for d in devices]
    vram = [
        vram_plan(device, model, min_batch, max_batch, swarm_size)
        for device, (model, _) in zip(devices, models, strict=True)
    ]
    wants = [capped(s.max_concurrent_trials, concurrency, budget_trials) for s, _ in vram]
    shares = share_cores(wants, cpu_cores) if cpu_bound else wants
    plans = []
    for device, (model, source), (strategy, vram_limit), want, slots in zip(
        devices, models, vram, wants, shares, strict=True
    ):
        limited_by = what_bound(
            slots, want, strategy.max_concurrent_trials, concurrency, vram_limit
        )
        upper = largest_batch_alone(device, model, min_batch, max_batch)
        group = fused_fit(device, model, min_batch, capped(swarm_size, concurrency, budget_trials))
        plans.append(
            GpuPlan(device, strategy, slots, (min_batch, upper), limited_by, model, source, group)
        )
    return NodePlan(tuple(plans), cpu_cores, cpu_bound)


def _check_node_inputs(cpu_cores: int, concurrency: int | None) -> None:
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores={cpu_cores} must be at least 1")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be at least 1")


def vram_plan(
    device: Device, model: MemoryModel, min_batch: int, max_batch: int, swarm_size: int
) -> tuple[HyperoptStrategy, str]:
    """The VRAM-only plan for one GPU (`HardwareBudget.plan_hyperopt`), and what bound it:
    "swarm" when more trials would fit than the swarm has, else "vram"."""
    budget = HardwareBudget(device.total_mb)
    strategy = budget.plan_hyperopt(
        model.model_overhead_mb, model.per_sample_mb, min_batch, max_batch, swarm_size
    )
    fit = budget.trials_that_fit(model.model_overhead_mb, model.per_sample_mb, min_batch)
    return strategy, "swarm" if fit > swarm_size else "vram"


def capped(vram_slots: int, concurrency: int | None, budget_trials: int | None) -> int:
    """The slots a GPU wants: what its VRAM allows, lowered by --concurrency and the budget."""
    return min([vram_slots, *(cap for cap in (concurrency, budget_trials) if cap is not None)])


def what_bound(
    slots: int, want: int, vram_slots: int, concurrency: int | None, vram_limit: str
) -> str:
    """The limit that bound a GPU's slots, in the words the plan prints (see `LIMITS`)."""
    if slots < want:
        return "cpu"
    if want < vram_slots:
        return "user" if want == concurrency else "budget"
    return vram_limit


def fused_fit(device: Device, model: MemoryModel, min_batch: int, cap: int) -> int:
    """The most trials at the minimum batch that one process trains as a fused group within the
    GPU's usable VRAM, from 1 to `cap`."""
    usable = HardwareBudget(device.total_mb).available_mb
    once = model.fused_mb([])  # what the process pays however many it trains
    member = model.fused_mb([min_batch]) - once
    if member <= 0:
        return cap
    return int(max(1, min(cap, (usable - once) // member)))


def largest_batch_alone(device: Device, model: MemoryModel, min_batch: int, max_batch: int) -> int:
    """The upper batch bound: the largest batch that fits the GPU's usable VRAM alone."""
    return batch_upper_bound(
        HardwareBudget(device.total_mb).available_mb,
        1,
        model.model_overhead_mb,
        model.per_sample_mb,
        min_batch,
        max_batch,
    )


def cpu_only_plan(
    memory_model: MemoryModel,
    memory_model_source: str,
    *,
    cpu_bound: bool,
    cpu_cores: int,
    swarm_size: int,
    batch_bounds: tuple[int, int],
    caps: tuple[int | None, int | None],
) -> GpuPlan:
    """The plan of a host without a GPU; `caps` are (--concurrency, the study's budget)."""
    min_batch, max_batch = batch_bounds
    strategy = HardwareBudget.cpu_only().plan_hyperopt(
        memory_model.model_overhead_mb,
        memory_model.per_sample_mb,
        min_batch,
        max_batch,
        swarm_size,
    )
    slots, limited_by = _cpu_only_slots(cpu_bound, cpu_cores, swarm_size, *caps)
    return GpuPlan(
        None,
        strategy,
        slots,
        strategy.batch_size_bounds,
        limited_by,
        memory_model,
        memory_model_source,
    )


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
