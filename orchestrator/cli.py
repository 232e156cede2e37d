"""Command line: parse, call, print. A UserError becomes one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.commands import (
    adapters,
    best,
    dashboard,
    db,
    logs,
    manifests,
    plan,
    report,
    run,
    slurm,
    status,
    worker,
)
from orchestrator.errors import UserError
from orchestrator.flags.common import Parser
from orchestrator.flags.config_file import apply_config
from orchestrator.imports import LazyImport
from orchestrator.interrupts import Terminated, say
from orchestrator.record.outages.state import note_command
from orchestrator.record.store.location import STORAGE_ENV
from orchestrator.record.store.passwords import protect_output, redact, remember_secret
from orchestrator.record.store.storage_failures import storage_failure

if TYPE_CHECKING:
    from importlib import metadata
    from types import ModuleType
else:
    metadata = LazyImport("importlib.metadata")

EPILOG = """examples:
  python -m orchestrator run dqn                      tune the DQN agent on this machine
  python -m orchestrator plan dqn --gpus sim:24576    what would fit on a 24 GB GPU
  python -m orchestrator dashboard                    watch it in optuna-dashboard
"""


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m orchestrator",
        description="Hyperparameter studies for PyTorch models on GPUs, on Optuna.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subparsers.required = True
    for command in commands():
        command.register(subparsers)
    return parser


def commands() -> tuple[ModuleType, ...]:
    """Every command, in the order `--help` lists them. Each module has `register(subparsers)`
    and imports nothing heavy at the top, so `--help` stays instant."""
    return (
        run,
        worker,
        plan,
        status,
        best,
        report,
        logs,
        dashboard,
        adapters,
        manifests,
        slurm,
        db,
    )


def package_version() -> str:
    try:
        return metadata.version("gpu-study-orchestrator")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


class VersionAction(argparse.Action):
    """`--version`, its number read from the package's metadata only when asked for: reading
    it loads `importlib.metadata`, a tenth of what every other command line imports."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"gpu-study-orchestrator {package_version()}")
        parser.exit()


def remember_secrets(argv: list[str]) -> None:
    """Every password on the command line or in $ORCHESTRATOR_STORAGE is hidden from then on."""
    for token in [*argv, os.environ.get(STORAGE_ENV, "")]:
        remember_secret(token)
        remember_secret(token.partition("=")[2])  # --storage=URL
    protect_output()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    remember_secrets(argv)
    parser = build_parser()
    try:
        apply_config(parser, argv)  # a --config file's values become the command's defaults
    except UserError as error:
        print(redact(f"error: {error}"), file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # a usage error (said in one line) or --help: its status
        return stop.code if isinstance(stop.code, int) else 2
    note_command(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as error:
        print(redact(f"error: {error}"), file=sys.stderr)
        return error.exit_status
    except (KeyboardInterrupt, Terminated) as stop:
        return say(stop)
    except BrokenPipeError:
        # The reader went away (`status --json | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:
        # A database error no command caught (a locked or read-only SQLite file, a server
        # gone): one line. Anything else is a bug, and its traceback is what helps.
        failure = storage_failure(error)
        if failure is None:
            raise
        print(redact(f"error: {failure}"), file=sys.stderr)
        return failure.exit_status


if __name__ == "__main__":
    raise SystemExit(main())
