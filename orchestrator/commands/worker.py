"""`worker --study NAME`: join a study from this node; everything else is stored with the study."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from adapters.base import uses_torch
from orchestrator.errors import UserError
from orchestrator.first_failures import watch_first_trials
from orchestrator.flags.common import (
    add_output_arguments,
    add_storage_argument,
    command_parser,
    study_name,
)
from orchestrator.flags.config_file import add_config_argument
from orchestrator.host_options import (
    HostOptions,
    add_host_arguments,
    check_host_options,
    check_storage_for_workers,
)
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import load_existing_study, load_spec, pruner_for

if TYPE_CHECKING:
    from adapters import study_adapter
    from orchestrator import launch
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    study_adapter = LazyImport("adapters.study_adapter")
    launch = LazyImport("orchestrator.launch")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "worker",
        help="join an existing study and run its trials on this node's GPUs until its budget is used",
        example="python -m orchestrator worker --study dqn --storage postgresql://user@db:5432/studies",
    )
    # Not required by argparse: it may come from --config, and is checked once that is read.
    parser.add_argument(
        "--study", metavar="NAME", type=study_name, help="the study to join (required)"
    )
    add_storage_argument(parser)
    add_config_argument(parser)
    add_host_arguments(parser)
    add_output_arguments(parser)
    parser.set_defaults(handler=worker_command)


def worker_command(args: argparse.Namespace) -> int:
    if not args.study:
        raise UserError('name the study to join: --study NAME (or study = "NAME" in --config)')
    host = HostOptions.from_args(args)
    launch.configure(host)
    check_host_options(host)
    location = StorageLocation.resolve(args.storage)
    check_storage_for_workers(location)
    path = location.sqlite_path
    if path is not None and not path.is_file():
        # A worker joins a study; it never creates a database to look for one.
        raise UserError(
            f"no study database at {path}: start a study there with `python -m orchestrator run ADAPTER`"
        )
    storage = launch.open_trials_storage(location)
    study = load_existing_study(storage, args.study, location.describe())
    spec = load_spec(study)
    if spec is None:
        raise UserError(
            f"study {args.study!r} has no orchestrator settings: start it with "
            f"`python -m orchestrator run ADAPTER --study {args.study}`"
        )
    pruner_for(spec)  # a pruner this version lacks is one line here, not a failure per trial
    adapter = study_adapter.resolve_adapter(spec)
    # Only now that the study names its adapter: torch (3 s of CPU) only where it trains with
    # it, and nothing once the budget is used. The imports still overlap planning this host.
    spare = launch.prestart_for(study, spec, uses_torch=uses_torch(adapter))
    return launch.plan_and_run(
        location=location,
        storage=storage,
        adapter=adapter,
        spec=spec,
        options=host,
        spare=spare,
        open_study=lambda: study,
        callbacks=[watch_first_trials(study, spec, args.study)],
    )
