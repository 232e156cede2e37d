"""One trial inside a warm trial process: ask, heartbeat, run, classify the outcome, tell, record.

Shaped like Optuna's own `_run_trial`, one small function a step; its end (tell, record,
publish) is `orchestrator.run.trial.ending`, and a fused group of trials runs beside it in
`orchestrator.run.trial.group`. The process around it, made once and reused trial after trial,
is `orchestrator.run.trial.worker`; what it opened once is the `TrialContext`. A trial knows
nothing of concurrency beyond the numbers it records.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import reporter
from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.budget.claim import AskStopped, ask_within_budget
from orchestrator.record.outages.riding import Heartbeat
from orchestrator.record.store.optuna_private import fixed_params_of, trial_id_of
from orchestrator.record.store.storage import heartbeat_settings
from orchestrator.record.study.objectives import several_values, unpruned_reporter
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.attrs import set_user_attrs
from orchestrator.record.trials.logs import captured, trial_log_path
from orchestrator.run.messages import Channel, Go, TrialJob, TrialOutcome
from orchestrator.run.trial.checkpoints import open_handle, takes_checkpoint, tell_host
from orchestrator.run.trial.clock import time_limit
from orchestrator.run.trial.ending import end_trial
from orchestrator.run.trial.errors import fail_with, settle
from orchestrator.run.trial.host import name_process, trial_name
from orchestrator.run.trial.memory import (
    hold_simulated,
    hold_simulated_mb,
    measure_vram_peak_mb,
    release_memory,
    reporting_memory,
    reset_memory,
)
from orchestrator.run.trial.requeue import requeue_unasked
from orchestrator.run.trial.result import RunResult, trial_outcome
from orchestrator.run.trial.signals import (
    Interrupted,
    interruptible,
    stop_requested,
)
from orchestrator.run.trial.spool import noted
from orchestrator.run.trial.training import train
from samplers import sampler_kind

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.trial.context import TrialContext
else:
    optuna = LazyImport("optuna")

logger = logging.getLogger(__name__)


def run_trial(ctx: TrialContext, job: TrialJob, channel: Channel, company: Any) -> TrialOutcome:
    """Ask for a trial and run it to the end. The supervisor hears its number as soon as it has
    one (("asked", n)) and its batch size once drawn (("sized", batch)), and answers with a `Go`
    when the trial fits the GPU; `company.value` says whether another trial shared the GPU."""

    spec = ctx.refresh_spec()
    ctx.study.sampler = ctx.sampler_for(job.batch_bounds, None)
    ctx.study.pruner = ctx.pruner
    trial, lock = ask(ctx, spec)
    if trial is None:
        return TrialOutcome(None, "NONE")
    name_process(trial_name(trial.number, ctx.config.study_name))
    channel.send(("asked", trial.number))
    if not sampler_kind(spec.sampler).kept:
        ctx.study.sampler = ctx.sampler_for(job.batch_bounds, trial.number)
    fit_fixed_batch_size(trial, job.batch_bounds)
    log_file = log_file_of(ctx, trial)
    try:
        with output_to(log_file), heartbeat(ctx, trial), said_if_taken_over(trial.number):
            result = run_objective(ctx, job, spec, trial, channel, log_file)
            alone = result.oom and not company.value
            requeued = end_trial(ctx, job, spec, trial, result, lock, alone=alone)
    except optuna.exceptions.UpdateFinishedTrialError:
        return late_outcome(trial.number, log_file)
    log = None if log_file is None else str(log_file)
    return trial_outcome(result, trial.number, alone=alone, requeued=requeued, log_file=log)


@contextlib.contextmanager
def said_if_taken_over(number: int) -> Iterator[None]:
    """One line in the trial's log, not a traceback, when the study refuses a write because the
    trial was failed as lost while this process was frozen (`late_outcome`)."""
    try:
        yield
    except optuna.exceptions.UpdateFinishedTrialError:
        logger.warning(
            "trial %d was taken over while this process was frozen: the study failed it as "
            "lost and queued its re-run; this process drops its late result and carries on",
            number,
        )
        raise


def late_outcome(number: int, log_file: Path | None) -> TrialOutcome:
    """This process was frozen (SIGSTOP, a swapped-out host) past the heartbeat's grace: the
    study failed the trial as lost and queued its re-run, and now refuses its late write. The
    result is dropped (the re-run has the parameters); the process carries on."""
    return TrialOutcome(
        number,
        "FAIL",
        error="its process woke after the trial was failed as lost and re-run; "
        "its late result is dropped",
        late=True,
        log_file=None if log_file is None else str(log_file),
    )


def log_file_of(ctx: TrialContext, trial: optuna.Trial) -> Path | None:
    log_dir = ctx.config.settings.log_dir
    if log_dir is None:
        return None
    return trial_log_path(log_dir, ctx.config.study_name, trial.number)


def output_to(path: Path | None) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if path is None else captured(path)


@dataclass(frozen=True)
class LockTiming:
    """How long an ask waited for the study's budget lock and then held it, in ms."""

    wait_ms: float
    held_ms: float


def ask(
    ctx: TrialContext, spec: StudySpec, *, wait: bool = True
) -> tuple[optuna.Trial | None, LockTiming | None]:
    """A new or queued trial (None when the study's budget is used up), and the lock's timing.

    On PostgreSQL the budget lock, the count and the claim (with the trial's heartbeat row) are
    one round trip (`record/budget/claim`); the trial is read back after the lock went. Nothing
    is read before the ask: it does not need the study's trials. While the sampler cannot start
    a trial (a population with no free member) the ask waits outside the lock, or with
    `wait=False` answers None."""

    try:
        trial = ask_within_budget(
            ctx.study, ctx.config.storage, spec.trials, stop=stop_requested, wait=wait
        )
    except AskStopped as stopped:  # the sampler waited inside the ask, and this process stops
        requeue_unasked(ctx, stopped.trial_id)
        return None, None
    times = budget_section.last_times()
    return trial, None if times is None else LockTiming(times.wait_ms, times.held_ms)


def fit_fixed_batch_size(trial: optuna.Trial, bounds: tuple[int, int]) -> None:
    """A re-run carries its batch size fixed from the GPU it first ran on; on a smaller GPU it
    must still fit this one's plan, so it is brought inside this GPU's bounds (and says so)."""
    fixed = fixed_params_of(trial)  # what Optuna hands out instead of sampling; read at ask()
    batch = fixed.get(names.BATCH_SIZE)
    if batch is None:
        return
    low, high = bounds
    fitted = min(max(int(batch), low), high)
    if fitted != batch:
        fixed[names.BATCH_SIZE] = fitted
        trial.set_user_attr("batch_size_fitted_from", int(batch))


def heartbeat(ctx: TrialContext, trial: optuna.Trial) -> contextlib.AbstractContextManager[Any]:
    """The trial's heartbeat, alive through a database outage (Optuna's own thread dies at the
    first error, and the trial would be failed as lost while it trains)."""

    return Heartbeat(ctx.storage, trial_id_of(trial), heartbeat_settings()[0])


def run_objective(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    trial: optuna.Trial,
    channel: Channel,
    log_file: Path | None = None,
) -> RunResult:
    """Draw the parameters, wait to be admitted, train; every way it can end is a RunResult."""

    placement_attrs(ctx, job, trial, log_file)
    result = RunResult(optuna.trial.TrialState.FAIL)
    reset_memory(ctx)
    try:
        with interruptible():  # only this part can be interrupted: the outcome is written whole
            params = ctx.adapter.suggest(trial, spec.options)
            batch = params.get(names.BATCH_SIZE)
            result.batch_size = None if batch is None else int(batch)
            channel.send(("sized", result.batch_size))
            go = channel.recv()
            if not isinstance(go, Go):
                raise Interrupted("stopped before it was admitted")
            note_admission(ctx, trial, go, result)
            report = trial_reporter(spec, trial)
            result.flush = report.flush  # run before the result is told (run/trial/spool)
            saves = spec.repeats <= 1 and takes_checkpoint(ctx.adapter.train)
            result.checkpoint = open_handle(
                ctx.study, trial, spec, ctx.config.storage, saves, tell_host(channel)
            )
            with time_limit(ctx.config.settings.recycling.trial_timeout):  # from its admission on
                value = train(
                    ctx,
                    spec,
                    trial,
                    params,
                    reporting_memory(ctx, result, channel, noted(result, report)),
                    result.checkpoint,
                )
            hold_simulated(ctx, result)  # a model that never reports still held it all
        settle_value(result, value, trial.number)
    except optuna.TrialPruned:
        result.state = optuna.trial.TrialState.PRUNED
    except BaseException as caught:  # every end of the objective is an outcome (see fail_with)
        if not fail_with(result, caught, trial.number):
            release_memory(ctx)  # a taken-over trial's process carries on to its next trial
            raise
    result.vram_peak_mb = measure_vram_peak_mb(ctx)
    release_memory(ctx)
    return result


def trial_reporter(spec: StudySpec, trial: optuna.Trial) -> Any:
    """The trial's `report`, which holds its values while the database is away (a study of
    several objectives: a line in its log per epoch, as Optuna keeps none and prunes none)."""
    if len(spec.all_directions) == 1:
        return reporter(trial)
    return unpruned_reporter(trial.number)


def settle_value(result: RunResult, value: Any, number: int) -> None:
    """The objective's returned value into `result`: one number, or several (a sequence)."""
    several = several_values(value)
    if several is None:
        settle(result, value, number)
    else:
        settle_several(result, several, number)


def placement_attrs(
    ctx: TrialContext, job: TrialJob, trial: optuna.Trial, log_file: Path | None
) -> None:
    device = ctx.config.device
    attrs = {
        names.HOST: ctx.config.host,
        names.PID: os.getpid(),
        names.GPU: ctx.gpu_name,
        names.GPU_INDEX: device.index if device else None,
        names.BATCH_BOUNDS: list(job.batch_bounds),
    }
    if log_file is not None:
        attrs[names.LOG_FILE] = str(log_file)
    set_user_attrs(trial, attrs)


def note_admission(
    ctx: TrialContext, trial: optuna.Trial, go: Go, result: RunResult, members: int = 1
) -> None:
    """Admitted by its estimate: record it, and when. A simulated GPU now holds the model
    overhead of the process's trial, or of its fused group of `members` (what a process pays
    once, once); the rest of what it really needs comes with its first report."""

    result.planned_mb = go.planned_mb
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    set_user_attrs(
        trial,
        {
            names.VRAM_PLANNED_MB: round(go.planned_mb, 1),
            names.CONCURRENCY: go.concurrency,
            names.ADMITTED_AT: now,
        },
    )
    result.concurrency = go.concurrency
    hold_simulated_mb(ctx, ctx.memory.fused_mb([0] * members))


def settle_several(result: RunResult, values: list[float], number: int) -> None:
    """Several objectives' values: one NaN among them fails the trial, as `settle` fails one."""
    for value in values:
        settle(result, value, number)
        if result.fail_reason:
            return
    result.value = values  # type: ignore[assignment]
