"""A cluster engine: what Slurm, Kubernetes and docker compose each do for a study's workers.

Every engine renders, for N workers of one study, the files its cluster reads (a batch script,
manifests, a compose file), and every one of them starts the same worker: the command line
`worker_argv` builds. The engines differ only in how they wrap it:

- the GPUs (`--gpus`): Slurm's task passes the ones Slurm allotted it (`"$gpus"`), a Kubernetes
  pod `auto` (it sees its one GPU alone), and compose none here (`claim-gpu` appends the GPU it
  claims when the container starts);
- the storage: never on the command line, where `ps`, `kubectl describe` or a log would show its
  password. Every engine hands it to the worker in $ORCHESTRATOR_STORAGE (`STORAGE_ENV`): Slurm
  from the submitting shell's environment, Kubernetes from a Secret, compose from the `.env` file.

An engine is a module of `deploy/` with a class that has a `name` and a `render`, listed in
`deploy/engines.py`; tests/test_cluster_engines.py checks every listed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from orchestrator.errors import UserError
from orchestrator.record.store.location import STORAGE_ENV

if TYPE_CHECKING:
    from orchestrator.planning.workloads import WorkloadClass

__all__ = ["STORAGE_ENV", "ClusterEngine", "StudyWorkers", "program", "worker_argv"]

GPUS_FLAG = "--gpus"


@dataclass(frozen=True)
class StudyWorkers:
    """What every engine is asked for: N workers of one study, on its workload class's machines.

    With an adapter each worker runs `run ADAPTER`, which creates the study or joins it as stored;
    without one, `worker`, which joins a stored study only (and so takes no --trials or --epochs).
    """

    study: str
    workers: int
    workload: WorkloadClass
    adapter: str | None = None
    trials: int | None = None  # None: the budget stored with the study (or `run`'s default)
    epochs: int | None = None  # None: a stored study keeps its own epochs


@runtime_checkable
class ClusterEngine(Protocol):
    """One way to start a study's workers on a cluster."""

    name: str  # what the user calls it: "slurm", "kubernetes", "compose"

    def render(self, workers: StudyWorkers) -> dict[str, str]:
        """File name -> its text: what the cluster is given to start the workers."""
        ...


def program(python: str = "python") -> list[str]:
    """What every command line of ours starts with: `PYTHON -m orchestrator`."""
    return [python, "-m", "orchestrator"]


def worker_argv(
    study: str,
    *,
    adapter: str | None = None,
    trials: int | str | None = None,
    epochs: int | str | None = None,
    gpus: str | None = None,
    python: str = "python",
) -> list[str]:
    """A worker's command line: `PYTHON -m orchestrator run ADAPTER|worker --study NAME ...`.

    The flags come in one order, --epochs, --trials, then --gpus, so every engine's line reads the
    same. An explicit --epochs is applied by `run` to a stored study, so it is given only when the
    user chose one. `trials` and `epochs` may be text where a file fills them in later (compose's
    `${TRIALS:-200}`). There is no storage argument: the worker reads it from $ORCHESTRATOR_STORAGE.
    """
    if adapter is None:
        if trials is not None or epochs is not None:
            raise UserError("--trials and --epochs set a new study's settings: give the adapter")
        args = ["worker", "--study", study]
    else:
        args = ["run", adapter, "--study", study]
    for flag, value in (("--epochs", epochs), ("--trials", trials)):
        if value is not None:
            args += [flag, str(value)]
    if gpus is not None:
        args += [GPUS_FLAG, gpus]
    return [*program(python), *args]
