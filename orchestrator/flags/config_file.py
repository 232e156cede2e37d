"""`--config study.toml` (or .yaml): any of a command's options in a file, the command line winning.

The file's keys are the command's option names (`trials`, `swarm_size` or `swarm-size`, ...), plus
`adapter` for run's positional ADAPTER and `options` (a table of adapter options) for `--option`.
Its values become the parser's defaults, so whatever is typed on the command line overrides them;
`--option KEY=VALUE` typed adds to (and for the same key replaces) the file's `options`.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import yaml
else:
    yaml = LazyImport("yaml")

CONFIG_SUFFIXES = (".toml", ".yaml", ".yml")
# Keys that name something other than an option of the command.
_NOT_SETTABLE = {"help", "version", "config", "handler", "command"}
_ALIASES = {"options": "option"}  # `options = {...}` reads better in a file than `option`


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="read options from a TOML or YAML file; flags typed here override it",
    )


def config_path_in(argv: Sequence[str]) -> str | None:
    """The value of `--config` in argv (`--config F` or `--config=F`), before anything is parsed."""
    for i, item in enumerate(argv):
        if item == "--":
            break
        if item == "--config":
            return argv[i + 1] if i + 1 < len(argv) else None
        if item.startswith("--config="):
            return item.partition("=")[2]
    return None


def read_config(path: str) -> dict[str, Any]:
    """The file's top-level mapping; any problem reading it is one UserError line."""
    file = Path(path)
    if file.suffix.lower() not in CONFIG_SUFFIXES:
        raise UserError(f"--config {path}: name a .toml, .yaml or .yml file")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read --config {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UserError(
            f"--config {path} is not a text file (byte {error.start} is not UTF-8): give a "
            "TOML or YAML file"
        ) from None
    if file.suffix.lower() == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise UserError(f"--config {path} is not valid TOML: {error}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:  # its message spans lines: keep it to one
            reason = " ".join(str(error).split())
            raise UserError(f"--config {path} is not valid YAML: {reason}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise UserError(f"--config {path} must hold a mapping of option names to values")
    return dict(data)


def settable_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The command's options by the name a config file uses for them (argparse's dest)."""
    return {
        action.dest: action
        for action in parser._actions  # argparse keeps no public list of a parser's arguments
        if action.dest not in _NOT_SETTABLE and action.dest != argparse.SUPPRESS
    }


def config_defaults(
    config: Mapping[str, Any], parser: argparse.ArgumentParser, path: str
) -> dict[str, Any]:
    """The file's values as parser defaults, each checked as its flag would be."""
    actions = settable_actions(parser)
    defaults: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = _ALIASES.get(str(raw_key).replace("-", "_"), str(raw_key).replace("-", "_"))
        action = actions.get(key)
        if action is None:
            valid = ", ".join(sorted({*actions, *_ALIASES} - set(_ALIASES.values())))
            raise UserError(f"--config {path}: unknown key {raw_key!r}; valid keys: {valid}")
        defaults[key] = _checked(action, raw_key, value, path)
    return defaults


def _checked(action: argparse.Action, key: Any, value: Any, path: str) -> Any:
    where = f"--config {path}: {key}"
    if isinstance(action, argparse._AppendAction):  # --option KEY=VALUE, repeatable
        if isinstance(value, Mapping):
            return [f"{k}={_text(v)}" for k, v in value.items()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise UserError(f"{where} must be a table of KEY = VALUE (or a list of 'KEY=VALUE')")
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise UserError(f"{where} = {value!r} must be true or false")
        return value
    if isinstance(value, Mapping | list):
        raise UserError(f"{where} must be a single value, not {type(value).__name__}")
    if action.type is not None:
        # A TOML boolean is checked as the text the file holds (`true`), not Python's `True`.
        shown = _text(value) if isinstance(value, bool) else repr(value)
        try:
            value = action.type(_text(value))
        except argparse.ArgumentTypeError as error:
            # The flag's own check says what is wrong and what to give (finite, in range...).
            raise UserError(f"{where} = {shown}: {error}") from None
        except (TypeError, ValueError):
            kind = {"int": "an integer", "float": "a number"}.get(
                getattr(action.type, "__name__", ""), "a valid value"
            )
            raise UserError(f"{where} = {shown} must be {kind}") from None
    elif value is not None and not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise UserError(f"{where} = {value!r} is not one of: {choices}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def subcommand_parser(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.ArgumentParser | None:
    """The parser of the subcommand named in argv (the first word that is not an option)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for item in argv:
                if not item.startswith("-"):
                    return action.choices.get(item)
    return None


def apply_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """If argv names a config file, make its values the subcommand's defaults (UserError if bad)."""
    path = config_path_in(argv)
    if path is None:
        return
    sub = subcommand_parser(parser, argv)
    if sub is None or not any(action.dest == "config" for action in sub._actions):
        return  # argparse itself will say that this command takes no --config
    sub.set_defaults(**config_defaults(read_config(path), sub, path))
