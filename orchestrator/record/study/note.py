"""The study's optuna-dashboard note: the scores to trust, at the top of the study's page.

optuna-dashboard draws a study's markdown note above its charts; the study's user attributes
(where `final_scores` is kept) sit far below. A note is stored as the dashboard stores it: a
version and chunks of 2,045 characters in the study's system attributes; chunks left from a
longer earlier note are blanked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import storage_of, study_id_of
from orchestrator.record.trials.notes import save_note

if TYPE_CHECKING:
    import optuna
    from optuna_dashboard import _note as dashboard_note
else:
    dashboard_note = LazyImport("optuna_dashboard._note")

logger = logging.getLogger(__name__)


def save_study_note(study: optuna.Study, body: str) -> None:
    storage, study_id = storage_of(study), study_id_of(study)
    save_note(storage, study_id, None, storage.get_study_system_attrs(study_id), body)


def write_study_note(study: optuna.Study, body: str) -> bool:
    """Save `body` as the study's note; a storage that refuses it costs a warning, no more."""
    try:
        save_study_note(study, body)
    except Exception as error:  # SQLAlchemyError, or an optuna-dashboard of another layout
        logger.warning("no dashboard note for study %r: %s", study.study_name, error)
        return False
    return True


def read_study_note(study: optuna.Study) -> str:
    """The study's note as optuna-dashboard reads it ("" when it has none)."""
    attrs = storage_of(study).get_study_system_attrs(study_id_of(study))
    return dashboard_note.get_note_from_system_attrs(attrs, None)["body"]
