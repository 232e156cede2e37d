"""A trial's user attributes written in one transaction instead of one each.

A trial writes about a dozen user attributes (where it ran, its estimate, its peak, its log
file...). Optuna's `set_user_attr` commits each one on its own: on PostgreSQL about 10-20 ms a
commit, on every trial. This writes a set of them with Optuna's own upsert for each (the same
rows, the same checks that the trial is still running), committed once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.store.optuna_private import (
    cached_trial_of,
    rdb_models,
    rdb_storage_of,
    scoped_session,
    set_trial_attr_without_commit,
    trial_id_of,
)

if TYPE_CHECKING:
    import optuna
else:
    optuna = LazyImport("optuna")


def set_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    models = rdb_models()

    backend = rdb_storage_of(trial.storage)  # Optuna's cache wraps it
    if not isinstance(backend, optuna.storages.RDBStorage) or not attrs:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return

    def write() -> None:
        with scoped_session(backend, True) as session:
            for key, value in attrs.items():
                set_trial_attr_without_commit(
                    backend, session, models.TrialUserAttributeModel, trial_id_of(trial), key, value
                )

    # An upsert each: redone whole after a lost connection, it writes the same rows again.
    ride_out(write, what=f"write the attributes of trial {trial.number}")
    cached_trial_of(trial).user_attrs.update(attrs)  # as set_user_attr keeps it
