"""`--repeats`, `--confirm` and `--confirm-seeds`: the flags of results to trust (run and best).

`--repeats N` trains each trial N times with seeds seed .. seed + N - 1 and scores it on their
mean (adapters/repeats.py); `--confirm K` re-runs the top K trials with more seeds once the study
ends, ranks them again on the mean and tests the first (orchestrator/selection.py). Both train
again with other seeds, so both need an adapter with a `seed` option.
"""

from __future__ import annotations

import argparse
from typing import Any

from adapters.repeats import MAX_REPEATS, check_repeats
from orchestrator.errors import UserError
from orchestrator.flags.common import whole_number
from orchestrator.selection import DEFAULT_CONFIRM_SEEDS, Selection


def add_repeats_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeats",
        type=whole_number("--repeats", low=1, high=MAX_REPEATS, example=3),
        metavar="N",
        help="train each trial N times with seeds seed..seed+N-1 and score it on their mean "
        "(default 1; resuming keeps it; needs an adapter with a seed option)",
    )


def add_confirm_arguments(parser: argparse.ArgumentParser, *, at_the_end: bool) -> None:
    when = "when the study ends, " if at_the_end else "first "
    default = (
        "default 0: the best trial tested once, where the adapter has a test part"
        if at_the_end
        else "0: test the best trial and score the baselines; stored with the study"
    )
    parser.add_argument(
        "--confirm",
        type=whole_number("--confirm", low=0, high=100, example=3),
        metavar="K",
        help=f"{when}re-run the top K trials with more seeds, rank them again on the mean and "
        f"test the first ({default})",
    )
    parser.add_argument(
        "--confirm-seeds",
        type=whole_number("--confirm-seeds", low=1, high=100, example=3),
        metavar="S",
        help=f"seeds for each --confirm re-run and the test (default {DEFAULT_CONFIRM_SEEDS})",
    )


def check_confirm(args: argparse.Namespace, adapter: Any) -> None:
    """--confirm K > 0 needs a seed option; --confirm-seeds needs --confirm."""
    if args.confirm and "seed" not in (getattr(adapter, "options", None) or {}):
        raise UserError(
            f"--confirm {args.confirm} re-runs trials with other seeds, and adapter "
            f"{adapter.name!r} has no `seed` option: give it one, or use --confirm 0"
        )
    if args.confirm is None and args.confirm_seeds is not None:
        raise UserError(
            f"--confirm-seeds {args.confirm_seeds} needs --confirm K: the seeds of each re-run "
            "of the top K trials"
        )


def check_trust_flags(args: argparse.Namespace, adapter: Any) -> None:
    """What `run` was given, checked before anything is stored: a one-line UserError."""
    if args.repeats is not None:
        check_repeats(adapter, args.repeats)
    check_confirm(args, adapter)


def selection_of(args: argparse.Namespace) -> Any:
    """What the study's end scores (orchestrator/selection.py)."""
    return Selection(top=args.confirm or 0, seeds=args.confirm_seeds or DEFAULT_CONFIRM_SEEDS)
