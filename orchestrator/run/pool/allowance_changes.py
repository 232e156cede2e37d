"""A change of one GPU's memory allowance, said twice: as a log line and as a stored event.

The changes themselves are decided elsewhere, as frozen values with their reason
(`orchestrator.run.pool.admission.Change`: start, rampup, oom, watchdog, degrade); this turns one
into the words the log shows and the `ConcurrencyEvent` row that `status` and the report read,
both with the trials of the typical footprint that fit before and after.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from orchestrator.record.store import records
from orchestrator.run.pool.admission import Change

if TYPE_CHECKING:
    from orchestrator.run.pool.admission import Budget
    from orchestrator.run.pool.supervisor import Supervisor

logger = logging.getLogger(__name__)


def start_change(slots: int, limited_by: str, budget: Budget) -> Change:
    """The allowance a GPU starts with, and why: the plan's cap, and half if it ramps up."""
    detail = f"at most {slots} at once (limited by {limited_by})"
    if budget.allowance_mb < budget.usable_mb:
        detail += "; starting at half"
    return Change(0.0, budget.allowance_mb, "start", detail)


def slots_either_side(supervisor: Supervisor, change: Change) -> tuple[int, int]:
    """Trials of the typical footprint that fit the allowance before and after the change."""
    before = supervisor.trials_that_fit(change.from_mb) if change.from_mb > 0 else 0
    return before, supervisor.trials_that_fit(change.to_mb)


def log_change(label: str, change: Change, slots: tuple[int, int]) -> None:
    logger.info(
        "%s: memory for trials %s -> %s (about %d -> %d at once; %s: %s)",
        label,
        mb_words(change.from_mb),
        mb_words(change.to_mb),
        *slots,
        change.reason,
        change.detail,
    )


def change_event(
    supervisor: Supervisor, change: Change, slots: tuple[int, int], *, host: str
) -> records.ConcurrencyEvent:
    """The change as the row stored with the study (an unlimited allowance is stored as None)."""
    device = supervisor.device
    return records.ConcurrencyEvent(
        at=records.now(),
        host=host,
        gpu_index=device.index if device else None,
        gpu_name=supervisor.gpu_name,
        from_slots=slots[0],
        to_slots=slots[1],
        reason=change.reason,
        detail=change.detail,
        from_mb=_finite(change.from_mb),
        to_mb=_finite(change.to_mb),
    )


def mb_words(mb: float) -> str:
    """'9,830 MB', or 'no limit' for the CPU's allowance."""
    return f"{mb:,.0f} MB" if math.isfinite(mb) else "no limit"


def _finite(mb: float) -> float | None:
    return mb if math.isfinite(mb) else None
