"""Command line: parse, call, print. A UserError becomes one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from orchestrator.errors import UserError

# Each command is a module in orchestrator.commands with `register(subparsers)`; the module
# imports nothing heavy at the top so `--help` stays instant.
COMMANDS = (
    "run",
    "worker",
    "plan",
    "status",
    "best",
    "report",
    "logs",
    "dashboard",
    "adapters",
    "manifests",
    "db",
)

EPILOG = """examples:
  python -m orchestrator run dqn                      tune the DQN agent on this machine
  python -m orchestrator plan dqn --gpus sim:24576    what would fit on a 24 GB GPU
  python -m orchestrator dashboard                    watch it in optuna-dashboard
"""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit 2), not a usage block.

    Abbreviations are off: `--stor URL` must not be taken for `--storage-secret URL` (and then
    printed whole). Every message is redacted, since argparse quotes what the user typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        from orchestrator.storage import redact

        self.exit(2, redact(f"error: {message} (see `{self.prog} --help`)") + "\n")


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m orchestrator",
        description="Hyperparameter studies for PyTorch models on GPUs, on Optuna.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"gpu-study-orchestrator {package_version()}"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subparsers.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"orchestrator.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"orchestrator.commands.{name}":
                continue  # not built yet in this checkout
            raise
        module.register(subparsers)
    return parser


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-study-orchestrator")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def add_storage_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage",
        metavar="URL",
        help="study database (default: $ORCHESTRATOR_STORAGE, else sqlite:///orchestrator.db)",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", "-q", action="store_true", help="print only the result")
    group.add_argument("--verbose", "-v", action="store_true", help="log every decision")


def command_parser(subparsers, name: str, *, help: str, example: str) -> Parser:  # noqa: ANN001, A002
    """A subcommand parser whose --help ends with an example."""
    return subparsers.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def configure_logging(verbose: bool = False, quiet: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    # Short lines in the progress display's style; the module name only when debugging.
    detail = " %(name)s" if verbose else ""
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s{detail} %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # Optuna logs every trial at INFO; our progress display says the same thing once.
    import optuna

    optuna.logging.set_verbosity(logging.DEBUG if verbose else logging.WARNING)


def remember_secrets(argv: list[str]) -> None:
    """Every password on the command line or in $ORCHESTRATOR_STORAGE is hidden from then on."""
    from orchestrator.storage import STORAGE_ENV, protect_output, remember_secret

    for token in [*argv, os.environ.get(STORAGE_ENV, "")]:
        remember_secret(token)
        remember_secret(token.partition("=")[2])  # --storage=URL
    protect_output()


def main(argv: list[str] | None = None) -> int:
    from orchestrator.config_file import apply_config
    from orchestrator.storage import redact

    argv = sys.argv[1:] if argv is None else list(argv)
    remember_secrets(argv)
    parser = build_parser()
    try:
        apply_config(parser, argv)  # a --config file's values become the command's defaults
    except UserError as error:
        print(redact(f"error: {error}"), file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as error:
        print(redact(f"error: {error}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`status --json | head`): stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
