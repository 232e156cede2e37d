"""What a running pool looks like at one moment: the values a progress display shows.

`gpu_snapshot` and `pool_snapshot` read them off the pool's parts (its supervisors, the GPU
probe, the study); the pool calls them once a second and whenever a trial finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.gpu.base import Probe
    from orchestrator.run.pool.stored_study import StoredStudy
    from orchestrator.run.pool.supervisor import Supervisor


@dataclass(frozen=True)
class GpuSnapshot:
    label: str  # e.g. "cuda:0 NVIDIA L4" or "sim:1 Simulated GPU 24 GB" or "cpu"
    slots: int  # trials allowed at once now
    max_slots: int  # what the plan allows
    running: int  # trial processes alive on it now
    vram_used_mb: float | None  # total minus free, from the probe (None without a GPU)
    vram_total_mb: float | None
    ooms: int  # trials that ran out of memory on it since this worker started
    batch_bounds: tuple[int, int]


@dataclass(frozen=True)
class PoolSnapshot:
    study_name: str
    budget: int  # the study's --trials
    counted: int  # trials that used up budget: complete, pruned, failed for good
    running: int  # running in the whole study, every node
    waiting: int  # queued for a re-run
    best_value: float | None
    best_trial: int | None
    direction: str  # "minimize" or "maximize"
    metric: str
    elapsed_s: float
    gpus: tuple[GpuSnapshot, ...]
    ooms: int  # trials that ran out of memory under this worker
    retries: int  # re-queued trials in the whole study
    counted_at_start: int = 0  # counted when this worker started: a resumed study's earlier trials
    front: int | None = None  # several objectives: trials on their Pareto front (no one is best)

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far, once anything finished."""
        done_here = self.counted - self.counted_at_start
        if done_here <= 0 or self.counted >= self.budget:
            return None
        return self.elapsed_s / done_here * (self.budget - self.counted)


def gpu_snapshot(
    supervisor: Supervisor, probe: Probe, batch_bounds: tuple[int, int]
) -> GpuSnapshot:
    """One GPU now; `batch_bounds` are what a trial starting on it now may draw."""
    device = supervisor.plan.device
    used = total = None
    if device is not None:
        total = device.total_mb
        used = max(0.0, total - probe.free_mb(device))
    return GpuSnapshot(
        label=supervisor.label,
        slots=supervisor.trials_that_fit(supervisor.budget.allowance_mb),
        max_slots=supervisor.budget.max_trials,
        running=len(supervisor.admitted()),
        vram_used_mb=used,
        vram_total_mb=total,
        ooms=supervisor.ooms,
        batch_bounds=batch_bounds,
    )


def pool_snapshot(
    study: StoredStudy,
    gpus: tuple[GpuSnapshot, ...],
    *,
    metric: str,
    elapsed_s: float,
    counted_at_start: int,
) -> PoolSnapshot:
    """The whole pool now: the study's count and best trial, and each GPU."""
    count = study.count()
    best = study.best()
    return PoolSnapshot(
        study_name=study.name,
        budget=study.budget,
        counted=count.counted,
        running=count.running,
        waiting=count.waiting,
        best_value=best.value if best else None,
        best_trial=best.number if best else None,
        direction=study.direction,
        metric=metric,
        elapsed_s=elapsed_s,
        gpus=gpus,
        ooms=sum(gpu.ooms for gpu in gpus),
        retries=count.retried,
        counted_at_start=counted_at_start,
        front=study.front_size(count.counted),
    )
