"""What one trial needs on one kind of GPU, learnt while the study runs: pure values.

A `Footprint` starts from a memory model (the adapter's declared one, or one measured earlier)
and learns from every trial that finishes on that kind of GPU:

- a finished trial's measured peak (CUDA's `max_memory_reserved` on a real GPU, the ledger on a
  simulated one) over what the base model says for its batch size is a ratio. A trial's
  expected footprint (`planned_mb`, what admission counts against the allowance) is the base
  times the median of the recent ratios; its worst case (`worst_mb`, what must fit in the GPU's
  free memory) is the base times a high quantile of them (`WORST_QUANTILE`; the largest while
  there are few). So one trial that needed 3x its estimate makes every later estimate 3x too,
  an estimate that was too cautious comes down, and trials that merely vary around it are
  packed by what they need on average while none is started where its worst case cannot fit;
- an out-of-memory error says the trial needed more than the room it was admitted into: both
  estimates for that batch size go above that room (by `OOM_MARGIN`), so the same trial is never
  admitted again into the same occupancy, and an estimate 3x too low costs one or two OOMs, not
  one per ramp-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from adapters.base import MemoryModel

WORST_QUANTILE = 0.75
OOM_MARGIN = 1.1  # an OOM'd trial's estimate goes this far above the room it did not fit in
MAX_POINTS = 200  # the most recent peaks a fit uses


@dataclass(frozen=True)
class Footprint:
    base: MemoryModel  # what the run started from
    source: str  # "declared", "measured (...)": where `base` came from
    peaks: tuple[tuple[int, float], ...] = ()  # (batch size, peak MB) of finished trials
    oom_scale: float = 0.0  # every estimate is at least base x this, after an OOM

    def ratios(self) -> list[float]:
        return [peak / self.base.planned_mb(batch) for batch, peak in self.peaks]

    def model(self, quantile: float = 0.5) -> MemoryModel:
        """The memory model the peaks say at `quantile` of their ratios, before any OOM's floor."""
        if not self.peaks:
            return self.base
        return self.base.scaled(ratio_quantile(self.ratios(), quantile))

    def planned_mb(self, batch_size: int | None, members: int = 1) -> float:
        """What one trial at `batch_size` is expected to hold (None: a model with no batch size);
        with `members`, what a fused group of that many at that batch size holds."""
        return self._floored(self.model(0.5), batch_size, members)

    def worst_mb(self, batch_size: int | None, members: int = 1) -> float:
        """What one trial (or group) at `batch_size` may hold, as far as the trials so far say."""
        return self._floored(self.model(WORST_QUANTILE), batch_size, members)

    def _floored(self, model: MemoryModel, batch_size: int | None, members: int) -> float:
        batches = [0 if batch_size is None else int(batch_size)] * members
        return max(model.fused_mb(batches), self.base.fused_mb(batches) * self.oom_scale)

    def member_share(self, group_mb: float, batch_size: int | None, members: int) -> float:
        """What one member of a fused group of `members` at `batch_size` counts for of the
        group's `group_mb` (its peak, or the room it ran out of): the amount that gives one
        trial the group's ratio to the model. The part a process pays once is the group's, so
        a member's share is more than a `members`-th of it, and a trial alone learnt from it
        is not under-counted."""
        batch = 0 if batch_size is None else int(batch_size)
        group = self.base.fused_mb([batch] * members)
        if group <= 0:
            return group_mb / members
        return group_mb * self.base.planned_mb(batch) / group

    def oom_floor(self) -> MemoryModel | None:
        """The line every estimate stays above since an OOM (None: no OOM yet)."""
        if self.oom_scale == 0.0:
            return None
        return self.base.scaled(self.oom_scale)

    def effective_model(self) -> MemoryModel:
        """One line at or above every worst case: what is stored for later runs and other nodes,
        which start from it before they have peaks of their own."""
        model = self.model(WORST_QUANTILE)
        floor = self.oom_floor()
        return model if floor is None else envelope([model, floor])

    @property
    def learnt(self) -> bool:
        return bool(self.peaks) or self.oom_scale > 0.0

    def describe(self) -> str:
        if not self.learnt:
            return self.source
        ooms = " and an OOM" if self.oom_scale > 0.0 else ""
        return (
            f"learnt from {len(self.peaks)} trial peak{'s' if len(self.peaks) != 1 else ''}{ooms}"
        )


def observe_peak(footprint: Footprint, batch_size: int | None, vram_peak_mb: float) -> Footprint:
    """A trial finished (not OOM) and measured `vram_peak_mb`."""
    if not math.isfinite(vram_peak_mb) or vram_peak_mb <= 0:
        return footprint
    batch = 0 if batch_size is None else int(batch_size)
    if footprint.base.planned_mb(batch) <= 0:
        return footprint
    peaks = (*footprint.peaks, (batch, float(vram_peak_mb)))[-MAX_POINTS:]
    return replace(footprint, peaks=peaks)


def observe_oom(footprint: Footprint, batch_size: int | None, room_mb: float) -> Footprint:
    """A trial at `batch_size` ran out of memory when it had `room_mb` to itself."""
    batch = 0 if batch_size is None else int(batch_size)
    declared = footprint.base.planned_mb(batch)
    if declared <= 0 or not math.isfinite(room_mb):
        return footprint
    needed = max(room_mb, footprint.worst_mb(batch)) * OOM_MARGIN
    return replace(footprint, oom_scale=max(footprint.oom_scale, needed / declared))


def envelope(models: list[MemoryModel]) -> MemoryModel:
    """The lowest line of this form at or above every one of `models` at every batch size (and
    for a fused group, at every member count)."""
    return MemoryModel(
        max(model.model_overhead_mb for model in models),
        max(model.per_sample_mb for model in models),
        # The least that any of them shares: a group is then counted at or above each too.
        min(model.per_process_mb for model in models),
    )


def ratio_quantile(ratios: list[float], quantile: float) -> float:
    """The `quantile` of the ratios by nearest rank (0.9: the largest of fewer than 10)."""
    ordered = sorted(ratios)
    rank = math.ceil(quantile * len(ordered)) - 1
    return ordered[max(0, min(len(ordered) - 1, rank))]
