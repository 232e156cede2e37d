"""`slurm ADAPTER|--study NAME --nodes N --gpus-per-node G`: a study's workers as a Slurm job array.

With an ADAPTER, `slurm` takes every study setting `run` takes (flags/study.py, flags/
checkpoints.py), checks them as `run` does, and creates the study with them (or resumes it, as
`run` would) before it submits: every task runs `worker --study NAME`, which reads the settings
from the storage, so no node can start the study with other ones. `--study NAME` alone joins a
stored study as it is.

`--dry-run` checks the same and prints the batch script, storing nothing; otherwise the script goes
to `sbatch --parsable` on its standard input, and the job id is printed with how to watch it. The
storage is `--storage` or $ORCHESTRATOR_STORAGE, as for every command, and must be a database
server (both with and without --dry-run). It is never written into the script: sbatch is started
with it in $ORCHESTRATOR_STORAGE and exports the environment to every task, so the URL (and its
password) stays out of the script and off the tasks' command lines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.commands import run as run_command
from orchestrator.deploy.engine import StudyWorkers
from orchestrator.deploy.slurm import MAX_GPUS_PER_NODE, MAX_NODES, SlurmEngine
from orchestrator.errors import UserError
from orchestrator.flags.checkpoints import add_checkpoint_arguments
from orchestrator.flags.common import (
    add_adapter_arguments,
    add_storage_argument,
    command_parser,
    study_name,
    whole_number,
)
from orchestrator.flags.study import add_search_arguments, add_size_arguments
from orchestrator.host_options import add_fuse_argument
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import (
    WORKLOAD_CLASSES,
    add_workloads_argument,
    workload_class,
)
from orchestrator.record.store.location import STORAGE_ENV, StorageLocation
from orchestrator.record.study.spec import load_existing_study, load_spec

if TYPE_CHECKING:
    from adapters import study_adapter
    from orchestrator.record.store import migrate
    from orchestrator.show import queries
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    study_adapter = LazyImport("adapters.study_adapter")
    migrate = LazyImport("orchestrator.record.store.migrate")
    queries = LazyImport("orchestrator.show.queries")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "slurm",
        help="create a study and submit its workers to Slurm: one job array task per node",
        example="ORCHESTRATOR_STORAGE=postgresql://me@db/studies "
        "python -m orchestrator slurm dqn --trials 200 --artifacts /shared/ckpt "
        "--nodes 4 --gpus-per-node 8 --time 12:00:00",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "adapter",
        nargs="?",
        metavar="ADAPTER",
        help="the adapter to tune: the study is created (or resumed) with the settings given, "
        "then submitted (else give --study)",
    )
    add_adapter_arguments(parser)
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study (default: the adapter's name); alone, tasks join it as it is stored",
    )
    _add_job_arguments(parser)
    add_size_arguments(parser)
    add_search_arguments(parser)
    add_checkpoint_arguments(parser)
    add_fuse_argument(parser)  # stored with the study: every task's `worker` reads it
    add_workloads_argument(parser)
    # run's checks read these; the end-of-study re-runs are `run`'s, not a stored setting.
    parser.set_defaults(handler=slurm_command, confirm=None, confirm_seeds=None)


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The Slurm job: how many nodes, their GPUs, and where and how long it runs."""
    parser.add_argument(
        "--nodes",
        type=whole_number("--nodes", high=MAX_NODES, example=4),
        required=True,
        metavar="N",
        help="nodes, one worker (array task) each, never two on one node",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=whole_number("--gpus-per-node", high=MAX_GPUS_PER_NODE, example=8),
        required=True,
        metavar="G",
        help="GPUs each worker asks for and uses (--gres=gpu:G); its node is its own, so give "
        "the node's GPU count to use them all",
    )
    parser.add_argument("--partition", metavar="P", help="the Slurm partition")
    parser.add_argument("--time", metavar="T", help="each task's time limit, e.g. 12:00:00")
    parser.add_argument("--account", metavar="A", help="the Slurm account to charge")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and print the batch script; store and submit nothing",
    )


# The study settings (flags/study.py, flags/checkpoints.py): each needs the ADAPTER.
_SETTINGS = (
    "trials", "epochs", "env", "repeats", "data", "option", "sampler", "seed", "swarm_size",
    "directions", "objectives", "grid", "pruner", "max_retries", "update_settings",
    "enqueue_defaults", "enqueue", "mlflow_uri", "checkpoint_every", "artifacts", "fuse",
)  # fmt: skip


def slurm_command(args: argparse.Namespace) -> int:
    if args.adapter is None and args.adapter_path is None and args.study is None:
        raise UserError("name what to run: slurm ADAPTER, or slurm --study NAME to join a study")
    joining = args.adapter is None and args.adapter_path is None
    given = [name for name in _SETTINGS if _typed(getattr(args, name, None))]
    if joining and given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(
            f"{flag} is a study setting: give the ADAPTER too (slurm ADAPTER --study "
            f"{args.study} {flag} ...), which stores it with the study, or drop it"
        )
    engine = _engine(args)
    # The job's own flags (--time, --partition...), then the study's settings as `run` checks
    # them, then the storage: all before the storage is opened.
    engine.job(StudyWorkers(args.study or "study", args.nodes, WORKLOAD_CLASSES["rl"]))
    typed = (
        None if joining else run_command.typed_settings(args, StorageLocation.resolve(args.storage))
    )
    storage = _storage_for_nodes(args.storage)  # a dry run is refused what a submit would be
    if not args.dry_run and shutil.which("sbatch") is None:
        raise UserError(
            "sbatch is not on PATH: submit from a Slurm login node, or print the script "
            "with --dry-run"
        )
    if typed is None:
        name, class_name = args.study, _stored_class(storage, args.study)
    else:
        name, class_name = _settle_study(args, typed, storage)
    workers = StudyWorkers(
        study=name, workers=args.nodes, workload=workload_class(class_name, args.workloads)
    )
    job = engine.job(workers)
    (script,) = engine.render(workers).values()
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    job_id = submit(script, storage.text)
    print(
        f"submitted Slurm job {job_id}: {job.nodes} array task(s), a node each with "
        f"{job.gpus_per_node} GPU(s) of it, for study {job.study!r}"
    )
    print(f"logs: {job.job_name}-{job_id}_<task>.log in {os.getcwd()}")
    print("watch it:")
    print(f"  squeue -j {job_id}")
    print(f"  python -m orchestrator status --study {job.study}")
    return 0


def _typed(value: Any) -> bool:
    """Whether a setting was typed: argparse leaves None, False or [] otherwise (a typed 0, as
    in --seed 0 or --checkpoint-every 0, is typed: compared by identity, 0 would equal False)."""
    return not (value is None or value is False or value == [])


def _engine(args: argparse.Namespace) -> SlurmEngine:
    return SlurmEngine(
        gpus_per_node=args.gpus_per_node,
        partition=args.partition,
        time=args.time,
        account=args.account,
        python=sys.executable or "python3",
    )


def _settle_study(
    args: argparse.Namespace, typed: run_command.TypedSettings, location: StorageLocation
) -> tuple[str, str]:
    """Check the settings as `run` does and, unless --dry-run, create or resume the study with
    them, so every task's `worker` reads them. (The study's name, its workload class.)"""
    name = run_command.study_of(args, typed)
    class_name = typed.adapter.workload_class
    workload_class(class_name, args.workloads)  # a bad workloads file is said before storing
    if args.dry_run:
        storage = queries.open_for_reading(location)
        existing, _spec, _queue = run_command.study_settings(
            storage, args, typed, location.describe()
        )
        if existing is None:
            print(
                f"--dry-run stored nothing: study {name!r} is created with these settings when "
                "this command runs without --dry-run, and the tasks' `worker` joins it",
                file=sys.stderr,
            )
        return name, class_name
    storage = migrate.open_storage(location)
    try:
        existing, spec, queue = run_command.study_settings(
            storage, args, typed, location.describe()
        )
        run_command.store_study(storage, existing, spec, name, queue, args)
    finally:
        storage.engine.dispose()
    done = "resumed" if existing is not None else "created"
    print(
        f"study {name!r} {done} in {location.describe()} with its settings ({spec.trials} trials)"
    )
    return name, class_name


def _stored_class(location: StorageLocation, name: str) -> str:
    """The workload class of a stored study's adapter (its settings say which adapter)."""
    study = load_existing_study(queries.open_for_reading(location), name, location.describe())
    spec = load_spec(study)
    if spec is None:
        raise UserError(
            f"study {name!r} has no orchestrator settings: give the adapter, "
            f"`slurm ADAPTER --study {name}`"
        )
    return study_adapter.resolve_adapter(spec).workload_class


def _storage_for_nodes(flag: StorageLocation | None) -> StorageLocation:
    """The storage tasks on other nodes reach the study through: --storage, else
    $ORCHESTRATOR_STORAGE, and a database server (an SQLite file is on one machine only)."""
    url = flag or os.environ.get(STORAGE_ENV, "")
    if not url:
        raise UserError(
            f"no storage for the nodes: give --storage postgresql://USER@HOST:5432/DB, or "
            f"export {STORAGE_ENV}=... (sbatch passes it to every node; {STORAGE_ENV} is not set)"
        )
    location = StorageLocation.resolve(url)
    if location.is_sqlite:
        where = "--storage" if flag else STORAGE_ENV
        raise UserError(
            f"{where} is an SQLite file: workers on several nodes need a database server, "
            "e.g. --storage postgresql://USER@HOST:5432/DB"
        )
    return location


def submit(script: str, url: str) -> str:
    """`sbatch --parsable` with the script on its standard input and the storage in its
    environment (which sbatch exports to every task); the job id it prints."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable"],
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, STORAGE_ENV: url},
        )
    except FileNotFoundError:
        raise UserError(
            "sbatch is not on PATH: submit from a Slurm login node, or print the script "
            "with --dry-run"
        ) from None
    except subprocess.TimeoutExpired:
        raise UserError("sbatch did not answer in 120 s: is slurmctld up? (try `sinfo`)") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(f"sbatch refused the job: {said[-1] if said else done.returncode}")
    # --parsable prints "JOBID" or "JOBID;CLUSTER".
    return done.stdout.strip().split(";")[0]
