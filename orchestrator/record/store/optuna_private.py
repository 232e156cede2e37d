"""Optuna's private names that this product reads, in one place, with why each is needed.

Optuna 5 has no public way to reach a study's storage, nor the storage ids of a study and of a
trial, nor RDBStorage's tables and sessions. The orchestrator needs them to read a study's
trials in one query (`trial_reader`), count the budget under its lock (`budget_claim`,
`trial_counts`), write a trial's attributes in one transaction (`trial_attrs`), keep the
sampler's history beside each trial (`samplers/_pso.py`) and fail lost trials
(`stale_trials`). Every module asks here for these; an Optuna upgrade is checked against this
file, and `tests/test_optuna_contract.py` runs them on the installed Optuna.

The deeper reaches stay beside the one function that needs them, each with its reason there:
Optuna's trial creation in one attempt (`riding_storage._create_once`), its attribute upsert and
trial cache (`trial_attrs.set_user_attrs`), its study cache (`budget_claim._trial_of`), its
schema version check (`storage`), a study's trial reads (`show/queries`, `samplers/_pso.py`),
a queued trial's fixed parameters (`run/trial/runner`), and optuna-dashboard's note format
(`notes`, `study_note`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

# The logger of RDBStorage's own messages (its fallback warnings on a lost connection).
RDB_STORAGE_LOGGER = "optuna.storages._rdb.storage"


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (Optuna's cache around the RDBStorage, if any)."""
    return study._storage


def study_id_of(study: optuna.Study) -> int:
    """The study's id in its storage: the key of its trials."""
    return study._study_id


def trial_id_of(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """A trial's id in its storage (its number counts within the study; the id is global)."""
    return trial._trial_id


def rdb_models() -> Any:
    """RDBStorage's table definitions (optuna.storages._rdb.models), for reads in one query."""
    from optuna.storages._rdb import models

    return models


def scoped_session(storage: Any, ignore_integrity_error: bool = False) -> Any:
    """A session of RDBStorage `storage` that commits at the end, as Optuna's own writes do."""
    from optuna.storages._rdb.storage import _create_scoped_session

    return _create_scoped_session(storage.scoped_session, ignore_integrity_error)


def process_constraints_after_trial(
    constraints_func: Any, study: optuna.Study, trial: Any, state: Any
) -> None:
    """Store a finished trial's constraint values as Optuna's own samplers do after a trial
    (optuna.samplers._base), so a study's feasibility reads the same whichever sampler ran."""
    from optuna.samplers._base import _process_constraints_after_trial

    _process_constraints_after_trial(constraints_func, study, trial, state)
