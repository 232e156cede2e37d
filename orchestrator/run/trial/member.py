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

if TYPE_CHECKING:
    from adapters.base import Checkpoint, Report


@dataclass(frozen=True)
class Member:
    """A trial that the adapter's `train_fused` trains together with the group's others."""

    params: Mapping[str, Any]  # the trial's drawn parameters, as `train` gets them
    report: Report  # the trial's own: may raise optuna.TrialPruned
    checkpoint: Checkpoint | None  # the trial's own handle
