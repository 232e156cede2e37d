"""`best`: the best trial's parameters, as JSON or YAML, ready for a training run; for a study
of several objectives, its Pareto front (each trial's values and parameters), also as a table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli import add_storage_argument, command_parser, study_name
from orchestrator.errors import UserError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "best",
        help="write the best trial's parameters (several objectives: the Pareto front)",
        example="python -m orchestrator best --study dqn --format yaml --out dqn-best.yaml",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study to read (default: the storage's only study)",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "--format",
        choices=("json", "yaml", "text"),
        default="json",
        help="output format (default json; text: a table)",
    )
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    parser.set_defaults(handler=best_command)


def format_params(params: Any, fmt: str) -> str:
    """The parameters as a JSON object or a YAML mapping, in the order they were declared."""
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(params, sort_keys=False, default_flow_style=False)
    return json.dumps(params, indent=2) + "\n"


def best_command(args: argparse.Namespace) -> int:
    from orchestrator.record.storage_url import describe_location, resolve_storage_url
    from orchestrator.show.queries import open_for_reading, study_detail, the_study
    from orchestrator.show.views import MULTI_OBJECTIVE

    url = resolve_storage_url(args.storage)
    storage = open_for_reading(url)
    name = the_study(storage, args.study, describe_location(url), "best")
    detail = study_detail(storage, name, describe_location(url))
    if detail.direction == MULTI_OBJECTIVE:
        return _write(args, *_front(storage, name, args.format))
    if detail.best is None:
        raise UserError(
            f"study {name!r} has no completed trial yet: wait for one "
            f"(`python -m orchestrator status --study {name}` shows its progress)"
        )
    params = detail.best.params
    if args.format == "text":
        text = "".join(f"{key}: {value}\n" for key, value in params.items())
    else:
        text = format_params(params, args.format)
    about = f"best of {name!r}: trial #{detail.best.number}, value {detail.best.value:.6g}"
    return _write(args, text, about)


def _front(storage: Any, name: str, fmt: str) -> tuple[str, str]:
    """The study's Pareto front in `fmt`, and the line that says what it is."""
    import optuna

    from orchestrator.record.best_trial import directions_of
    from orchestrator.show.front import front_of, front_table, objective_names
    from orchestrator.show.text import to_jsonable

    study = optuna.load_study(study_name=name, storage=storage)
    directions = directions_of(study)
    names = objective_names(study.metric_names, len(directions))
    front = front_of(study.get_trials(deepcopy=False), directions, study.metric_names)
    if not front:
        raise UserError(
            f"study {name!r} has no completed trial yet: wait for one "
            f"(`python -m orchestrator status --study {name}` shows its progress)"
        )
    goals = ", ".join(f"{n} ({d[:3]})" for n, d in zip(names, directions, strict=True))
    about = f"Pareto front of {name!r}: {len(front)} trial(s), {goals}"
    if fmt == "text":
        return front_table(front, names), about
    rows = [{"trial": t.number, "values": t.values, "params": t.params} for t in front]
    return format_params(to_jsonable(rows), fmt), about


def _write(args: argparse.Namespace, text: str, about: str) -> int:
    if args.out is None:
        sys.stdout.write(text)
        print(about, file=sys.stderr)
        return 0
    path = Path(args.out)
    try:
        path.write_text(text)
    except OSError as error:
        raise UserError(
            f"cannot write {path}: {error.strerror or error}; choose a writable path with --out"
        ) from None
    print(f"{about}; parameters written to {path}", file=sys.stderr)
    return 0
