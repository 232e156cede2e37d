"""One GPU's supervisor: its trials, its byte budget and learnt footprint, and what they decide.

The pool loop (`orchestrator.run.pool.loop`) owns one `Supervisor` per GPU (or one for the CPU) and calls
it at three moments: may another trial start (`wants_another`), which waiting trial is admitted
now (`next_admission`), and a trial has finished (`finished`). The decisions themselves are the
pure functions of `orchestrator.run.pool.admission` and `orchestrator.planning.footprint`; this keeps their state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.planning.footprint import Footprint, observe_peak
from orchestrator.run.backend import Asked, Requeuing, Sized, VramPeak
from orchestrator.run.oom_policy import OomAdmitted, after_oom, group_after_oom
from orchestrator.run.pool.admission import (
    Budget,
    Change,
    after_trial,
    before_admit,
    free_room_mb,
    next_to_admit,
    room_mb,
)
from orchestrator.run.pool.placement import auto_group_size

if TYPE_CHECKING:
    from orchestrator.gpu.base import Device
    from orchestrator.planning.planner import GpuPlan
    from orchestrator.run.backend import Event
    from orchestrator.run.messages import TrialOutcome

logger = logging.getLogger(__name__)

MEASURED_STATES = ("COMPLETE", "PRUNED")  # a pruned trial's peak came early: it counts


@dataclass
class RunningTrial:
    """A trial this supervisor started: asked, then sized, then admitted, then finished."""

    handle: int
    number: int | None = None  # known once its process has asked
    sized: bool = False  # its parameters are drawn: its footprint is known
    batch_size: int | None = None
    members: int = 1  # a fused group's trials, sized at its largest batch (docs/fused.md)
    admitted: bool = False
    planned_mb: float = 0.0  # the estimate it was admitted with
    admitted_index: int = -1
    allowance_at_admission: float = 0.0
    room_at_admission: float = 0.0  # what it could hold without running out, as far as we knew
    passed_over: int = 0  # later trials admitted before it
    vram_peak_mb: float | None = None  # what it really holds (its peak so far), once it said
    requeuing: bool = False  # a fused group re-queuing its members: their room is still its

    @property
    def held_mb(self) -> float:
        """What it counts for in the GPU's budget: what it holds once known, else its estimate."""
        return self.planned_mb if self.vram_peak_mb is None else self.vram_peak_mb


@dataclass
class Supervisor:
    index: int
    plan: GpuPlan
    budget: Budget
    footprint: Footprint
    learn: bool = True  # refine the footprint from each trial (off: the estimate stays fixed)
    worker_id: int | None = None
    running: dict[int, RunningTrial] = field(default_factory=dict)
    ooms: int = 0
    group_cap: int | None = None  # a fused group's most members here: --fuse auto's, OOMs halve it
    fit_said: int | None = None  # the group size last said to fit here (group_of)

    @classmethod
    def for_plan(
        cls, index: int, plan: GpuPlan, *, learn: bool = True, auto_fuse: bool = False
    ) -> Supervisor:
        usable = plan.usable_mb if plan.device is not None else math.inf
        footprint = Footprint(plan.memory_model, plan.memory_model_source)
        supervisor = cls(index, plan, Budget.start(usable, plan.slots), footprint, learn)
        supervisor.group_cap = auto_group_size(plan) if auto_fuse else None
        return supervisor

    @property
    def device(self) -> Device | None:
        return self.plan.device

    @property
    def label(self) -> str:
        return self.device.label if self.device else "cpu"

    @property
    def gpu_name(self) -> str:
        return self.device.name if self.device else "cpu"

    @property
    def total_mb(self) -> float:
        return self.device.total_mb if self.device else math.inf

    def heard(self, event: Event) -> tuple[RunningTrial, TrialOutcome] | None:
        """Note what one of this GPU's trials said; when it finished, it is no longer running
        and comes back with its outcome."""

        trial = self.running[event.handle]
        if isinstance(event, Asked):
            trial.number = event.number
        elif isinstance(event, Sized):
            trial.sized, trial.batch_size = True, event.batch_size
            trial.members = event.members
        elif isinstance(event, VramPeak):
            trial.vram_peak_mb = event.vram_peak_mb
        elif isinstance(event, Requeuing):
            trial.requeuing = True
        else:
            del self.running[event.handle]
            return trial, event.outcome
        return None

    def admitted(self) -> list[RunningTrial]:
        return [t for t in self.running.values() if t.admitted]

    def typical_mb(self) -> float:
        """A trial's estimate at the middle of the batch range (log scale)."""
        low, high = self.plan.batch_bounds
        return self.footprint.planned_mb(round(math.sqrt(low * high)))

    def trials_that_fit(self, allowance_mb: float) -> int:
        """How many trials of the typical footprint an allowance holds, within the cap."""
        typical = self.typical_mb()
        if typical <= 0 or math.isinf(allowance_mb):
            return self.budget.max_trials
        fit = int(allowance_mb // typical)
        return max(1, min(self.budget.max_trials, fit))

    def wants_another(self) -> bool:
        """Start another trial now? While the cap allows and fewer are waiting to be admitted
        than the allowance looks able to take (each one asked holds a trial of the study)."""
        admitted = len(self.admitted())
        in_hand = len(self.running) - admitted
        if len(self.running) >= self.budget.max_trials:
            return False
        return in_hand < max(1, self.trials_that_fit(self.budget.allowance_mb) - admitted)

    def group_of(self, members: int) -> int:
        """The members of a fused group started here when `members` are asked for: at most
        --fuse auto's size or an OOM's split, and what fits the GPU (`members_that_fit`), said
        once for each size it is cut to."""
        capped = min(members, self.group_cap or members)
        fit = self.members_that_fit(capped)
        if fit < capped and fit != self.fit_said:
            self.fit_said = fit
            logger.warning(
                "%s: a fused group of %d would not fit in %s MB usable by its estimate: groups "
                "here take %d",
                self.label,
                capped,
                f"{self.budget.usable_mb:,.0f}",
                fit,
            )
        return fit

    def members_that_fit(self, members: int) -> int:
        """The most of `members` that one fused group started here may have: those whose
        estimate at the smallest batch they may draw fits the GPU's usable memory as one
        process. A larger group would wait for the GPU to empty, then run out of memory."""
        if self.device is None:
            return members
        low = self.plan.batch_bounds[0]
        fit = 1
        while fit < members and self.footprint.planned_mb(low, fit + 1) <= self.budget.usable_mb:
            fit += 1
        return fit

    def batch_bounds(self, limit: int | None) -> tuple[int, int]:
        """The batch sizes a trial on this GPU may draw: what fits the GPU alone, as the footprint
        stands now, below the study's limit for this kind of GPU (lowered by OOMs alone)."""
        low, high = self.plan.batch_bounds
        if self.device is not None and self.footprint.learnt:
            high = largest_batch(self.footprint, self.budget.usable_mb, low, high)
        if limit is not None:
            high = max(low, min(high, limit))
        return low, high

    def next_admission(self, free_mb: float | None) -> tuple[RunningTrial | None, list[Change]]:
        """The waiting trial to admit now (marked admitted), or None; and any change the
        watchdog made to the allowance on the way."""
        changes: list[Change] = []
        waiting = [t for t in self.running.values() if t.sized and not t.admitted]
        if not waiting:
            return None, changes
        while True:
            running_mb = [t.held_mb for t in self.admitted()]
            # A fused group counts as its members, each at the group's largest batch, with what
            # a process pays once (the memory model's per_process_mb) counted once.
            line = [
                (
                    self.footprint.planned_mb(t.batch_size, t.members),
                    self.footprint.worst_mb(t.batch_size, t.members),
                    t.passed_over,
                )
                for t in waiting
            ]
            kwargs = {"running_mb": running_mb, "free_mb": free_mb, "total_mb": self.total_mb}
            chosen = next_to_admit(line, self.budget, **kwargs)
            if chosen is None:
                return None, changes
            if self.device is not None:
                self.budget, change = before_admit(
                    self.budget, free_mb=free_mb, total_mb=self.total_mb, floor_mb=line[chosen][0]
                )
                if change is not None:
                    changes.append(change)
                    continue  # the allowance shrank: decide again
            trial = waiting[chosen]
            self._admit(trial, line[chosen][0], running_mb, free_mb)
            for earlier in waiting[:chosen]:
                earlier.passed_over += 1
            return trial, changes

    def _admit(
        self, trial: RunningTrial, planned: float, running_mb: list[float], free_mb: float | None
    ) -> None:
        # What it could hold without running out, as far as we knew: all the usable memory when
        # alone, else the smaller of the allowance's room and what was really free.
        room = min(
            room_mb(self.budget, running_mb=running_mb), free_room_mb(free_mb, self.total_mb)
        )
        trial.admitted, trial.planned_mb = True, planned
        trial.admitted_index = self.budget.admitted
        trial.allowance_at_admission = self.budget.allowance_mb
        trial.room_at_admission = self.budget.usable_mb if not running_mb else max(planned, room)
        self.budget = self.budget.trial_admitted()

    def finished(self, trial: RunningTrial, outcome: TrialOutcome) -> Change | None:
        """Learn from a finished trial and let the budget react; the change, if any."""
        if not trial.admitted:
            return None  # stopped while it waited: it says nothing about memory
        learn = self.learn and self.device is not None
        if outcome.oom:  # the policy: orchestrator.run.oom_policy
            # Trials that ran out, as the study's end counts them: a fused group's members each.
            self.ooms += 1 + sum(1 for member in outcome.fused if member.oom)
            self.group_cap = group_after_oom(trial.members, self.group_cap)
            admitted = OomAdmitted(
                number=outcome.trial_number,
                batch_size=trial.batch_size,
                planned_mb=trial.planned_mb,
                # a member's share of it
                room_mb=self.footprint.member_share(
                    trial.room_at_admission, trial.batch_size, trial.members
                ),
                admitted_index=trial.admitted_index,
                allowance_mb=trial.allowance_at_admission,
            )
            self.footprint, self.budget, change = after_oom(
                self.footprint, self.budget, admitted, learn=learn
            )
            return change
        if learn and outcome.vram_peak_mb and outcome.state in MEASURED_STATES:
            # A group's peak is the group's: a member's share is what one trial is learnt by.
            share = self.footprint.member_share(
                outcome.vram_peak_mb, trial.batch_size, trial.members
            )
            self.footprint = observe_peak(self.footprint, trial.batch_size, share)
        self.budget, change = after_trial(
            self.budget,
            oom=False,
            admitted_index=trial.admitted_index,
            allowance_at_admission=trial.allowance_at_admission,
            planned_mb=trial.planned_mb,
        )
        return change


def largest_batch(footprint: Footprint, usable_mb: float, low: int, high: int) -> int:
    """The largest batch size in [low, high] whose estimate fits `usable_mb` (low if none does)."""
    if footprint.planned_mb(high) <= usable_mb:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if footprint.planned_mb(middle) <= usable_mb:
            low = middle
        else:
            high = middle
    return low
