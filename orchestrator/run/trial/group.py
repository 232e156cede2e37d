"""A fused group in one trial process (`--fuse N`, docs/fused.md): up to N trials of one shape
trained as one model, each still a trial in everything the study records.

The group path beside `runner.run_trial`, step by step:

1. Ask up to N trials, one after the other, each by the very ask a single trial makes (under the
   study's budget lock, so the budget stays exact); the group is what was claimed. Each member's
   heartbeat starts as it is claimed. A re-run of another shape than the group's first re-run
   is queued again for a group of its own shape (`group_seats.claim`).
2. Draw the first member's parameters freely (or take the first re-run's shape); the others
   are drawn with that *shape* fixed: the parameters the adapter's `fuse_key` reads
   (`shape_of`), as Optuna fixes an enqueued trial's. A member that came with parameters of its
   own (a re-run, an enqueued trial) keeps them; when its key differs it trains in a sub-group
   of its own, after the others.
3. Wait to be admitted as one, by the group's bytes: ("sized", largest batch, members).
4. Give each member its own report (pruning it alone), checkpoint handle and section in its own
   log, then call the adapter's `train_fused` once per sub-group.
5. End each member as a single trial ends (`ending.end_trial`): COMPLETE, PRUNED or FAIL,
   re-queued when interrupted, spooled, recorded. A member pruned at an epoch is ended there,
   while the others train on; the rest when the group ends. The supervisor hears one outcome,
   the first member's, with the others in its `fused`.

A group process that is killed leaves its members RUNNING: each is failed and re-queued by the
stale-trial rule, as a single trial of a killed process is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from adapters.base import Member
from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints.handle import TrainedUntil
from orchestrator.run.messages import Channel, Go, TrialJob, TrialOutcome
from orchestrator.run.trial.checkpoints import open_handle, reporting_to, tell_host
from orchestrator.run.trial.clock import time_limit
from orchestrator.run.trial.ending import end_trial
from orchestrator.run.trial.errors import fail_with
from orchestrator.run.trial.group_seats import (
    Seat,
    by_key,
    claim,
    draw,
    introduce,
    log_line,
)
from orchestrator.run.trial.host import name_process, trial_name
from orchestrator.run.trial.member import ended_when_pruned, unfused_because
from orchestrator.run.trial.member_logs import append_line, member_lines_to
from orchestrator.run.trial.memory import (
    hold_simulated_mb,
    measure_vram_peak_mb,
    release_memory,
    reset_memory,
)
from orchestrator.run.trial.result import trial_outcome
from orchestrator.run.trial.runner import (
    late_outcome,
    note_admission,
    output_to,
    placement_attrs,
    run_trial,
    said_if_taken_over,
    settle_value,
    trial_reporter,
)
from orchestrator.run.trial.signals import Interrupted, held, interruptible
from orchestrator.run.trial.spool import noted

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.trial.context import TrialContext
else:
    optuna = LazyImport("optuna")


def run_group(ctx: TrialContext, job: TrialJob, channel: Channel, company: Any) -> TrialOutcome:
    """Claim up to --fuse trials and train them as one fused model; the supervisor hears the
    first member's outcome with the others' in `fused`. A study that cannot fuse (the adapter
    has no `train_fused`, or its settings forbid it) runs one trial, as `run_trial` does."""
    spec = ctx.refresh_spec()
    if unfused_because(ctx.adapter, spec) is not None:
        return run_trial(ctx, job, channel, company)
    ctx.study.sampler = ctx.sampler_for(job.batch_bounds, None)
    ctx.study.pruner = ctx.pruner
    with contextlib.ExitStack() as beating:
        seats = claim(ctx, job, spec, channel, beating)
        if not seats:
            return TrialOutcome(None, "NONE")
        first = seats[0]
        name_process(trial_name(first.trial.number, ctx.config.study_name))
        try:
            with output_to(first.log_file), said_if_taken_over(first.trial.number):
                peak = train_group(ctx, job, spec, seats, channel, company)
        except optuna.exceptions.UpdateFinishedTrialError:
            return late_outcome(first.trial.number, first.log_file)
        if len(seats) > 1 and any(_requeued(seat) for seat in seats if seat.outcome is None):
            channel.send(("requeuing",))  # the pool starts none of them until all are queued
        outcomes = [
            seat.outcome or _ended(ctx, job, spec, seat, company, len(seats)) for seat in seats
        ]
    return group_outcome(outcomes, peak)


def _ended(
    ctx: TrialContext, job: TrialJob, spec: StudySpec, seat: Seat, company: Any, size: int
) -> TrialOutcome:
    """`end_member` with what ending it prints (why it stopped, where it was re-queued) in the
    member's own log, as a single trial's ending is in its log."""
    with output_to(seat.log_file):
        return end_member(ctx, job, spec, seat, company, size)


def _requeued(seat: Seat) -> bool:
    """Whether ending this member queues it again (`requeue_if_interrupted`'s cases)."""
    return bool(seat.result.oom or seat.result.interrupted or seat.result.timed_out)


def train_group(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    seats: list[Seat],
    channel: Channel,
    company: Any,
) -> float | None:
    """Draw, wait to be admitted, train the group once; each member's end is in its `result`.
    The group's VRAM peak; each member's `vram_peak_mb` and `vram_planned_mb` are its shares
    of the group's, in proportion to what its memory model says it needs alone."""
    for seat in seats:
        placement_attrs(ctx, job, seat.trial, seat.log_file)
    reset_memory(ctx)
    try:
        with interruptible():  # only this part can be interrupted: the outcomes are written whole
            draw(ctx, spec, job, seats)
            introduce(ctx, seats)
            admit(ctx, seats, channel)
            members = [member_of(ctx, job, spec, seat, seats, channel, company) for seat in seats]
            with time_limit(ctx.config.settings.recycling.trial_timeout):
                entries = fused_entries(ctx, spec, seats, members)
            hold_simulated_mb(ctx, group_planned_mb(ctx, seats))
        for seat, entry in zip(seats, entries, strict=True):
            if seat.outcome is None:
                settle_entry(seat, entry)
    except BaseException as caught:  # the fused step's own end is every member's
        for seat in seats:
            if seat.outcome is None and not fail_with(seat.result, caught, seat.trial.number):
                release_memory(ctx)
                raise
    peak = measure_vram_peak_mb(ctx)
    for seat in seats:
        if seat.outcome is None:
            seat.result.vram_peak_mb = share_of(peak, seat, seats)
    release_memory(ctx)
    return peak


def share_of(peak: float | None, seat: Seat, seats: list[Seat]) -> float | None:
    """A member's share of the group's VRAM peak, in proportion to its own estimate."""
    planned = sum(s.result.planned_mb or 0.0 for s in seats)
    part = (seat.result.planned_mb or 0.0) / planned if planned > 0 else 1 / len(seats)
    return None if peak is None else peak * part


def admit(ctx: TrialContext, seats: list[Seat], channel: Channel) -> None:
    """Wait until the supervisor admits the group as one, by its members' bytes at the
    group's largest batch size."""
    batches = [s.result.batch_size for s in seats if s.result.batch_size is not None]
    channel.send(("sized", max(batches) if batches else None, len(seats)))
    go = channel.recv()
    if not isinstance(go, Go):
        raise Interrupted("stopped before it was admitted")
    planned = [ctx.memory.planned_mb(seat.result.batch_size or 0) for seat in seats]
    for seat, own in zip(seats, planned, strict=True):
        # Each member's estimate is its share of the group's, by what it needs alone.
        share = go.planned_mb * own / sum(planned) if sum(planned) > 0 else 0.0
        group_go = dataclasses.replace(go, planned_mb=share)
        note_admission(ctx, seat.trial, group_go, seat.result, members=len(seats))


def member_of(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    seat: Seat,
    seats: list[Seat],
    channel: Channel,
    company: Any,
) -> Member:
    """The member the adapter trains: its parameters, its own report (noted for the spool, the
    group's memory told each epoch, its checkpoints due, ended at once when pruned) and its own
    checkpoint handle."""
    report = trial_reporter(spec, seat.trial)
    seat.result.flush = report.flush  # run before the result is told (run/trial/spool)
    handle = open_handle(ctx.study, seat.trial, spec, ctx.config.storage, True, tell_host(channel))
    seat.result.checkpoint = handle
    if seat.log_file is not None:  # its resumes and failed saves in its own log, not the group's
        handle.say = functools.partial(append_line, seat.log_file)
    watched = group_memory(ctx, seats, channel, noted(seat.result, report))

    def end_pruned() -> None:
        with held():  # a stop waits for the member's end to be written whole
            seat.result.state = optuna.trial.TrialState.PRUNED
            seat.result.vram_peak_mb = share_of(measure_vram_peak_mb(ctx), seat, seats)
            seat.outcome = _ended(ctx, job, spec, seat, company, len(seats))

    return Member(
        seat.params, ended_when_pruned(reporting_to(handle, watched, True), end_pruned), handle
    )


def group_memory(ctx: TrialContext, seats: list[Seat], channel: Channel, report: Any) -> Any:
    """`report`, which first tells the supervisor what the group holds (its peak so far); on a
    simulated GPU the group takes all its members need at their first report."""
    if ctx.ledger is None and not ctx.on_cuda:
        return report

    def reporting(epoch: int, value: float) -> None:
        hold_simulated_mb(ctx, group_planned_mb(ctx, seats))
        peak = measure_vram_peak_mb(ctx)
        if peak is not None:
            channel.send(("vram_peak_mb", peak))
        report(epoch, value)

    return reporting


def group_planned_mb(ctx: TrialContext, seats: list[Seat]) -> float:
    """What the group needs by the memory model: what a process pays once, once."""
    return ctx.memory.fused_mb([seat.result.batch_size or 0 for seat in seats])


def fused_entries(
    ctx: TrialContext, spec: StudySpec, seats: list[Seat], members: list[Member]
) -> list[Any]:
    """One entry per member, in order: `train_fused`'s, called once for each set of members
    with one key (one set, unless a re-run brought a shape of its own)."""
    entries: list[Any] = [None] * len(seats)
    for indices in by_key(ctx.adapter, seats):
        with member_lines_to([seats[i].log_file for i in indices]):  # each member's own lines
            got = list(
                ctx.adapter.train_fused(
                    [members[i] for i in indices],
                    epochs=spec.epochs,
                    device=ctx.training_device(),
                    options=spec.options,
                )
            )
        if len(got) != len(indices):
            raise RuntimeError(
                f"train_fused returned {len(got)} entries for {len(indices)} members"
            )
        for index, entry in zip(indices, got, strict=True):
            entries[index] = entry
    return entries


def settle_entry(seat: Seat, entry: Any) -> None:
    """A member's entry into its result: its value, or what ended it (pruned, an error)."""
    result, number = seat.result, seat.trial.number
    if isinstance(entry, optuna.TrialPruned):
        result.state = optuna.trial.TrialState.PRUNED
    elif isinstance(entry, TrainedUntil):  # train_until_epoch: a segment ends with its last value
        settle_value(result, entry.value, number)
    elif isinstance(entry, BaseException):
        try:  # raised here so that its traceback goes to the log as a single trial's does
            raise entry
        except BaseException as caught:
            if not fail_with(result, caught, number):
                raise
    else:
        settle_value(result, entry, number)


def end_member(
    ctx: TrialContext, job: TrialJob, spec: StudySpec, seat: Seat, company: Any, size: int
) -> TrialOutcome:
    """End one member as a single trial ends. An OOM lowers the GPU's batch limit only for a
    member alone: in a group, the group's size needed the memory, not a batch size."""
    trial, result = seat.trial, seat.result
    alone = result.oom and size == 1 and not company.value
    try:
        with said_if_taken_over(trial.number):
            requeued = end_trial(ctx, job, spec, trial, result, seat.lock, alone=alone, group=size)
    except optuna.exceptions.UpdateFinishedTrialError:
        return late_outcome(trial.number, seat.log_file)
    ended = result.state.name + (f" {result.value}" if result.value is not None else "")
    log_line(seat, ended + (f": {result.error}" if result.error else ""))
    log = None if seat.log_file is None else str(seat.log_file)
    return trial_outcome(result, trial.number, alone=alone, requeued=requeued, log_file=log)


def group_outcome(outcomes: list[TrialOutcome], peak: float | None) -> TrialOutcome:
    """What the supervisor hears: the first member's outcome with the group's VRAM peak and
    whatever ends the process's turn for any member (its memory, its context, a stop)."""
    first = outcomes[0]
    return dataclasses.replace(
        first,
        oom=any(o.oom for o in outcomes),
        cuda_error=any(o.cuda_error for o in outcomes),
        interrupted=any(o.interrupted for o in outcomes),
        timed_out=any(o.timed_out for o in outcomes),
        vram_peak_mb=peak,
        fused=tuple(outcomes[1:]),
    )
