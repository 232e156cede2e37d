"""Admission by bytes: how much of a GPU this worker's trials may hold at once, and who goes next.

A trial is admitted by its own footprint, known once its parameters are drawn: what it is
expected to hold must fit the allowance (at most the GPU's usable memory: total less the
planner's 20% reserve) beside what our running trials hold (what they really hold once they
have said, their estimate before), and what it may hold at worst must fit in what is really
free on the GPU now (other processes included), less `FREE_MARGIN` of it.
Each GPU's supervisor (`orchestrator.run.pool.supervisor`) asks these pure functions and gets back
values that say why; tests drive them without processes. Five layers of protection, on bytes:

1. conservative estimate: the memory model (`orchestrator.planning.footprint`), with 20% of VRAM kept free;
2. ramp-up: start with half the usable memory; all of it once the first wave (the trials admitted
   before the first one finished) finished without an OOM; after a cut, clean trials earn an
   eighth of it back at a time (additive increase, multiplicative decrease);
3. per-trial catch: an OOM fails only that trial, which is re-queued; the allowance halves (and
   the trial's estimate rises above the room it did not fit in, see `orchestrator.planning.footprint`);
4. watchdog: before admitting, free VRAM under 10% of total halves the allowance;
5. degradation: never below one trial: a trial always runs when it would be alone on the GPU, and
   a trial that runs out of memory alone lowers the GPU's batch-size limit.

What an OOM changes (layers 3 and 5) is decided in one place, `orchestrator.run.oom_policy`.

Waiting trials go first come, first served. A later trial that fits may go ahead of one that
does not fit yet, but only `PASS_OVER_LIMIT` times: then nothing else is admitted until the
first one fits, which it does at the latest when the GPU is empty. No trial waits for ever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

WATCHDOG_FREE_FRACTION = 0.10
FREE_MARGIN = 0.05  # of the GPU's total: what a worst case may not eat into
RECOVERY_STEP = 1 / 8  # of the usable memory, given back after a run of clean trials
RECOVERY_TRIALS = 4  # clean trials in a row that earn one step back
PASS_OVER_LIMIT = 4


@dataclass(frozen=True)
class Change:
    from_mb: float
    to_mb: float
    reason: str  # start | rampup | oom | watchdog | degrade
    detail: str


@dataclass(frozen=True)
class Budget:
    """One GPU's byte budget for this worker's trials."""

    usable_mb: float  # the GPU's memory less the reserve
    max_trials: int  # a cap on trials at once: --concurrency, swarm, cores, the study's budget
    allowance_mb: float  # what our trials may plan to hold at once, now
    ramped: bool = False  # ramp-up is over: done, or given up after an OOM
    admitted: int = 0  # trials admitted so far
    first_wave: int = 0  # trials admitted before the first one finished (0: none finished yet)
    first_wave_done: int = 0
    clean: int = 0  # trials finished without an OOM since the allowance last went down

    @classmethod
    def start(cls, usable_mb: float, max_trials: int) -> Budget:
        if max_trials < 1:
            raise ValueError(f"max_trials={max_trials} must be at least 1")
        if max_trials == 1 or math.isinf(usable_mb):  # one at a time, or no memory to guard
            return cls(usable_mb, max_trials, usable_mb, ramped=True)
        return cls(usable_mb, max_trials, usable_mb / 2)

    def trial_admitted(self) -> Budget:
        return replace(self, admitted=self.admitted + 1)


@dataclass(frozen=True)
class Admission:
    admit: bool
    reason: str


def room_mb(budget: Budget, *, running_mb: Sequence[float]) -> float:
    """What one more trial may be expected to hold: the allowance less our running trials."""
    return budget.allowance_mb - sum(running_mb)


def free_room_mb(free_mb: float | None, total_mb: float) -> float:
    """What one more trial may hold at worst: what is free on the GPU now, less the margin."""
    return math.inf if free_mb is None else free_mb - FREE_MARGIN * total_mb


def admit(
    budget: Budget,
    *,
    planned_mb: float,
    worst_mb: float,
    running_mb: Sequence[float],
    free_mb: float | None,
    total_mb: float,
) -> Admission:
    """May a trial expected to hold `planned_mb` (`worst_mb` at worst) start beside ours now?"""
    if len(running_mb) >= budget.max_trials:
        return Admission(False, f"{budget.max_trials} trials at once at most")
    if not running_mb:
        return Admission(True, "alone on the GPU")
    room = room_mb(budget, running_mb=running_mb)
    if planned_mb > room:
        return Admission(False, f"{planned_mb:.0f} MB does not fit in {max(0.0, room):.0f} MB yet")
    free = free_room_mb(free_mb, total_mb)
    if worst_mb > free:
        return Admission(
            False,
            f"its worst case, {worst_mb:.0f} MB, does not fit in {max(0.0, free):.0f} MB free",
        )
    return Admission(True, f"{planned_mb:.0f} MB fits in {room:.0f} MB")


def next_to_admit(
    waiting: Sequence[tuple[float, float, int]],
    budget: Budget,
    *,
    running_mb: Sequence[float],
    free_mb: float | None,
    total_mb: float,
) -> int | None:
    """The index in `waiting` (first come first, as (planned MB, worst MB, times passed over))
    to admit now, or None."""
    for index, (planned, worst, _) in enumerate(waiting):
        decision = admit(
            budget,
            planned_mb=planned,
            worst_mb=worst,
            running_mb=running_mb,
            free_mb=free_mb,
            total_mb=total_mb,
        )
        if decision.admit:
            return index
        if waiting[0][2] >= PASS_OVER_LIMIT:
            return None  # the first in line has been passed over enough: it goes next
    return None


def _cut(budget: Budget, reason: str, detail: str, floor_mb: float) -> tuple[Budget, Change | None]:
    new = budget.allowance_mb / 2
    if new < floor_mb:
        if budget.allowance_mb <= floor_mb:
            return replace(budget, ramped=True), None
        new, reason = floor_mb, "degrade"
        detail = f"{detail}; one trial at a time until {RECOVERY_TRIALS} run clean"
    change = Change(budget.allowance_mb, new, reason, detail)
    return replace(budget, allowance_mb=new, ramped=True, clean=0), change


def after_trial(
    budget: Budget,
    *,
    oom: bool,
    admitted_index: int,
    allowance_at_admission: float,
    planned_mb: float,
    detail: str = "",
) -> tuple[Budget, Change | None]:
    """A trial finished. An OOM halves the allowance, unless it was cut below what the trial was
    admitted under already (several OOMs of one crowded moment cut once, not once each)."""
    if budget.first_wave == 0:
        budget = replace(budget, first_wave=budget.admitted)  # the first wave closes now
    if oom:
        if allowance_at_admission > budget.allowance_mb:
            return replace(budget, ramped=True), None
        return _cut(budget, "oom", detail or "a trial ran out of memory", planned_mb)
    if budget.ramped:
        return _recovered(budget)
    if admitted_index >= budget.first_wave:
        return budget, None
    done = budget.first_wave_done + 1
    budget = replace(budget, first_wave_done=done)
    if done < budget.first_wave:
        return budget, None
    change = Change(
        budget.allowance_mb, budget.usable_mb, "rampup", "first wave finished without an OOM"
    )
    return replace(budget, allowance_mb=budget.usable_mb, ramped=True), change


def _recovered(budget: Budget) -> tuple[Budget, Change | None]:
    clean = budget.clean + 1
    if budget.allowance_mb >= budget.usable_mb or clean < RECOVERY_TRIALS:
        return replace(budget, clean=clean), None
    grown = min(budget.usable_mb, budget.allowance_mb + RECOVERY_STEP * budget.usable_mb)
    change = Change(budget.allowance_mb, grown, "rampup", f"{clean} trials in a row without an OOM")
    return replace(budget, allowance_mb=grown, clean=0), change


def before_admit(
    budget: Budget, *, free_mb: float | None, total_mb: float | None, floor_mb: float
) -> tuple[Budget, Change | None]:
    """The watchdog: little free VRAM (someone else's, or our estimate was low) halves the
    allowance, down to `floor_mb` (one trial)."""
    if free_mb is None or not total_mb or free_mb >= WATCHDOG_FREE_FRACTION * total_mb:
        return budget, None
    detail = f"only {free_mb:.0f} of {total_mb:.0f} MB free before admitting a trial"
    return _cut(budget, "watchdog", detail, floor_mb)
