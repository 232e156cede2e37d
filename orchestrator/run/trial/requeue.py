"""Whether a trial that ended early is run again: after an out-of-memory error, a stop by the
pool, or `--trial-timeout`, its parameters are queued as a new trial within the retry limit.

An OOM with the GPU to itself also lowers that kind of GPU's batch limit, so the re-run (and
every later trial there) draws a batch that can fit: `orchestrator.run.oom_policy` decides.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.store.optuna_private import storage_of, trial_id_of
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.retry import requeue
from orchestrator.run.oom_policy import group_after_oom, retry_after_oom
from orchestrator.run.trial.signals import is_host_gone

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from orchestrator.record.store import records
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.messages import TrialJob
    from orchestrator.run.trial.context import TrialContext
    from orchestrator.run.trial.result import RunResult
else:
    optuna = LazyImport("optuna")
    records = LazyImport("orchestrator.record.store.records")  # SQLAlchemy: see runner


def requeue_if_interrupted(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    trial: optuna.Trial,
    result: RunResult,
    *,
    alone: bool,
    group: int = 1,
) -> bool:
    """Queue a re-run of a trial that ran out of memory, was stopped or timed out; True if queued.

    Out of memory with the GPU to itself means this batch size does not fit this GPU: the GPU's
    batch limit goes below it and the re-run gets half the batch (none if it was the smallest).
    A member of a fused group of `group` that ran out of memory is re-run in a group of at most
    half that (the group split in halves)."""

    if result.timed_out:  # its retries count, like an OOM's
        frozen = _still_running(ctx, trial)
        if frozen is None:
            return False
        return requeue(ctx.study, frozen, max_retries=spec.max_retries, reason="timeout")
    if not (result.oom or result.interrupted):
        return False
    retry_params, split = None, None
    reason = "oom" if result.oom else "host gone" if is_host_gone() else "interrupted"
    if result.oom:  # the policy: orchestrator.run.oom_policy
        retry = retry_after_oom(result.batch_size, job.batch_bounds[0], alone=alone)
        if retry.batch_limit is not None:
            records.lower_batch_limit(
                ctx.engine,
                study_name=ctx.config.study_name,
                gpu_name=ctx.gpu_name,
                max_batch_size=retry.batch_limit,
                trial_number=trial.number,
            )
        if not retry.requeue:
            return False
        if retry.batch_size is not None:
            retry_params = {names.BATCH_SIZE: retry.batch_size}
        if group > 1:
            split = {names.FUSE_AT_MOST: group_after_oom(group, None)}
    frozen = _still_running(ctx, trial)
    if frozen is None:
        return False
    return requeue(
        ctx.study,
        frozen,
        max_retries=spec.max_retries if result.oom else None,
        params=retry_params,
        reason=reason,
        system_attrs=split,
    )


def requeue_unasked(ctx: TrialContext, trial_id: int) -> None:
    """A trial whose process was stopped while its ask waited (population-based training,
    for a free member), before it had params: failed and queued again, so the budget does not
    count it and the next run or worker plans its re-run as any new trial."""
    storage = storage_of(ctx.study)
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # failed as lost
        ride_out(
            lambda: storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL),
            what=f"end the stopped ask of trial id {trial_id}",
        )
    frozen = storage.get_trial(trial_id)
    reason = "host gone" if is_host_gone() else "interrupted"
    requeue(ctx.study, frozen, max_retries=None, reason=reason)


def _still_running(ctx: TrialContext, trial: optuna.Trial) -> FrozenTrial | None:
    """The trial as stored, or None when it was failed as lost while its process was frozen
    (its heartbeat went stale): the study queued its re-run then, and a second one would run
    the same trial twice."""

    frozen = storage_of(ctx.study).get_trial(trial_id_of(trial))
    return frozen if frozen.state == optuna.trial.TrialState.RUNNING else None
