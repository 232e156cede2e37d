"""Checkpoints of a study's trials, for Python code: where a trial's latest one is.

    from orchestrator import checkpoints
    found = checkpoints.latest(study, 12)       # Checkpoint(trial, artifact_id, epoch) or None
    checkpoints.location(study, found)          # its file, or its object's URL

docs/checkpoints.md describes the handle a trial trains with and the attributes it records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.record.checkpoints.files import Checkpoint, latest, study_location, where

if TYPE_CHECKING:
    import optuna

__all__ = ["Checkpoint", "latest", "location"]


def location(study: optuna.Study, checkpoint: Checkpoint) -> str | None:
    """Where `checkpoint` is kept: a file path or an s3:// or gs:// URL (None: the study keeps
    no checkpoints)."""
    folder = study_location(study)
    return None if folder is None else where(folder, checkpoint.artifact_id)
