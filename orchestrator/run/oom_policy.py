"""What happens when a trial runs out of GPU memory: the whole policy, as pure decisions.

An out-of-memory error is heard on both sides of a trial's pipe, and each side asks this module:

- The trial process (`orchestrator.run.trial.requeue`), before the trial is told, asks
  `retry_after_oom` whether and how it runs again. With the GPU to itself, its batch size does
  not fit that kind of GPU: the kind's batch limit goes below it, and the re-run gets half the
  batch (none if the smallest batch did not fit). With company, the same parameters run again,
  when there is room. Either way within `--max-retries`.
- The GPU's supervisor (`orchestrator.run.pool.supervisor`), when the trial's end reaches it, asks
  `after_oom` what the GPU learns: the footprint's estimate rises above the room the trial did not
  fit in (`orchestrator.planning.footprint.observe_oom`), and the GPU's allowance halves, unless an
  OOM of the same crowded moment already cut it below what this trial was admitted under
  (`orchestrator.run.pool.admission.after_trial`); never below one trial at a time.

A fused group (`--fuse`, docs/fused.md) that runs out of memory is split in halves: every member
is re-queued as a crowded-out trial is (the same parameters, from its last checkpoint), and the
GPU's groups are at most half the failed group's size from then on (`group_after_oom`), so its
members come back as two groups, each admitted by its own bytes; a group of one is a single
trial. The footprint learns from a group's OOM per member (the room it had, shared).

The swarm reads OOMs from the study (`samplers/_moves.py`: an OOM'd particle's memory
parameters are pushed down), and the pool stores each allowance change. A different policy is
a change to this module and its test (tests/test_oom_policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.planning.footprint import Footprint, observe_oom
from orchestrator.run.pool.admission import Budget, Change, after_trial


@dataclass(frozen=True)
class OomRetry:
    """How a trial that ran out of memory is run again."""

    requeue: bool  # run its parameters again (within --max-retries)
    batch_size: int | None = None  # the re-run's batch size; None: the same parameters
    batch_limit: int | None = None  # this kind of GPU's new batch limit; None: unchanged


def retry_after_oom(batch_size: int | None, smallest_batch: int, *, alone: bool) -> OomRetry:
    """The trial drew `batch_size` (None: the model has none) from a range starting at
    `smallest_batch`, and ran out of memory, with the GPU to itself or not."""
    if not alone or batch_size is None:
        return OomRetry(requeue=True)  # crowded out: the same trial fits a quieter moment
    limit = max(smallest_batch, batch_size - 1)
    if batch_size <= smallest_batch:
        return OomRetry(requeue=False, batch_limit=limit)  # re-running cannot help
    return OomRetry(True, max(smallest_batch, batch_size // 2), limit)


@dataclass(frozen=True)
class OomAdmitted:
    """What the supervisor knew of a trial that ran out of memory, from its admission."""

    number: int | None
    batch_size: int | None
    planned_mb: float  # the estimate it was admitted with
    room_mb: float  # what it could hold without running out, as far as the supervisor knew
    admitted_index: int
    allowance_mb: float  # the GPU's allowance when it was admitted


def after_oom(
    footprint: Footprint, budget: Budget, trial: OomAdmitted, *, learn: bool
) -> tuple[Footprint, Budget, Change | None]:
    """The GPU's footprint (learnt only when `learn`) and allowance after the trial's OOM, and
    the allowance's change if there is one."""
    if learn:
        footprint = observe_oom(footprint, trial.batch_size, trial.room_mb)
    budget, change = after_trial(
        budget,
        oom=True,
        admitted_index=trial.admitted_index,
        allowance_at_admission=trial.allowance_mb,
        planned_mb=trial.planned_mb,
        detail=f"trial {trial.number} ran out of memory with batch size {trial.batch_size}",
    )
    return footprint, budget, change


def group_after_oom(members: int, cap: int | None) -> int | None:
    """The most members a fused group on this GPU may have after a group of `members` ran out
    of memory (`cap`: the most before, None: --fuse). Halved, down to single trials; the cap
    does not grow back within the run, as the batch limit a trial alone lowers does not."""
    if members <= 1:
        return cap
    half = max(1, members // 2)
    return half if cap is None else min(cap, half)
