"""`--checkpoint-every` and `--artifacts`: how often a trial's training is checkpointed, and where.

Both are stored with the study (every worker on every node reads them from there) and may change
on any resume: they say how a trial survives an interruption, not what it computes. `--artifacts`
is checked before anything is stored (record/checkpoints/place.py) and stored absolute.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    from orchestrator.record.checkpoints import files as checkpoint_files
else:
    # Used when the flags are checked, not when `--help` builds the parser.
    checkpoint_files = LazyImport("orchestrator.record.checkpoints.files")


def _every(text: str) -> int:
    if text.strip().lower() in ("none", "0"):
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"--checkpoint-every {text!r} is not a number of epochs: give e.g. "
            "--checkpoint-every 2, or none"
        )
    return value


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every",
        type=_every,
        metavar="N",
        help="checkpoint each trial's training every N epochs, `none` for never (default 1); "
        "a re-run of a stopped trial goes on from its last checkpoint (docs/checkpoints.md)",
    )
    parser.add_argument(
        "--artifacts",
        metavar="PATH_OR_URL",
        help="where checkpoints are kept: a folder every node shares (made if missing, stored "
        "absolute), s3://BUCKET or gs://BUCKET; never credentials in it (default: a folder "
        "beside the SQLite file; a PostgreSQL study keeps none without it)",
    )


def checkpoint_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The spec's checkpoint settings as typed (None: not typed, the stored or default value)."""
    location = checkpoint_files.check_location(getattr(args, "artifacts", None))
    return {"checkpoint_every": getattr(args, "checkpoint_every", None), "artifacts": location}
