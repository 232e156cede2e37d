"""Command line: parse, call, print. A UserError becomes one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable
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
    "slurm",
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
        from orchestrator.record.passwords import redact

        # "argument --trials: --trials 0 must be..." says the flag twice: once is enough.
        head, sep, rest = message.partition(": ")
        if (
            sep
            and head.startswith("argument ")
            and rest.startswith(head.split()[-1].split("/")[-1])
        ):
            message = rest
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


# --- values, checked where they are parsed ----------------------------------------------
#
# Each factory returns an argparse `type=` whose refusal names the flag, the value and what to
# give instead; Parser.error then prints it as one line. Nothing is stored before parsing ends.

DB_INT_MAX = 2**31 - 1  # trial numbers and report steps are 32-bit integers in the database
SEED_MAX = 2**32 - 1
STUDY_NAME_MAX = 512  # Optuna's studies.study_name column


def whole_number(
    flag: str, *, low: int = 1, high: int = DB_INT_MAX, example: int | None = None
) -> Callable[[str], int]:
    """A whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r} is not a whole number: give e.g. {flag} {example or low}"
            ) from None
        if value < low or value > high:
            raise argparse.ArgumentTypeError(
                f"{flag} {value} must be at least {low}"
                if value < low
                else f"{flag} {text} is more than {high:,}: give at most {flag} {high}"
            )
        return value

    return parse


def number(
    flag: str, *, low: float = 0.0, above_low: bool = False, example: str = "1"
) -> Callable[[str], float]:
    """A finite number of at least `low` (more than `low` with `above_low`): NaN and inf refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r} is not a finite number: give e.g. {flag} {example}"
            )
        if value < low or (above_low and value == low):
            bound = "more than" if above_low else "at least"
            raise argparse.ArgumentTypeError(f"{flag} {text} must be {bound} {low:g}")
        return value

    return parse


def study_name(text: str) -> str:
    """A study name: not empty, one line, as long as the database holds."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"--study {text!r} is empty: name the study, e.g. --study dqn-l4"
        )
    if any(not char.isprintable() for char in text):
        raise argparse.ArgumentTypeError(
            f"--study {text!r} holds a control character (a newline, a tab): use letters, "
            "digits, '-' and '_'"
        )
    if len(text) > STUDY_NAME_MAX:
        raise argparse.ArgumentTypeError(
            f"--study is {len(text)} characters long: the database holds at most {STUDY_NAME_MAX}"
        )
    return text


def input_file(flag: str, what: str) -> Callable[[str], str]:
    """A path to a file that exists and can be read."""
    from adapters.base import InputFile

    def parse(text: str) -> str:
        problem = InputFile(what).problem(text) if text else f"is empty: give {what}"
        if problem:
            raise argparse.ArgumentTypeError(f"{flag} {text} {problem}")
        return text

    return parse


def user_checked(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type from a function that raises UserError (its message already names the flag)."""

    def parse(text: str) -> str:
        try:
            return check(text)
        except UserError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_storage_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage",
        metavar="URL",
        type=user_checked(_storage_url),
        help="study database (default: $ORCHESTRATOR_STORAGE, else sqlite:///orchestrator.db)",
    )


def _storage_url(text: str) -> str:
    from orchestrator.record.passwords import remember_secret
    from orchestrator.record.storage_url import parse_url

    remember_secret(text)  # it may come from a --config file, which argv does not show
    if not text.strip():
        raise UserError("--storage is empty: give e.g. --storage sqlite:///study.db")
    parse_url(text)
    return text


def add_adapter_arguments(parser: argparse.ArgumentParser) -> None:
    """`--adapter-path` and `--option`: your own adapter, and an adapter's options (run, plan)."""
    parser.add_argument(
        "--adapter-path",
        metavar="MODULE:ATTRIBUTE",
        help="use an adapter object from your own module",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an adapter option (repeatable), e.g. --option per_sample_mb=0.05",
    )


def add_swarm_size_argument(parser: argparse.ArgumentParser) -> None:
    from orchestrator.record.study import StudySpec

    parser.add_argument(
        "--swarm-size",
        type=whole_number("--swarm-size", high=100_000, example=20),
        metavar="N",
        help="particles in the swarm: the most trials one GPU runs at once "
        f"(default {StudySpec.swarm_size})",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", "-q", action="store_true", help="print only the result")
    group.add_argument("--verbose", "-v", action="store_true", help="log every decision")


def command_parser(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, example: str
) -> Parser:
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
    from orchestrator.record.passwords import protect_output, remember_secret
    from orchestrator.record.storage_url import STORAGE_ENV

    for token in [*argv, os.environ.get(STORAGE_ENV, "")]:
        remember_secret(token)
        remember_secret(token.partition("=")[2])  # --storage=URL
    protect_output()


def main(argv: list[str] | None = None) -> int:
    from orchestrator.config_file import apply_config
    from orchestrator.record.passwords import redact

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
    from orchestrator.record.outage_state import note_command
    from orchestrator.record.storage_failures import storage_failure

    note_command(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as error:
        print(redact(f"error: {error}"), file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
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
