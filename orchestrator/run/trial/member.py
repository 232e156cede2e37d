"""One trial of a fused group, as the adapter's `train_fused` receives it (docs/fused.md).

A member is a trial in everything but its process: its own drawn parameters, its own `report`
(which records its values and may raise `optuna.TrialPruned` for it alone) and its own
checkpoint handle. The adapter trains the members of a group together and returns one entry per
member, in order: its value, or what ended it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samplers import sampler_kind

if TYPE_CHECKING:
    from adapters.base import Checkpoint, Report
    from orchestrator.record.study.spec import StudySpec


@dataclass(frozen=True)
class Member:
    """A trial that the adapter's `train_fused` trains together with the group's others."""

    params: Mapping[str, Any]  # the trial's drawn parameters, as `train` gets them
    report: Report  # the trial's own: may raise optuna.TrialPruned
    checkpoint: Checkpoint | None  # the trial's own handle


def unfused_because(adapter: Any, spec: StudySpec) -> str | None:
    """Why this study's trials cannot be trained fused, in a few words; None when they can."""
    kind = sampler_kind(spec.sampler)
    if not callable(getattr(adapter, "train_fused", None)):
        return f"adapter {getattr(adapter, 'name', '?')!r} has no train_fused"
    if spec.repeats > 1:
        return "--repeats trains each trial several times, one model each"
    if spec.intensify > 0:
        return "--intensify re-runs train with seeds of their own"
    if kind.needs_grid or kind.needs_checkpoints:
        return f"--sampler {spec.sampler} hands out its trials one at a time"
    return None
