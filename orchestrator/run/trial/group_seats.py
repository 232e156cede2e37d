"""Who is in a fused group (`--fuse N`, docs/fused.md, steps 1 and 2 of `group.py`): its
members as the group's process holds them, claimed one ask at a time, their parameters drawn
with one shape, and each member's first line saying whom it trains with.

A re-run brings its parameters, so its shape: re-runs come back in the order their groups
ended, shapes interleaved, and a group trains those of its first re-run's shape. One of another
shape is queued again as soon as the group is claimed, for a group of its own shape, rather
than trained alone beside this one. Not a population's (population-based training): its
sampler re-plans a re-run as it is asked, so a re-run once claimed stays claimed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.store.optuna_private import (
    fixed_params_of,
    storage_of,
    system_attrs_of,
    trial_id_of,
)
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.attrs import set_user_attrs
from orchestrator.run.messages import Channel, TrialJob, TrialOutcome
from orchestrator.run.trial.member import shape_of
from orchestrator.run.trial.result import RunResult
from orchestrator.run.trial.runner import (
    LockTiming,
    ask,
    fit_fixed_batch_size,
    heartbeat,
    log_file_of,
)
from orchestrator.run.trial.signals import stop_requested
from samplers import sampler_kind

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.trial.context import TrialContext
else:
    optuna = LazyImport("optuna")

FUSED_WITH = "fused_with"  # user attribute: the others of the member's fused step, by number


@dataclass
class Seat:
    """One claimed member of the group, as the process follows it."""

    trial: optuna.Trial
    lock: LockTiming | None
    log_file: Path | None
    result: RunResult = field(default_factory=lambda: RunResult(optuna.trial.TrialState.FAIL))
    params: dict[str, Any] = field(default_factory=dict)
    outcome: TrialOutcome | None = None  # once it is ended (a member pruned mid-group)


def claim(
    ctx: TrialContext,
    job: TrialJob,
    spec: StudySpec,
    channel: Channel,
    beating: contextlib.ExitStack,
) -> list[Seat]:
    """Up to --fuse trials, each asked as a single trial is (the budget's rules, its lock).
    The supervisor hears the first one's number once all are claimed: until then it counts
    this process as able to take --fuse trials of the budget, and starts no other for them."""
    seats: list[Seat] = []
    beat: Any = None  # one heartbeat thread for the whole group
    most = min(ctx.config.settings.fuse, job.members)
    # A population's re-runs are re-planned by its sampler as they are asked: they stay claimed.
    planned = sampler_kind(spec.sampler).plans_params
    key: Any = None  # the fuse key of the group's first re-run: the shape it trains
    passed: list[optuna.Trial] = []  # re-runs of another shape, queued again once claimed
    while len(seats) < most and not (seats and stop_requested()):
        # Only the first waits for the sampler: a group holding members never waits for another
        # (a population's member it waits for could be one it holds).
        trial, lock = ask(ctx, spec, wait=not seats)
        if trial is None:
            break
        brought = None if planned else rerun_key(ctx.adapter, trial)
        if brought is not None and key is not None and brought != key:
            # Re-runs come back in the order their groups ended, shapes interleaved: one of
            # another shape is left for a group of its own shape, not trained alone here.
            passed.append(trial)
            continue
        key = brought if key is None else key
        if beat is None:
            beat = beating.enter_context(heartbeat(ctx, trial))
        else:
            beat.add(trial_id_of(trial))
        fit_fixed_batch_size(trial, job.batch_bounds)
        seats.append(Seat(trial, lock, log_file_of(ctx, trial)))
        # A member of a group that ran out of memory comes back in a group of half its size.
        most = min(most, system_attrs_of(trial).get(names.FUSE_AT_MOST, most))
    for trial in passed:
        ride_out(
            lambda trial=trial: storage_of(ctx.study).set_trial_state_values(
                trial_id_of(trial), optuna.trial.TrialState.WAITING
            ),
            what=f"queue trial {trial.number} again for a group of its shape",
        )
    if seats:
        channel.send(("asked", seats[0].trial.number))
    return seats


def rerun_key(adapter: Any, trial: optuna.Trial) -> Any:
    """The fuse key of a re-run (its parameters all fixed, from the trial it re-runs); None for
    a trial whose shape is still to draw (a new one, or the re-run of a trial lost before it
    had parameters)."""
    fuse_key = getattr(adapter, "fuse_key", None)
    fixed = fixed_params_of(trial)
    if not callable(fuse_key) or not fixed or not system_attrs_of(trial).get("retry_history"):
        return None
    try:
        return fuse_key(fixed)
    except (KeyError, TypeError, ValueError):  # a shape parameter it does not carry
        return None


def draw(ctx: TrialContext, spec: StudySpec, job: TrialJob, seats: list[Seat]) -> None:
    """Each member's parameters: the first's drawn freely, the others' with its shape fixed
    (what a member brought fixed, a re-run's parameters, it keeps)."""
    kind = sampler_kind(spec.sampler)
    # A re-run's shape is fixed: the members drawn afresh take the first re-run's, if any.
    rerun = next((s for s in seats if rerun_key(ctx.adapter, s.trial) is not None), None)
    planned = kind.plans_params  # population-based training: each member's plan is its own
    shape = {} if rerun is None or planned else shape_of(ctx.adapter, fixed_params_of(rerun.trial))
    for seat in seats:
        if not kind.kept:  # Optuna's samplers: one per trial, seeded by its number (as run_trial)
            ctx.study.sampler = ctx.sampler_for(job.batch_bounds, seat.trial.number)
        fixed = fixed_params_of(seat.trial)
        for name, value in shape.items():
            fixed.setdefault(name, value)
        seat.params = ctx.adapter.suggest(seat.trial, spec.options)
        batch = seat.params.get(names.BATCH_SIZE)
        seat.result.batch_size = None if batch is None else int(batch)
        if seat is seats[0] and not shape and not kind.plans_params:  # a plan's are its own
            shape = shape_of(ctx.adapter, seat.params)


def introduce(ctx: TrialContext, seats: list[Seat]) -> None:
    """Each member's `fused_with`, the others of its sub-group (those it trains with in one
    fused step), and the first line of its section. A member alone in its sub-group (a re-run
    of another shape) trains as a single trial does: no `fused_with`, and its log says so."""
    for indices in by_key(ctx.adapter, seats):
        for index in indices:
            seat = seats[index]
            others = [seats[i].trial.number for i in indices if i != index]
            if others:
                set_user_attrs(seat.trial, {FUSED_WITH: others})
                line = f"trains fused with trials {others} in process {os.getpid()}"
            elif len(seats) > 1:
                apart = [s.trial.number for i, s in enumerate(seats) if i not in indices]
                line = (
                    f"trains alone in process {os.getpid()}, beside trials {apart} of another shape"
                )
            else:
                continue  # a group of one is a single trial
            log_line(seat, line, seats[0])


def by_key(adapter: Any, seats: list[Seat]) -> list[list[int]]:
    """The members' indices, in sets of one `fuse_key` each, in the order they first appear."""
    fuse_key = getattr(adapter, "fuse_key", None)
    sets: dict[Any, list[int]] = {}
    for index, seat in enumerate(seats):
        key = fuse_key(seat.params) if callable(fuse_key) else None
        sets.setdefault(key, []).append(index)
    return list(sets.values())


def log_line(seat: Seat, line: str, output_of: Seat | None = None) -> None:
    """A line of this member's section in its own log (the group's output goes to the first
    member's log, which `output_of` names)."""
    if seat.log_file is None:
        return
    where = ""
    if output_of is not None and output_of is not seat and output_of.log_file is not None:
        where = f"; the group's output is in {output_of.log_file}"
    with contextlib.suppress(OSError), open(seat.log_file, "a") as log:
        log.write(f"trial {seat.trial.number}: {line}{where}\n")
