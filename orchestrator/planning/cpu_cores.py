"""The host's CPU cores: how many this process may use, and how they are shared among trials.

`usable_cpu_cores` reads the machine (CPU affinity, a cgroup's CPU quota); the rest is pure:
`share_cores` splits the cores over GPUs for CPU-bound work (the planner's cap), and
`threads_per_trial` gives each trial process its torch threads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def share_cores(wants: Sequence[int], cores: int) -> list[int]:
    """Split `cores` over GPUs that want `wants` slots: round-robin, one core at a time.

    Every GPU gets at least 1; no GPU gets more than it wants; the shares differ by at most one
    between GPUs that wanted more than they got. The sum is at most max(cores, len(wants)).
    """
    given = [1] * len(wants)
    left = cores - len(wants)
    while left > 0:
        progressed = False
        for i, want in enumerate(wants):
            if left > 0 and given[i] < want:
                given[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return given


def threads_per_trial(cpu_cores: int, total_slots: int, *, cpu_bound: bool = False) -> int:
    """Torch threads for one trial. CPU-bound work (RL: small networks, environment steps) runs
    fastest on one thread each, the planner already keeping trials within the cores; other work
    shares the host's cores among the trials that run at once."""
    if cpu_bound:
        return 1
    return max(1, cpu_cores // max(1, total_slots))


# --- reading the machine (not pure) -----------------------------------------------------------


def usable_cpu_cores() -> int:
    """Cores this process may use: its CPU affinity, lowered by a cgroup CPU quota if one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores)


def _cgroup_quota_cores(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    try:
        text = (root / "cpu.max").read_text()  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
    except OSError:
        text = None
    if text is not None:
        return cores_from_quota(*(text.split() + ["", ""])[:2])
    try:  # cgroup v1
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text()
    except OSError:
        return None
    return cores_from_quota(quota.strip(), period.strip())


def cores_from_quota(quota: str, period: str) -> int | None:
    """Whole cores a cgroup quota allows (a 1.5-core quota runs 1 busy process without throttling)."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None  # "max": no quota
    if quota_us <= 0 or period_us <= 0:
        return None  # v1 writes -1 for no quota
    return max(1, quota_us // period_us)
