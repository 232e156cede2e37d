"""What running a trial's objective gave, in its process, before it is told to the study.

Its own module so that the trial's steps (`orchestrator.run.trial.runner`) and its memory
(`orchestrator.run.trial.memory`) both read it while neither imports the other's way back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.trial import TrialState


@dataclass
class RunResult:
    """What running the objective gave, before it is told to the study."""

    state: TrialState
    value: float | None = None
    error: str | None = None
    oom: bool = False
    interrupted: bool = False
    cuda_error: bool = False
    timed_out: bool = False  # stopped at --trial-timeout
    fail_reason: str | None = None  # a FAIL the objective itself caused: "nan", "exit", "timeout"
    reports: list[tuple[int, float]] = field(default_factory=list)  # (epoch, value) it reported
    flush: Callable[[], None] | None = None  # sends the reports an outage held back
    batch_size: int | None = None
    planned_mb: float | None = None
    vram_peak_mb: float | None = None
    concurrency: int | None = None
    checkpoint: Any = None  # the trial's checkpoint handle (orchestrator/record/checkpoints/handle)
