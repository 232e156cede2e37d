"""A study's workers as a Slurm batch script: one array task per node, the node's GPUs each.

`sbatch_script` is a pure function from typed values to the script's text, so its lines are tested
without a cluster; `SlurmEngine` is Slurm's `ClusterEngine`, and the task's worker line is
`engine.worker_argv`'s. The choices, said once here and in docs/deploy.md:

- A job array (`--array=0-(N-1)`, one node and G GPUs per task), not one `--nodes N` job with
  `srun`: the workers need no gang (each pulls trials from the shared study), so a task may start
  as soon as one node is free, and a node that fails, is drained or is preempted requeues only
  its own task: a `--nodes N` job would lose, and requeue, every node's worker at once.
- One task per node, guaranteed: `--exclusive`. Tasks of an array are separate jobs, and Slurm
  packs jobs onto a node while it has GPUs free: with `--gres=gpu:G` alone, two tasks of G GPUs
  each landed on one node of 2G (seen on the test cluster), two workers each planning trials for
  the whole host's memory and cores. An exclusive task has its node to itself; Slurm then allots
  it every GPU of the node, and the script keeps the first G of them for the worker (what
  `--gpus-per-node` asked), so give the node's GPU count to use them all.
- CPU and memory come from the study's workload class, the table the Kubernetes manifests read:
  `--cpus-per-gpu` is the class's CPU request (whole cores, rounded up: Slurm allots cores), and
  `--mem-per-gpu` its memory request: what a node must have for each GPU (16 GiB for the
  supervised class). The class's limit (40 GiB) asked of 8 GPUs was more than many nodes have,
  and an exclusive task may use the node's memory beyond what it asked where Slurm does not
  confine it.
- The storage URL never appears in the script: sbatch's default `--export=ALL` carries the
  submitting shell's ORCHESTRATOR_STORAGE to every task, and the script stops at once if it is
  missing.
- `--requeue`: a task whose node fails comes back (SLURM_RESTART_COUNT counts it); the study's
  stale-trial check re-runs what that node left RUNNING. `--open-mode=append` keeps the log of
  every run of a task in one file.
- Each worker takes the GPUs Slurm allots it (`--gpus auto` reads CUDA_VISIBLE_DEVICES, which
  Slurm sets to them). Where $ORCHESTRATOR_SIM_GPU_MB is set (tests, demos on a cluster whose GRES
  are not GPUs), one simulated device of that many MB stands in for each allotted GPU.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from orchestrator.deploy.engine import StudyWorkers, worker_argv
from orchestrator.errors import UserError
from orchestrator.planning.workloads import parse_quantity
from orchestrator.record.store.location import STORAGE_ENV

if TYPE_CHECKING:
    from orchestrator.planning.workloads import WorkloadClass

# Simulated devices in place of the GPUs Slurm allots: MB per device (unset: the real GPUs).
SIM_GPU_ENV = "ORCHESTRATOR_SIM_GPU_MB"
MAX_NODES = 10_000
MAX_GPUS_PER_NODE = 64

# Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
# Partition and account names as Slurm writes them (a partition may be a comma list).
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PARTITIONS = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")


@dataclass(frozen=True)
class SlurmJob:
    """What the user asked to submit: a study's workers on N nodes of G GPUs each."""

    study: str
    workload: WorkloadClass
    nodes: int
    gpus_per_node: int
    adapter: str | None = None  # given: each task runs `run ADAPTER` (creates or joins the study)
    trials: int | None = None  # with an adapter: the study's budget (None: run's default)
    epochs: int | None = None  # with an adapter: applied to the study (None: it keeps its own)
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    python: str = "python3"  # the interpreter that has this package on the nodes

    def __post_init__(self) -> None:
        problem = job_problem(self)
        if problem:
            raise UserError(problem)

    @property
    def job_name(self) -> str:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.study).strip("-")[:40]
        return f"orch-{name or 'study'}"

    @property
    def cpus_per_gpu(self) -> int:
        return max(1, math.ceil(parse_quantity(self.workload.cpu_request) - 1e-9))

    @property
    def mem_per_gpu_mb(self) -> int:
        return max(1, math.ceil(parse_quantity(self.workload.memory_request) / 2**20))


def job_problem(job: SlurmJob) -> str | None:
    """What is wrong with the request, in one line that says what to give instead, or None."""
    if not 1 <= job.nodes <= MAX_NODES:
        return f"--nodes {job.nodes}: give from 1 to {MAX_NODES:,} nodes"
    if not 1 <= job.gpus_per_node <= MAX_GPUS_PER_NODE:
        return f"--gpus-per-node {job.gpus_per_node}: give from 1 to {MAX_GPUS_PER_NODE}"
    if job.time is not None and not _TIME.fullmatch(job.time):
        return (
            f"--time {job.time!r} is not a Slurm time limit: write MINUTES, HH:MM:SS or "
            "DAYS-HH:MM:SS, e.g. --time 4:00:00"
        )
    if job.partition is not None and not _PARTITIONS.fullmatch(job.partition):
        return f"--partition {job.partition!r}: use the partition's name, e.g. --partition gpu"
    if job.account is not None and not _NAME.fullmatch(job.account):
        return f"--account {job.account!r}: use the account's name, e.g. --account ml-lab"
    if not job.study.strip():
        return "--study is empty: name the study, e.g. --study dqn-l4"
    if job.epochs is not None and job.epochs < 1:
        return f"--epochs {job.epochs}: give at least 1 epoch"
    if (job.trials is not None or job.epochs is not None) and job.adapter is None:
        return "--trials and --epochs set a new study's settings: give the ADAPTER too"
    return None


def directives(job: SlurmJob) -> list[str]:
    """The #SBATCH lines: the array, each task's node, GPUs, CPUs and memory, and requeue."""
    lines = [
        f"--job-name={job.job_name}",
        f"--array=0-{job.nodes - 1}",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",  # one task a node: see the module's docstring
        f"--gres=gpu:{job.gpus_per_node}",
        f"--cpus-per-gpu={job.cpus_per_gpu}",
        f"--mem-per-gpu={job.mem_per_gpu_mb}M",
        "--requeue",
        "--open-mode=append",
        "--output=%x-%A_%a.log",
    ]
    for flag, value in (("partition", job.partition), ("time", job.time), ("account", job.account)):
        if value is not None:
            lines.append(f"--{flag}={value}")
    return [f"#SBATCH {line}" for line in lines]


def worker_command(job: SlurmJob) -> str:
    """The shell line a task runs: `run ADAPTER` or `worker`, on the GPUs in $gpus."""
    argv = worker_argv(
        job.study,
        adapter=job.adapter,
        trials=job.trials,
        epochs=job.epochs,
        gpus="$gpus",
        python=job.python,
    )
    # Every word is quoted but the last, the GPUs: bash expands "$gpus" when the task starts.
    return shlex.join(argv[:-1]) + f' "{argv[-1]}"'


def sbatch_script(job: SlurmJob) -> str:
    """The whole batch script, for `sbatch --parsable` on its standard input or a file."""
    summary = (
        f"# {job.nodes} node(s) x {job.gpus_per_node} GPU(s), {job.workload.name} class: "
        f"{job.cpus_per_gpu} CPU(s) and {job.mem_per_gpu_mb} MB per GPU"
    )
    body = f"""\
set -u
# The storage comes from the submitting shell (sbatch exports its environment); never written here.
if [ -z "${{{STORAGE_ENV}:-}}" ]; then
  echo "{STORAGE_ENV} is not set: export it before sbatch, e.g. postgresql://USER@HOST/DB" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
# The GPUs Slurm allotted this task: all of its node's (--exclusive), the first {job.gpus_per_node} kept
# for the worker as asked; simulated ones of ${SIM_GPU_ENV} MB stand in where set.
if [ -n "${{CUDA_VISIBLE_DEVICES:-}}" ]; then
  export CUDA_VISIBLE_DEVICES=$(echo "$CUDA_VISIBLE_DEVICES" | cut -d, -f1-{job.gpus_per_node})
fi
gpus=auto
if [ -n "${{{SIM_GPU_ENV}:-}}" ]; then
  gpus=$(echo "${{CUDA_VISIBLE_DEVICES:-0}}" | sed "s/[^,][^,]*/sim:${{{SIM_GPU_ENV}}}/g")
fi
echo "slurm job ${{SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}}_${{SLURM_ARRAY_TASK_ID:-0}} on \
${{SLURMD_NODENAME:-?}}: GPUs ${{CUDA_VISIBLE_DEVICES:-none}}, restart ${{SLURM_RESTART_COUNT:-0}}"
# scancel and preemption send SIGTERM to every process of the job: the trial processes stop
# and are re-queued, the worker leaves; this shell waits for it, then says how it ended.
stopped=
trap 'stopped=1; echo "slurm: SIGTERM received, the worker re-queues what it cannot finish"' TERM
{worker_command(job)}
status=$?  # bash runs the trap once the worker has left, and keeps the worker's status
echo "worker exited with status $status"
if [ -n "$stopped" ] && {{ [ "$status" = 143 ] || [ "$status" = 130 ]; }}; then
  # 143 (SIGTERM) or 130 (Ctrl-C) is a worker stopped by a signal, its trials re-queued: what
  # scancel asked for.
  echo "stopped by Slurm as asked: the task ends with status 0"
  status=0
fi
exit "$status"
"""
    return "\n".join(["#!/bin/bash", *directives(job), summary, body])


@dataclass(frozen=True)
class SlurmEngine:
    """The cluster engine for Slurm: one array task per worker, each on a node of G GPUs."""

    name: ClassVar[str] = "slurm"
    gpus_per_node: int = 1
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    python: str = "python3"

    def render(self, workers: StudyWorkers) -> dict[str, str]:
        """The batch script, named after the job (`sbatch` reads it from a file or its input)."""
        job = self.job(workers)
        return {f"{job.job_name}.sbatch": sbatch_script(job)}

    def job(self, workers: StudyWorkers) -> SlurmJob:
        """The array job the script submits, and what `slurm` says of it."""
        return SlurmJob(
            study=workers.study,
            workload=workers.workload,
            nodes=workers.workers,
            gpus_per_node=self.gpus_per_node,
            adapter=workers.adapter,
            trials=workers.trials,
            epochs=workers.epochs,
            partition=self.partition,
            time=self.time,
            account=self.account,
            python=self.python,
        )
