"""Checkpoints of a study's trials, for Python code: where a trial's latest one is.

    from orchestrator import checkpoints
    found = checkpoints.latest(study, 12)       # Checkpoint(trial, artifact_id, epoch) or None
    checkpoints.location(study, found)          # its file, or its object's URL
    saved = orchestrator.load_checkpoint(path)  # {"epoch": E, "state": what the trial saved}

docs/checkpoints.md describes the handle a trial trains with and the attributes it records.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from orchestrator.record.checkpoints.files import (
    Checkpoint,
    CheckpointUnreadable,
    latest,
    read_file,
    study_location,
    where,
)

if TYPE_CHECKING:
    import optuna

__all__ = ["Checkpoint", "CheckpointUnreadable", "latest", "load_checkpoint", "location"]


def location(study: optuna.Study, checkpoint: Checkpoint) -> str | None:
    """Where `checkpoint` is kept: a file path or an s3:// or gs:// URL (None: the study keeps
    no checkpoints)."""
    folder = study_location(study)
    return None if folder is None else where(folder, checkpoint.artifact_id)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint file (the weights `best` names) as it was saved: {"epoch": E, "state": S},
    E the epoch it was saved after (from 0) and S the dict the trial's training saved (what each
    built-in adapter saves: docs/checkpoints.md). Read with
    `torch.load(weights_only=True)` onto the CPU (JSON for an adapter without torch), so the file
    runs no code. A missing, cut or foreign file raises `CheckpointUnreadable` naming it."""
    epoch, state = read_file(path)
    return {"epoch": epoch, "state": state}
