"""`status`: every study in a storage, or one study in detail; `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from orchestrator.flags.common import (
    add_storage_argument,
    command_parser,
    study_name,
    whole_number,
)

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.record.study.final_scores import FinalScores

DEFAULT_LIMIT = 20


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "status",
        help="show every study in the storage, or one study in detail",
        example="python -m orchestrator status --study dqn --storage postgresql://user@db:5432/studies",
    )
    parser.add_argument(
        "--study", metavar="NAME", type=study_name, help="show this study in detail"
    )
    add_storage_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--limit",
        type=whole_number("--limit", low=0, example=50),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"VRAM rows of the last N trials (default {DEFAULT_LIMIT}; 0 shows all)",
    )
    parser.set_defaults(handler=status_command)


def status_command(args: argparse.Namespace) -> int:
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.show.queries import list_studies, open_for_reading, study_detail
    from orchestrator.show.status_text import render_detail, render_studies
    from orchestrator.show.text import to_jsonable

    location = StorageLocation.resolve(args.storage)
    storage = open_for_reading(location)
    if args.study:
        detail = study_detail(storage, args.study, location.describe())
        updates, scores = _stored_extras(storage, args.study)
        if args.json:
            extras = {"settings_updates": updates, "final_scores": scores and scores.as_dict()}
            print(json.dumps({**to_jsonable(detail), **extras}, indent=2))
        else:
            _console().print(
                render_detail(
                    detail, limit=args.limit, settings_updates=updates, final_scores=scores
                )
            )
        return 0
    rows = list_studies(storage)
    if args.json:
        print(json.dumps(to_jsonable(rows), indent=2))
    else:
        _console().print(render_studies(rows, location.masked))
    return 0


def _stored_extras(storage: object, name: str) -> tuple[list[dict], FinalScores | None]:
    """What `run --update-settings` recorded with the study (record/study/drift.py), and the
    scores its end stored (record/study/final_scores.py)."""
    import optuna

    from orchestrator.record.study.drift import stored_updates
    from orchestrator.record.study.final_scores import final_scores_of

    study = optuna.load_study(study_name=name, storage=storage)
    return stored_updates(study), final_scores_of(study.user_attrs)


def _console() -> Console:
    from rich.console import Console

    # Off a terminal rich assumes 80 columns; the tables read better wider in a log or a pipe.
    terminal = sys.stdout.isatty()
    return Console(width=None if terminal else 120, highlight=False)
