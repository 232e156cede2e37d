"""`best`: the best trial's parameters, as JSON or YAML, ready for a training run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli import add_storage_argument, command_parser
from orchestrator.errors import UserError


def register(subparsers) -> None:  # noqa: ANN001
    parser = command_parser(
        subparsers,
        "best",
        help="write the best trial's parameters as JSON or YAML",
        example="python -m orchestrator best --study dqn --format yaml --out dqn-best.yaml",
    )
    parser.add_argument("--study", metavar="NAME", required=True, help="the study to read")
    add_storage_argument(parser)
    parser.add_argument(
        "--format", choices=("json", "yaml"), default="json", help="output format (default json)"
    )
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    parser.set_defaults(handler=best_command)


def format_params(params: dict[str, Any], fmt: str) -> str:
    """The parameters as a JSON object or a YAML mapping, in the order they were declared."""
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(params, sort_keys=False, default_flow_style=False)
    return json.dumps(params, indent=2) + "\n"


def best_command(args: argparse.Namespace) -> int:
    from orchestrator.inspect import open_for_reading, require_single_objective, study_detail
    from orchestrator.storage import describe_location, resolve_storage_url

    url = resolve_storage_url(args.storage)
    detail = study_detail(open_for_reading(url), args.study, describe_location(url))
    require_single_objective(detail, "best")
    if detail.best is None:
        raise UserError(
            f"study {args.study!r} has no completed trial yet: wait for one "
            f"(`python -m orchestrator status --study {args.study}` shows its progress)"
        )
    text = format_params(detail.best.params, args.format)
    about = f"best of {args.study!r}: trial #{detail.best.number}, value {detail.best.value:.6g}"
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
