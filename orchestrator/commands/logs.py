"""`logs`: print one trial's stdout and stderr, as its trial process wrote them."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.flags.common import (
    add_storage_argument,
    command_parser,
    study_name,
    whole_number,
)
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation

if TYPE_CHECKING:
    from orchestrator.show import queries
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    queries = LazyImport("orchestrator.show.queries")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "logs",
        help="print a trial's own output (its stdout and stderr)",
        example="python -m orchestrator logs --trial 3 --study dqn",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study (default: the storage's only study)",
    )
    parser.add_argument(
        "--trial",
        metavar="N",
        type=whole_number("--trial", low=0, example=3),
        required=True,
        help="the trial number",
    )
    add_storage_argument(parser)
    parser.set_defaults(handler=logs_command)


def logs_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    storage = queries.open_for_reading(location)
    name = queries.the_study(storage, args.study, location.describe(), "logs")
    path = queries.trial_log_file(storage, name, args.trial, location.describe())
    try:
        with open(path, "rb") as log:
            text = log.read()
    except OSError as error:
        raise UserError(
            f"trial {args.trial}'s log {path} cannot be read here ({error.strerror}): it is on "
            "the machine that ran the trial"
        ) from None
    if not text:
        # Silence would look like a broken command: say that the trial itself printed nothing.
        print(
            f"trial {args.trial}'s log {path} is empty: the trial printed nothing", file=sys.stderr
        )
        return 0
    sys.stdout.buffer.write(text)
    return 0
