"""`slurm ADAPTER|--study NAME --nodes N --gpus-per-node G`: a study's workers as a Slurm job array.

`--dry-run` prints the batch script; otherwise it goes to `sbatch --parsable` on its standard
input, and the job id is printed with how to watch it. The storage is `--storage` or
$ORCHESTRATOR_STORAGE, as for every command, and must be a database server (both with and
without --dry-run). It is never written into the script: sbatch is started with it in
$ORCHESTRATOR_STORAGE and exports the environment to every task, so the URL (and its password)
stays out of the script and off the tasks' command lines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import adapters
from orchestrator.deploy.engine import StudyWorkers
from orchestrator.deploy.slurm import MAX_GPUS_PER_NODE, MAX_NODES, SlurmEngine
from orchestrator.errors import UserError
from orchestrator.flags.common import (
    add_storage_argument,
    command_parser,
    study_name,
    whole_number,
)
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import add_workloads_argument, workload_class
from orchestrator.record.store.location import STORAGE_ENV, StorageLocation
from orchestrator.record.study.spec import load_existing_study, load_spec

if TYPE_CHECKING:
    from adapters import study_adapter
    from orchestrator.show import queries
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    study_adapter = LazyImport("adapters.study_adapter")
    queries = LazyImport("orchestrator.show.queries")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "slurm",
        help="submit a study's workers to Slurm: one job array task per node, its GPUs each",
        example="ORCHESTRATOR_STORAGE=postgresql://me@db/studies "
        "python -m orchestrator slurm dqn --nodes 4 --gpus-per-node 8 --time 12:00:00",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "adapter",
        nargs="?",
        metavar="ADAPTER",
        help="the adapter to tune: tasks create the study or join it (else give --study)",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study (default: the adapter's name); alone, tasks join it as it is stored",
    )
    parser.add_argument(
        "--nodes",
        type=whole_number("--nodes", high=MAX_NODES, example=4),
        required=True,
        metavar="N",
        help="nodes, one worker (array task) each",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=whole_number("--gpus-per-node", high=MAX_GPUS_PER_NODE, example=8),
        required=True,
        metavar="G",
        help="GPUs each worker asks for (--gres=gpu:G)",
    )
    parser.add_argument(
        "--trials",
        type=whole_number("--trials", example=40),
        metavar="N",
        help="with ADAPTER: the study's trial budget, shared by all nodes",
    )
    parser.add_argument("--partition", metavar="P", help="the Slurm partition")
    parser.add_argument("--time", metavar="T", help="each task's time limit, e.g. 12:00:00")
    parser.add_argument("--account", metavar="A", help="the Slurm account to charge")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the batch script instead of submitting it"
    )
    add_workloads_argument(parser)
    parser.set_defaults(handler=slurm_command)


def slurm_command(args: argparse.Namespace) -> int:
    if args.adapter is None and args.study is None:
        raise UserError("name what to run: slurm ADAPTER, or slurm --study NAME to join a study")
    if args.trials is not None and args.adapter is None:
        raise UserError(
            "--trials sets a new study's budget: give the ADAPTER too, or drop --trials"
        )
    adapter_name, class_name = _what_runs(args)
    engine = SlurmEngine(
        gpus_per_node=args.gpus_per_node,
        partition=args.partition,
        time=args.time,
        account=args.account,
        python=sys.executable or "python3",
    )
    workers = StudyWorkers(
        study=args.study or adapter_name,
        workers=args.nodes,
        workload=workload_class(class_name, args.workloads),
        adapter=args.adapter,
        trials=args.trials,
    )
    job = engine.job(workers)
    (script,) = engine.render(workers).values()
    storage = _storage_for_nodes(args.storage)  # a dry run is refused what a submit would be
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    job_id = submit(script, storage.text)
    print(
        f"submitted Slurm job {job_id}: {job.nodes} array task(s), one node and "
        f"{job.gpus_per_node} GPU(s) each, for study {job.study!r}"
    )
    print(f"logs: {job.job_name}-{job_id}_<task>.log in {os.getcwd()}")
    print("watch it:")
    print(f"  squeue -j {job_id}")
    print(f"  python -m orchestrator status --study {job.study}")
    return 0


def _what_runs(args: argparse.Namespace) -> tuple[str, str]:
    """(adapter name, workload class): from ADAPTER, or from the study's stored settings."""
    if args.adapter is not None:
        return args.adapter, adapters.get(args.adapter).workload_class
    storage = _storage_for_nodes(args.storage)
    study = load_existing_study(queries.open_for_reading(storage), args.study, storage.describe())
    spec = load_spec(study)
    if spec is None:
        raise UserError(
            f"study {args.study!r} has no orchestrator settings: give the adapter, "
            f"`slurm ADAPTER --study {args.study}`"
        )
    return spec.adapter, study_adapter.resolve_adapter(spec).workload_class


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
