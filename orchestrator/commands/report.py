"""`report`: a self-contained HTML page and PNG charts of one study."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.flags.common import add_storage_argument, command_parser, study_name
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation

if TYPE_CHECKING:
    from orchestrator.show import queries
    from orchestrator.show.report import page as report_page
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    queries = LazyImport("orchestrator.show.queries")
    report_page = LazyImport("orchestrator.show.report.page")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "report",
        help="write an HTML page (opens offline) and PNG charts of a study",
        example="python -m orchestrator report --study dqn --out reports/dqn",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study to report on (default: the storage's only study)",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "--out", metavar="DIR", required=True, help="directory for index.html and the PNGs"
    )
    parser.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    storage = queries.open_for_reading(location)
    label = location.describe()
    name = queries.the_study(storage, args.study, label, "report")
    study = queries.load_study_trials(storage, name, label)  # read once, for both
    detail = queries.study_detail(storage, name, label, trials=study.get_trials())
    # Several objectives: the report shows their Pareto front instead of one best trial.
    files = report_page.write_report(study, detail, Path(args.out))
    print(f"report of {name!r}: {files.page}")
    for png in files.pngs:
        print(f"  {png}")
    if files.csv is not None:
        print(f"  {files.csv}")
    for note in files.notes:
        print(f"  ({note})")
    return 0
