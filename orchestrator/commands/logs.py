"""`logs`: print one trial's stdout and stderr, as its trial process wrote them."""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli import add_storage_argument, command_parser
from orchestrator.errors import UserError


def register(subparsers) -> None:  # noqa: ANN001
    parser = command_parser(
        subparsers,
        "logs",
        help="print a trial's own output (its stdout and stderr)",
        example="python -m orchestrator logs --study dqn --trial 3",
    )
    parser.add_argument("--study", metavar="NAME", required=True, help="the study")
    parser.add_argument("--trial", metavar="N", type=int, required=True, help="the trial number")
    add_storage_argument(parser)
    parser.set_defaults(handler=logs_command)


def logs_command(args: argparse.Namespace) -> int:
    from orchestrator.record.storage import describe_location, resolve_storage_url
    from orchestrator.record.study import load_existing_study
    from orchestrator.show.queries import open_for_reading

    url = resolve_storage_url(args.storage)
    storage = open_for_reading(url)
    study = load_existing_study(storage, args.study, describe_location(url))
    try:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, args.trial)
    except KeyError:
        raise UserError(
            f"study {args.study!r} has no trial {args.trial}: `python -m orchestrator status "
            f"--study {args.study}` lists its trials"
        ) from None
    path = storage.get_trial(trial_id).user_attrs.get("log_file")
    if not path:
        raise UserError(
            f"trial {args.trial} of {args.study!r} kept no log (it did not run, or ran before "
            "trials kept logs)"
        )
    try:
        with open(path, "rb") as log:
            sys.stdout.buffer.write(log.read())
    except OSError as error:
        raise UserError(
            f"trial {args.trial}'s log {path} cannot be read here ({error.strerror}): it is on "
            "the machine that ran the trial"
        ) from None
    return 0
