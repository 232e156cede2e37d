"""What a running pool looks like at one moment: the values a progress display shows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSnapshot:
    label: str  # e.g. "cuda:0 NVIDIA L4" or "sim:1 Simulated GPU 24 GB" or "cpu"
    slots: int  # trials allowed at once now
    max_slots: int  # what the plan allows
    running: int  # trial processes alive on it now
    vram_used_mb: float | None  # total minus free, from the probe (None without a GPU)
    vram_total_mb: float | None
    ooms: int  # out-of-memory failures on it since this worker started
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
    ooms: int  # out-of-memory failures seen by this worker
    retries: int  # re-queued trials in the whole study
    counted_at_start: int = 0  # counted when this worker started: a resumed study's earlier trials

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far, once anything finished."""
        done_here = self.counted - self.counted_at_start
        if done_here <= 0 or self.counted >= self.budget:
            return None
        return self.elapsed_s / done_here * (self.budget - self.counted)
