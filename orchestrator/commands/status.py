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
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.final_scores import final_scores_of

if TYPE_CHECKING:
    import optuna
    from rich import console as rich_console

    from orchestrator.record.study import drift
    from orchestrator.record.study.final_scores import FinalScores
    from orchestrator.show import queries, status_text
    from orchestrator.show import text as show_text
else:
    optuna = LazyImport("optuna")
    rich_console = LazyImport("rich.console")
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    drift = LazyImport("orchestrator.record.study.drift")
    queries = LazyImport("orchestrator.show.queries")
    status_text = LazyImport("orchestrator.show.status_text")
    show_text = LazyImport("orchestrator.show.text")

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
    location = StorageLocation.resolve(args.storage)
    storage = queries.open_for_reading(location)
    if args.study:
        detail = queries.study_detail(storage, args.study, location.describe())
        updates, scores = _stored_extras(storage, args.study)
        if args.json:
            extras = {"settings_updates": updates, "final_scores": scores and scores.as_dict()}
            print(json.dumps({**show_text.to_jsonable(detail), **extras}, indent=2))
        else:
            _console().print(
                status_text.render_detail(
                    detail, limit=args.limit, settings_updates=updates, final_scores=scores
                )
            )
        return 0
    rows = queries.list_studies(storage)
    if args.json:
        print(json.dumps(show_text.to_jsonable(rows), indent=2))
    else:
        _console().print(status_text.render_studies(rows, location.masked))
    return 0


def _stored_extras(storage: object, name: str) -> tuple[list[dict], FinalScores | None]:
    """What `run --update-settings` recorded with the study (record/study/drift.py), and the
    scores its end stored (record/study/final_scores.py)."""
    study = optuna.load_study(study_name=name, storage=storage)
    return drift.stored_updates(study), final_scores_of(study.user_attrs)


def _console() -> rich_console.Console:
    # Off a terminal rich assumes 80 columns; the tables read better wider in a log or a pipe.
    terminal = sys.stdout.isatty()
    return rich_console.Console(width=None if terminal else 120, highlight=False)
