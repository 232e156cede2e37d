"""The pool's former policy, equal slots: kept here as a baseline for `bench_pool.py` only.

Before admission by bytes (`orchestrator.run.pool.admission`), a GPU ran N equal slots, N sized at the
smallest batch, and these functions moved N. The five layers of protection as they were:

1. conservative estimate: the plan sizes slots at the minimum batch with 20% of VRAM kept free;
2. ramp-up: start at ceil(max/2), go to max once the first wave finished without an OOM
   (and after a halving, two clean waves earn one slot back: additive increase);
3. per-trial catch: an OOM fails only that trial, which is re-queued; slots halve;
4. watchdog: before filling a slot, free VRAM under 10% of total halves the slots;
5. degradation: never below one slot; a trial that runs out of memory alone lowers the GPU's
   batch-size limit (the trial process records it; later bounds stay below it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

WATCHDOG_FREE_FRACTION = 0.10


@dataclass(frozen=True)
class SlotChange:
    from_slots: int
    to_slots: int
    reason: str  # start | rampup | oom | watchdog | degrade
    detail: str


@dataclass(frozen=True)
class SlotPolicy:
    max_slots: int
    slots: int
    first_wave: int  # trials in the first wave, all started at the initial slots
    started: int = 0
    first_wave_done: int = 0
    ramped: bool = False  # ramp-up is over: done, or given up after an OOM
    clean: int = 0  # trials finished without an OOM since the slots last went down

    @classmethod
    def start(cls, max_slots: int) -> SlotPolicy:
        if max_slots < 1:
            raise ValueError(f"max_slots={max_slots} must be at least 1")
        initial = math.ceil(max_slots / 2)
        return cls(
            max_slots=max_slots, slots=initial, first_wave=initial, ramped=initial == max_slots
        )

    def trial_started(self) -> SlotPolicy:
        return replace(self, started=self.started + 1)

    def in_first_wave(self, started_index: int) -> bool:
        return started_index < self.first_wave


def _halved(policy: SlotPolicy, reason: str, detail: str) -> tuple[SlotPolicy, SlotChange | None]:
    new = max(1, policy.slots // 2)
    if new == policy.slots:
        return replace(policy, ramped=True), None
    if new == 1:
        detail = f"{detail}; one trial at a time from now on"
        reason = "degrade"
    return replace(policy, slots=new, ramped=True, clean=0), SlotChange(
        policy.slots, new, reason, detail
    )


def after_trial(
    policy: SlotPolicy,
    *,
    oom: bool,
    started_index: int,
    slots_at_start: int,
    detail: str = "",
) -> tuple[SlotPolicy, SlotChange | None]:
    """A trial finished. An OOM halves the slots, unless they were already cut below what the
    trial started under (several OOMs of one crowded moment halve once, not once each)."""
    if oom:
        if slots_at_start > policy.slots:
            return replace(policy, ramped=True), None
        return _halved(policy, "oom", detail or "a trial ran out of memory")
    if policy.ramped:
        return _recovered(policy)
    if not policy.in_first_wave(started_index):
        return policy, None
    done = policy.first_wave_done + 1
    policy = replace(policy, first_wave_done=done)
    if done < policy.first_wave:
        return policy, None
    change = SlotChange(
        policy.slots, policy.max_slots, "rampup", "first wave finished without an OOM"
    )
    return replace(policy, slots=policy.max_slots, ramped=True), change


RECOVERY_WAVES = 2


def _recovered(policy: SlotPolicy) -> tuple[SlotPolicy, SlotChange | None]:
    """Additive increase after a multiplicative decrease: two full waves without an OOM earn one
    slot back, up to the plan. A halving on one unlucky trial then costs minutes, not the study."""
    clean = policy.clean + 1
    if policy.slots >= policy.max_slots or clean < RECOVERY_WAVES * policy.slots:
        return replace(policy, clean=clean), None
    grown = policy.slots + 1
    detail = f"{clean} trials in a row without an OOM"
    return replace(policy, slots=grown, clean=0), SlotChange(policy.slots, grown, "rampup", detail)


def before_spawn(
    policy: SlotPolicy, *, free_mb: float | None, total_mb: float | None
) -> tuple[SlotPolicy, SlotChange | None]:
    """The watchdog: little free VRAM (someone else's, or our estimate was low) halves the slots."""
    if free_mb is None or not total_mb:
        return policy, None
    if free_mb >= WATCHDOG_FREE_FRACTION * total_mb:
        return policy, None
    detail = f"only {free_mb:.0f} of {total_mb:.0f} MB free before starting a trial"
    return _halved(policy, "watchdog", detail)
