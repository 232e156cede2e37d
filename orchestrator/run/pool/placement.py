"""Placement: which of a host's GPUs the next trial starts on (admission says whether it fits).

Trials that share a GPU share its compute, so packing one GPU while another idles makes every
trial on it slower. The rule, spread first: among the GPUs whose supervisor would take another
trial now, the one with the fewest of our trials (started, waiting or training); between those,
the one with the most memory free, less what our trials there are expected to take but do not
hold yet (a trial that has just started shows in nobody's free memory); then the lower index.
Packing starts only when every GPU is busy, and follows the same order. First fit (the first GPU
that takes another) is kept as the baseline that `benchmarks/bench_pool.py` compares against.

The decision is one pure call, `place`, on values (`GpuLoad`), and comes back as a value that
says why; the pool loop (`orchestrator.run.pool.loop`) gathers the loads and starts the trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.planning.planner import GpuPlan
    from orchestrator.run.pool.supervisor import Supervisor

FUSE_AUTO = "auto"  # --fuse auto: the members of a process, chosen here per GPU
# Without a GPU: the members whose fused steps still gain on a core (docs/fused.md: DQN's whole
# loop 2.2x at 8 members, 2.4x at 16, against each trial alone).
CPU_AUTO_MEMBERS = 8


class Policy(Enum):
    SPREAD = "spread"  # fewest trials first, then the most free memory
    FIRST_FIT = "first-fit"  # the first GPU in the host's order that takes another


@dataclass(frozen=True)
class GpuLoad:
    """One GPU as placement sees it."""

    index: int  # the pool's index of its supervisor
    takes_another: bool  # its supervisor would start another trial now
    trials: int  # our trials on it: started, waiting to be admitted or training
    free_mb: float  # free on it now, less what our trials there will take but do not hold yet


@dataclass(frozen=True)
class Placed:
    index: int | None  # the GPU to start the next trial on; None: none takes another
    reason: str


def place(loads: Sequence[GpuLoad], policy: Policy = Policy.SPREAD) -> Placed:
    """The GPU the next trial starts on, by `policy`, among those that take another."""
    open_ = [load for load in loads if load.takes_another]
    if not open_:
        return Placed(None, "no GPU takes another trial now")
    if policy is Policy.FIRST_FIT:
        chosen = min(open_, key=lambda load: load.index)
        return Placed(chosen.index, "the first GPU that takes another")
    chosen = min(open_, key=lambda load: (load.trials, -load.free_mb, load.index))
    tied = [load for load in open_ if load.trials == chosen.trials]
    if len(tied) == 1:
        return Placed(chosen.index, f"fewest trials ({chosen.trials})")
    return Placed(
        chosen.index, f"fewest trials ({chosen.trials}), most free ({chosen.free_mb:.0f} MB)"
    )


def load_of(supervisor: Supervisor, free_mb: float | None) -> GpuLoad:
    """A supervisor's load, with `free_mb` as the probe said (None: no device, no limit).

    A trial counts against the free memory until it says what it holds: by its estimate once
    admitted, by the GPU's typical trial before it is sized."""
    free = math.inf if free_mb is None else free_mb
    for trial in supervisor.running.values():
        if trial.vram_peak_mb is None:
            free -= trial.planned_mb if trial.admitted else supervisor.typical_mb()
    return GpuLoad(supervisor.index, supervisor.wants_another(), len(supervisor.running), free)


def group_size(fuse: int, supervisors: Sequence[Supervisor], room: int) -> int:
    """The most trials the next process claims for its fused group (--fuse, docs/fused.md):
    --fuse on a GPU (one process of many members is what fusing is for there). Without a GPU
    each process is a core: the room is shared over the plan's cores free now, so a short
    study's groups keep every core busy instead of one."""
    if fuse == 1 or any(s.device is not None for s in supervisors):
        return fuse
    cores = sum(max(0, s.plan.slots - len(s.running)) for s in supervisors)
    return min(fuse, max(1, math.ceil(room / max(1, cores))))


def auto_group_size(plan: GpuPlan) -> int:
    """--fuse auto's most members of one process on this GPU: the trials that fit its usable
    VRAM as one group, what a process pays once counted once (`GpuPlan.group_members`); without
    a GPU, CPU_AUTO_MEMBERS."""
    if plan.device is None:
        return CPU_AUTO_MEMBERS
    return max(1, plan.group_members)
