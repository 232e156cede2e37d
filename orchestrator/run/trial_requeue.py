"""Whether a trial that ended early is run again: after an out-of-memory error, a stop by the
pool, or `--trial-timeout`, its parameters are queued as a new trial within the retry limit.

An OOM with the GPU to itself also lowers that kind of GPU's batch limit, so the re-run (and
every later trial there) draws a batch that can fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.record import attr_names as names

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study import StudySpec
    from orchestrator.run.trial_context import TrialContext
    from orchestrator.run.trial_messages import TrialJob
    from orchestrator.run.trial_result import RunResult


def requeue_if_interrupted(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    trial: optuna.Trial,
    result: RunResult,
    *,
    alone: bool,
) -> bool:
    """Queue a re-run of a trial that ran out of memory, was stopped or timed out; True if queued.

    Out of memory with the GPU to itself means this batch size does not fit this GPU: the GPU's
    batch limit goes below it and the re-run gets half the batch (none if it was the smallest)."""
    from orchestrator.record import records
    from orchestrator.record.retry import requeue

    if result.timed_out:  # its retries count, like an OOM's
        frozen = ctx.study._storage.get_trial(trial._trial_id)
        return requeue(ctx.study, frozen, max_retries=spec.max_retries, reason="timeout")
    if not (result.oom or result.interrupted):
        return False
    retry_params, reason = None, "oom" if result.oom else "interrupted"
    batch = result.batch_size
    if alone and batch is not None:
        low = job.batch_bounds[0]
        records.lower_batch_limit(
            ctx.engine,
            study_name=ctx.config.study_name,
            gpu_name=ctx.gpu_name,
            max_batch_size=max(low, batch - 1),
            trial_number=trial.number,
        )
        if batch <= low:
            return False  # the smallest batch does not fit: re-running cannot help
        retry_params = {names.BATCH_SIZE: max(low, batch // 2)}
    frozen = ctx.study._storage.get_trial(trial._trial_id)
    return requeue(
        ctx.study,
        frozen,
        max_retries=spec.max_retries if result.oom else None,
        params=retry_params,
        reason=reason,
    )
