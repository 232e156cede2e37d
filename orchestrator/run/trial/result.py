"""A trial's result in its process, and the one way it becomes the message the supervisor hears.

`RunResult` is what running the objective gave, filled in step by step by the trial's steps
(`orchestrator.run.trial.runner`), its memory (`orchestrator.run.trial.memory`) and its errors
(`orchestrator.run.trial.errors`), then told to the study. What the supervisor hears of it is a
`TrialOutcome` (`orchestrator.run.messages`), made from it by `trial_outcome` alone: the
fields both carry are copied in one place, and what only the process needs (its reports, its
checkpoint, the function that sends reports an outage held back) never crosses the pipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.run.messages import TrialOutcome

if TYPE_CHECKING:
    from optuna.trial import TrialState


@dataclass
class RunResult:
    """What running the objective gave, before it is told to the study."""

    state: TrialState
    value: float | None = None  # several objectives: their list, which stays in the study
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


def trial_outcome(
    result: RunResult, number: int, *, alone: bool, requeued: bool, log_file: str | None
) -> TrialOutcome:
    """What the supervisor hears of trial `number`'s result (`alone`: an OOM with no other trial
    on the GPU; `requeued`: queued again to run later; `log_file`: where its output went)."""
    return TrialOutcome(
        number,
        result.state.name,
        oom=result.oom,
        alone=alone,
        batch_size=result.batch_size,
        value=None if isinstance(result.value, list) else result.value,  # several: in the study
        vram_peak_mb=result.vram_peak_mb,
        error=result.error,
        requeued=requeued,
        interrupted=result.interrupted,
        cuda_error=result.cuda_error,
        log_file=log_file,
        timed_out=result.timed_out,
    )
