"""The commands' shared flags: the one-line usage error, the value checks each flag's `type=` uses,
the flags several commands take (`--storage`, `--quiet`/`--verbose`, an adapter's options), and
the logging those flags ask for."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapters.base import (
    SEED_MAX,  # noqa: F401  (the adapters' seed range is `--seed`'s)
    InputFile,
)
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.passwords import redact, remember_secret
from orchestrator.record.study import names as study_names
from orchestrator.record.study.spec import StudySpec

if TYPE_CHECKING:
    import difflib

    import optuna
else:
    optuna = LazyImport("optuna")
    # Suggests a name for a typo only: not loaded by every `--help`.
    difflib = LazyImport("difflib")


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit 2), not a usage block.

    Abbreviations are off: `--stor URL` must not be taken for `--storage-secret URL` (and then
    printed whole). Every message is redacted, since argparse quotes what the user typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        # "argument --trials: --trials 0 must be..." says the flag twice: once is enough.
        head, sep, rest = message.partition(": ")
        if (
            sep
            and head.startswith("argument ")
            and rest.startswith(head.split()[-1].split("/")[-1])
        ):
            message = rest
        if message.startswith("unrecognized arguments:"):
            message += self._did_you_mean(message)
        self.exit(2, redact(f"error: {message} (see `{self.prog} --help`)") + "\n")

    def _did_you_mean(self, message: str) -> str:
        """`--trails` is most likely `--trials`: the closest flag of any command, if one is close."""
        flags = set(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags |= set(sub._option_string_actions)
        for word in message.split(":", 1)[1].split():
            if word.startswith("--") and word not in flags:
                close = difflib.get_close_matches(word.partition("=")[0], sorted(flags), n=1)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""


# --- values, checked where they are parsed ----------------------------------------------
#
# Each factory returns an argparse `type=` whose refusal names the flag, the value and what to
# give instead; Parser.error then prints it as one line. Nothing is stored before parsing ends.

DB_INT_MAX = 2**31 - 1  # trial numbers and report steps are 32-bit integers in the database
STUDY_NAME_MAX = study_names.STUDY_NAME_MAX


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

    def parse(text: str) -> str:
        problem = InputFile(what).problem(text) if text else f"is empty: give {what}"
        if problem:
            shown = text if text.isprintable() else repr(text)  # one line, whatever was typed
            raise argparse.ArgumentTypeError(f"{flag} {shown} {problem}")
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


def _storage_url(text: str) -> StorageLocation:
    remember_secret(text)  # it may come from a --config file, which argv does not show
    if not text.strip():
        raise UserError("--storage is empty: give e.g. --storage sqlite:///study.db")
    return StorageLocation.parse(text)


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
    parser.add_argument(
        "--swarm-size",
        type=whole_number("--swarm-size", high=100_000, example=StudySpec.swarm_size),
        metavar="N",
        help="particles in the swarm (members of a --sampler pbt population): the most "
        "trials one GPU runs at once "
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
    optuna.logging.set_verbosity(logging.DEBUG if verbose else logging.WARNING)
