"""`db upgrade`: create Optuna's schema, then bring our orch_* tables to head."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from orchestrator.flags.common import add_storage_argument, command_parser
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation

if TYPE_CHECKING:
    from orchestrator.record.store import migrate
    from orchestrator.record.store import storage as storages
else:
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    migrate = LazyImport("orchestrator.record.store.migrate")
    storages = LazyImport("orchestrator.record.store.storage")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "db",
        help="create or upgrade the study database (Optuna's tables, then ours)",
        example="python -m orchestrator db upgrade --storage postgresql://user@db:5432/studies",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    upgrade = actions.add_parser("upgrade", help="bring both schemas to the newest revision")
    add_storage_argument(upgrade)
    upgrade.set_defaults(handler=upgrade_command)
    current = actions.add_parser("current", help="print the revisions the database is at")
    add_storage_argument(current)
    current.set_defaults(handler=current_command)


def upgrade_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    storage = migrate.open_storage(location)
    print(
        f"{location.masked}: optuna schema {storage.get_current_version()}, "
        f"orchestrator schema {migrate.current_revision(storage)}"
    )
    return 0


def current_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    storage = storages.create_storage(location)
    ours = migrate.current_revision(storage)
    behind = (
        ""
        if ours == migrate.head_revision()
        else f" (head is {migrate.head_revision()}: run `python -m orchestrator db upgrade`)"
    )
    print(
        f"{location.masked}: optuna schema {storage.get_current_version()}, "
        f"orchestrator schema {ours}{behind}"
    )
    return 0
