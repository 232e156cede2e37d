"""`worker --study NAME`: join a study from this node; everything else is stored with the study."""

from __future__ import annotations

import argparse

from orchestrator.cli import add_output_arguments, add_storage_argument, command_parser


def register(subparsers) -> None:  # noqa: ANN001
    from orchestrator.launch import add_pool_arguments

    parser = command_parser(
        subparsers,
        "worker",
        help="join an existing study and run its trials on this node's GPUs until its budget is used",
        example="python -m orchestrator worker --study dqn --storage postgresql://user@db:5432/studies",
    )
    parser.add_argument("--study", required=True, metavar="NAME", help="the study to join")
    add_storage_argument(parser)
    add_pool_arguments(parser)
    add_output_arguments(parser)
    parser.set_defaults(handler=worker_command)


def worker_command(args: argparse.Namespace) -> int:
    from orchestrator.errors import UserError
    from orchestrator.gpu import select_devices
    from orchestrator.launch import (
        check_pool_arguments,
        configure,
        metric_name,
        print_outcome,
        resolve_adapter,
        run_pool,
    )
    from orchestrator.migrate import open_storage
    from orchestrator.retry import stale_trial_callback
    from orchestrator.storage import describe_location, parse_url, resolve_storage_url
    from orchestrator.study import load_existing_study, load_spec

    configure(args)
    check_pool_arguments(args)
    url = resolve_storage_url(args.storage)
    parse_url(url)
    select_devices(args.gpus)
    storage = open_storage(url, heartbeat=True, heartbeat_stale_trial_callback=stale_trial_callback)
    study = load_existing_study(storage, args.study, describe_location(url))
    spec = load_spec(study)
    if spec is None:
        raise UserError(
            f"study {args.study!r} has no orchestrator settings: start it with `python -m orchestrator run ADAPTER --study {args.study}`"
        )
    adapter = resolve_adapter(spec)
    outcome = run_pool(url=url, storage=storage, study=study, spec=spec, args=args)
    print_outcome(outcome, metric=metric_name(adapter, spec.options), as_json=args.json)
    return 130 if outcome.interrupted else 0
