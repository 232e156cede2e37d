"""The Slurm job a worker runs under, read from the environment Slurm gives its tasks.

`status` shows it beside each worker, so a worker's row leads to `squeue -j JOB` or
`scancel JOB`: an array task is named ARRAYJOB_TASK, as squeue prints it and scancel takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmTask:
    job: str  # "ARRAYJOB_TASK" for an array task, else the job id
    node: str | None  # SLURMD_NODENAME: several logical nodes may share one hostname
    restarts: int  # how often Slurm had requeued the job before this run


def slurm_task_of(environ: Mapping[str, str]) -> SlurmTask | None:
    """The Slurm job in an environment, or None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    array = environ.get("SLURM_ARRAY_JOB_ID", "").strip()
    task = environ.get("SLURM_ARRAY_TASK_ID", "").strip()
    restarts = environ.get("SLURM_RESTART_COUNT", "0").strip()
    return SlurmTask(
        job=f"{array}_{task}" if array and task else job_id,
        node=environ.get("SLURMD_NODENAME", "").strip() or None,
        restarts=int(restarts) if restarts.isdigit() else 0,
    )
