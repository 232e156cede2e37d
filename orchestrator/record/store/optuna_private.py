"""Optuna's private names that this product reads or writes, every one of them here, each with
why it is needed.

Optuna 5 has no public way to reach a study's storage, nor the storage ids of a study and of a
trial, nor RDBStorage's tables and sessions, nor the caches that Optuna keeps in front of them.
The orchestrator needs them to read a study's trials in one query (`trials/reader`), count the
budget under its lock (`budget/claim`, `budget/counts`), write a trial's attributes in one
transaction (`trials/attrs`), keep the sampler's history beside each trial (`samplers/_pso.py`),
fail lost trials (`trials/stale`), ride out a database that goes away (`outages/storage`, a
subclass of RDBStorage), and show a stored study from one read (`show/queries`). Nothing else
names an Optuna private: an Optuna upgrade is checked against this file, and
`tests/test_optuna_contract.py` runs these names on the installed Optuna.

optuna-dashboard's note format (`trials/notes`, `study/note`) is that package's, not Optuna's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.samplers import _base as sampler_base
    from optuna.storages import BaseStorage
    from optuna.storages import _cached_storage as cached_storage
    from optuna.storages._rdb import storage as rdb_storage
    from optuna.trial import FrozenTrial
else:
    cached_storage = LazyImport("optuna.storages._cached_storage")
    optuna = LazyImport("optuna")
    rdb_storage = LazyImport("optuna.storages._rdb.storage")
    sampler_base = LazyImport("optuna.samplers._base")

# The logger of RDBStorage's own messages (its fallback warnings on a lost connection).
RDB_STORAGE_LOGGER = "optuna.storages._rdb.storage"

# RDBStorage's table definitions: a trial process imports them ahead (run/pool/trial_start), as
# opening a storage would on the way to its first trial.
RDB_MODELS_MODULE = "optuna.storages._rdb.models"


# --- a study's and a trial's storage and ids ------------------------------------------------


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (Optuna's cache around the RDBStorage, if any)."""
    return study._storage


def rdb_storage_of(storage: Any) -> Any:
    """The RDBStorage under Optuna's trial cache (`optuna.load_study` wraps an RDBStorage in one,
    and only the RDBStorage has the engine and tables); any other storage as it is."""
    return getattr(storage, "_backend", storage)


def study_id_of(study: optuna.Study) -> int:
    """The study's id in its storage: the key of its trials."""
    return study._study_id


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (its number counts within the study; the id is global)."""
    return trial._trial_id


# --- RDBStorage's tables and sessions -------------------------------------------------------


def rdb_models() -> Any:
    """RDBStorage's table definitions (optuna.storages._rdb.models), for reads in one query."""
    return importlib.import_module(RDB_MODELS_MODULE)  # the module itself, imported on first use


def scoped_session(storage: Any, ignore_integrity_error: bool = False) -> Any:
    """A session of RDBStorage `storage` that commits at the end, as Optuna's own writes do."""
    return rdb_storage._create_scoped_session(storage.scoped_session, ignore_integrity_error)


def set_trial_attr_without_commit(
    storage: Any, session: Any, model: Any, trial_id: int, key: str, value: Any
) -> None:
    """Optuna's own upsert of one trial attribute (with its check that the trial still runs),
    in `session`: several of them commit once (`trials/attrs`)."""
    storage._set_trial_attr_without_commit(session, model, trial_id, key, value)


def use_engine(storage: Any) -> None:
    """Make RDBStorage's schema version check use the storage's engine and sessions again, after
    they were swapped (`store/storage` holds a PostgreSQL trial process to one connection): it keeps its own."""
    storage._version_manager.engine = storage.engine
    storage._version_manager.scoped_session = storage.scoped_session


# --- the RDBStorage subclass that rides out outages (record/outages/storage) ----------------

# RDBStorage's private methods that the subclass overrides: Optuna's trial cache and its own
# public methods call these, so an outage is ridden out there or not at all.
SET_TRIAL_PARAM = "_set_trial_param"
GET_BEST_TRIAL_ID = "_get_best_trial_id"
GET_STALE_TRIAL_IDS = "_get_stale_trial_ids"
CREATE_NEW_TRIAL = "_create_new_trial"
GET_TRIALS = "_get_trials"


def rdb_get_trials(storage: Any, study_id: int, states: Any, *args: Any, **kwargs: Any) -> Any:
    """RDBStorage's own read of a study's trials, for the subclass that overrides it."""
    return optuna.storages.RDBStorage._get_trials(storage, study_id, states, *args, **kwargs)


def prepared_new_trial(storage: Any, study_id: int, template: FrozenTrial, session: Any) -> Any:
    """RDBStorage's insert of a new trial like `template` in `session`, numbered, uncommitted:
    one attempt of its `_create_new_trial`, which retries a commit blind to whether it landed."""
    return storage._get_prepared_new_trial(study_id, template, session)


def set_trial_id(frozen: FrozenTrial, trial_id: int) -> None:
    """Give a FrozenTrial its storage id (FrozenTrial takes it only when constructed)."""
    frozen._trial_id = trial_id


def set_system_attrs(frozen: FrozenTrial, attrs: dict[str, Any]) -> None:
    """Replace a FrozenTrial's system attributes (it has no public setter), as a template that
    Optuna's create writes with the new trial."""
    frozen._system_attrs = attrs


# --- the caches Optuna keeps in front of the storage ----------------------------------------


def cached_trial_of(trial: optuna.Trial) -> FrozenTrial:
    """A running Trial's own copy of itself, which it reads back from (`user_attrs`, `report`):
    a write made around Trial's methods updates it too, so the trial reads what was written."""
    return trial._cached_frozen_trial


def add_to_trial_cache(study: optuna.Study, frozen: FrozenTrial) -> None:
    """Enter a trial made outside Optuna's create (`budget/claim`, under the budget lock) into
    the study's trial cache as its create would, when the storage has that cache."""
    cache = storage_of(study)
    if not hasattr(cache, "_add_trials_to_cache"):
        return
    with cache._lock:
        cache._studies.setdefault(study_id_of(study), cached_storage._StudyInfo())
        cache._add_trials_to_cache(study_id_of(study), [frozen])


def forget_cached_trials(study: optuna.Study) -> None:
    """Drop the study's snapshot of its trials, which Optuna's ask refreshes once a trial: a
    trial asked outside it is read with the next one."""
    study._thread_local.cached_all_trials = None


def study_trials(study: optuna.Study, *, use_cache: bool) -> list[FrozenTrial]:
    """The study's trials, not copied; with `use_cache`, the snapshot its ask refreshed (a
    sampler reads it many times a trial, and the public `get_trials` reads the storage)."""
    return study._get_trials(deepcopy=False, use_cache=use_cache)


def replace_trial_reads(
    study: optuna.Study,
    get_trials: Callable[..., list[FrozenTrial]],
    best_trial: Callable[..., FrozenTrial],
) -> None:
    """Make a study read its trials and its best from these functions, not its storage: the
    private reads too, which `trials`, `best_trial`, `best_value` and Optuna's plots call."""
    study.get_trials = get_trials
    study._get_trials = get_trials
    study._get_best_trial = best_trial


# --- what a trial is handed -----------------------------------------------------------------


def fixed_params_of(trial: optuna.Trial) -> dict[str, Any]:
    """The parameters Optuna hands a trial instead of sampling them (an enqueued or re-run
    trial's), read at ask()."""
    return trial._fixed_params


def system_attrs_of(trial: optuna.Trial) -> dict[str, Any]:
    """The system attributes of a trial being run, as read at ask() (Optuna 5's `Trial` no
    longer shows them)."""
    return trial._cached_frozen_trial.system_attrs


def distribution_contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether `value` (as a user gives it) lies in `dist`: Optuna's own range and step check."""
    return bool(dist._contains(dist.to_internal_repr(value)))


def process_constraints_after_trial(
    constraints_func: Any, study: optuna.Study, trial: Any, state: Any
) -> None:
    """Store a finished trial's constraint values as Optuna's own samplers do after a trial
    (optuna.samplers._base), so a study's feasibility reads the same whichever sampler ran."""
    sampler_base._process_constraints_after_trial(constraints_func, study, trial, state)
