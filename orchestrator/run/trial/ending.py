"""A trial's end in its process: re-queued if it was interrupted, told to the study, recorded,
published where people look, and its checkpoints tidied.

One function, `end_trial`, does all of it for a trial that ran, alone (`runner.run_trial`) or as
a member of a fused group (`group.run_group`): every trial that trained ends the same way.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import trial_id_of
from orchestrator.record.study import objectives
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.attrs import set_user_attrs
from orchestrator.record.trials.notes import write_trial_note
from orchestrator.run.trial.checkpoints import tidy
from orchestrator.run.trial.requeue import requeue_if_interrupted
from orchestrator.run.trial.signals import HOST_GONE, is_host_gone
from orchestrator.run.trial.spool import Told, kept_until_told

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.store import records
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.messages import TrialJob
    from orchestrator.run.trial.context import TrialContext
    from orchestrator.run.trial.result import RunResult
    from orchestrator.run.trial.runner import LockTiming
else:
    optuna = LazyImport("optuna")
    # Loads SQLAlchemy: read once a trial runs, after the process's signal handlers are set.
    records = LazyImport("orchestrator.record.store.records")

logger = logging.getLogger(__name__)


def end_trial(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    trial: optuna.Trial,
    result: RunResult,
    lock: LockTiming | None,
    *,
    alone: bool,
    group: int = 1,
) -> bool:
    """End a trial that ran: re-queue what was interrupted, tell the study, record, publish and
    tidy its checkpoints (`alone`: an OOM with the GPU to itself; `group`: the members of the
    fused group it trained in). True if it was re-queued."""
    told = Told(*told_values(ctx, trial, result), attrs=told_attrs(result))
    with kept_until_told(ctx, trial, result, told):  # an outage past the bound keeps it
        requeued = requeue_if_interrupted(ctx, job, spec, trial, result, alone=alone, group=group)
        tell(ctx, trial, told)
        record(ctx, trial, result, lock)
    publish(ctx, trial)
    tidy_checkpoints(ctx, trial, result, requeued)
    _say_if_host_gone(trial.number, result, requeued)
    return requeued


def tidy_checkpoints(
    ctx: TrialContext, trial: optuna.Trial, result: RunResult, requeued: bool
) -> None:
    """Drop the checkpoints nothing reads again; a store that refuses costs a line, not the trial."""
    try:
        tidy(ctx.study, trial, result.checkpoint, result.state.name, requeued)
    except Exception as error:  # the trial is told already: tidying is best effort
        logger.warning("trial %d: its checkpoints were not tidied: %s", trial.number, error)


def _say_if_host_gone(number: int, result: RunResult, requeued: bool) -> None:
    """The one line a trial stopped by its host's death leaves in its log (no traceback)."""
    if not (result.interrupted and is_host_gone()):
        return
    then = (
        "it is re-queued, its checkpoints kept: the next run or worker of the study resumes it"
        if requeued
        else "it is not re-queued"
    )
    logger.warning("trial %d stopped: %s (killed, or crashed); %s", number, HOST_GONE, then)


def told_attrs(result: RunResult) -> dict[str, Any]:
    """The user attributes a trial's end sets."""
    attrs: dict[str, Any] = {names.OOM: result.oom}
    if result.vram_peak_mb is not None:
        attrs[names.VRAM_PEAK_MB] = round(result.vram_peak_mb, 1)
    if result.error:
        attrs[names.ERROR] = result.error[:500]
    if result.fail_reason:
        attrs[names.FAIL_REASON] = result.fail_reason
    return attrs


def tell(ctx: TrialContext, trial: optuna.Trial, told: Told) -> None:
    set_user_attrs(trial, told.attrs)
    ctx.study.tell(trial, told.values, state=told.state)


def told_values(ctx: TrialContext, trial: optuna.Trial, result: RunResult) -> tuple[Any, Any]:
    """The state and values the study is told: the objective's value, and what was measured when
    the study optimises it too (orchestrator.record.study.objectives; an OOM there is infeasible)."""

    spec = ctx.spec
    assert spec is not None
    seconds = (datetime.datetime.now() - trial.datetime_start).total_seconds()
    told = objectives.told(
        objectives=spec.objectives,
        directions=spec.all_directions,
        state=result.state.name,
        value=result.value,
        oom=result.oom,
        vram_peak_mb=result.vram_peak_mb,
        seconds=seconds,
    )
    if told.violation is not None:
        trial.set_constraint(objectives.CONSTRAINT, told.violation)
    return optuna.trial.TrialState[told.state], told.values


def publish(ctx: TrialContext, trial: optuna.Trial) -> None:
    """Where people look: the trial's optuna-dashboard note and, when the study names one, its
    MLflow run (neither can fail the trial: a store that is away costs a warning)."""

    frozen = ctx.storage.get_trial(trial_id_of(trial))
    write_trial_note(ctx.study, frozen, metric=ctx.metric)
    if ctx.tracker is not None:
        ctx.tracker.log_trial(frozen)


def record(
    ctx: TrialContext,
    trial: optuna.Trial,
    result: RunResult,
    lock: LockTiming | None,
) -> None:
    device = ctx.config.device
    records.record_trial_vram(
        ctx.engine,
        study_name=ctx.config.study_name,
        trial_number=trial.number,
        host=ctx.config.host,
        gpu_index=device.index if device else None,
        gpu_name=ctx.gpu_name,
        batch_size=result.batch_size,
        vram_planned_mb=result.planned_mb,
        vram_peak_mb=result.vram_peak_mb,
        concurrency=result.concurrency,
        oom=result.oom,
        state=result.state.name,
        pid=os.getpid(),
        ask_wait_ms=round(lock.wait_ms, 2) if lock else None,
        ask_held_ms=round(lock.held_ms, 2) if lock else None,
    )
