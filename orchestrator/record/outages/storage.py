"""Optuna's RDBStorage riding out outages: every database call retried, an ask or a tell never twice."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.outages.state import current
from orchestrator.record.store import optuna_private as private

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

# RDBStorage's methods that use the database, and what each does in a user's words.
_RIDDEN = {
    "create_new_study": "create the study",
    "delete_study": "delete a study",
    "set_study_user_attr": "store the study's settings",
    "set_study_system_attr": "store the sampler's state",
    "get_study_id_from_name": "find the study",
    "get_study_name_from_id": "read the study's name",
    "get_study_directions": "read the study's direction",
    "get_study_user_attrs": "read the study's settings",
    "get_study_system_attrs": "read the sampler's state",
    "get_trial_user_attrs": "read a trial's attributes",
    "get_trial_system_attrs": "read a trial's sampler state",
    "get_all_studies": "list the studies",
    "create_new_trial": "ask for a trial",
    "set_trial_param": "store a trial's parameter",
    private.SET_TRIAL_PARAM: "store a trial's parameter",  # what Optuna's trial cache calls
    private.GET_BEST_TRIAL_ID: "read the best trial",
    "get_trial_param": "read a trial's parameter",
    "set_trial_intermediate_value": "report a trial's progress",
    "set_trial_user_attr": "store a trial's attribute",
    "set_trial_system_attr": "store a trial's sampler state",
    "get_trial_id_from_study_id_trial_number": "find a trial",
    "get_trial": "read a trial",
    "get_all_trials": "read the trials",
    "get_best_trial": "read the best trial",
    private.GET_STALE_TRIAL_IDS: "look for lost trials",
}


def _ridden(method: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ride_out(lambda: method(self, *args, **kwargs), what=what)

    return call


def _set_trial_state_values(self: Any, trial_id: int, state: Any, values: Any = None) -> bool:
    """Tell, riding out an outage. A connection lost at the commit leaves it unknown whether the
    state landed: a retry that finds the trial finished in that very state has told it."""
    attempts = 0

    def attempt() -> bool:
        nonlocal attempts
        attempts += 1
        try:
            return optuna.storages.RDBStorage.set_trial_state_values(self, trial_id, state, values)
        except optuna.exceptions.UpdateFinishedTrialError:
            landed = attempts > 1 and state.is_finished()
            if landed and optuna.storages.RDBStorage.get_trial(self, trial_id).state == state:
                return True
            raise

    told = ride_out(attempt, what="tell a trial's result")
    if told and state == optuna.trial.TrialState.RUNNING:
        budget_section.claimed(self, trial_id)  # a waiting trial popped under the budget lock
    return told


def _get_trials(self: Any, study_id: int, states: Any, *args: Any, **kwargs: Any) -> Any:
    """Read trials, riding out an outage. Under the budget lock, before the claim, the one read
    is Optuna's look for a waiting trial (its cache asks for every unfinished trial, those that
    others run among them): only waiting ones are read there, and the rest are read after."""
    if states is None and budget_section.before_claim(self.engine):
        if budget_section.none_waiting(self.engine):
            return []  # the count under this lock found none: no read at all
        states = (optuna.trial.TrialState.WAITING,)
    return ride_out(
        lambda: private.rdb_get_trials(self, study_id, states, *args, **kwargs),
        what="read the trials",
    )


# A heartbeat on PostgreSQL is one statement, stamped with the server's clock as it runs and
# committed at once. Optuna's takes four round trips in one transaction and stamps it with the
# transaction's start: beside other work (a load of 70 on 2 cores) a trial process took 10-20 s
# to send them, and its heartbeat landed already that old, which the look for lost trials read
# as a silent process.
_HEARTBEAT_SQL = (
    "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (%(trial)s, now()) "
    "ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat"
)


def _record_heartbeat(self: Any, trial_id: int) -> None:
    base = optuna.storages.RDBStorage.record_heartbeat
    if self.engine.dialect.name != "postgresql" or budget_section.current(self.engine) is not None:
        # SQLite, or a section's one transaction (its lock held): Optuna's own.
        ride_out(lambda: base(self, trial_id), what="record a trial's heartbeat")
        return

    def beat() -> None:
        with self.engine.connect() as connection:
            # The driver's autocommit, as the claim's (budget/claim): one implicit transaction.
            driver = connection.connection.dbapi_connection
            assert driver is not None
            driver.autocommit = True
            try:
                connection.exec_driver_sql(_HEARTBEAT_SQL, {"trial": trial_id})
            finally:
                if not driver.closed:
                    driver.autocommit = False

    ride_out(beat, what="record a trial's heartbeat")


# Each new trial carries a mark of its own, written in the same transaction: a retry after a
# connection lost at the commit finds the trial its lost attempt made instead of making another
# (which would stay RUNNING for ever, holding a slot of the budget).
ASK_MARK = "orchestrator:ask"


# An ask under the budget lock is retried whole, by the lock's own ride_out (the section runs
# again under the lock taken anew), so the retry is a new call of `_create_new_trial`; and an
# outage after the insert (reading the trial back, the sampler) retries it too. The mark of a
# plain ask is kept in the outermost ride_out's memory, so the ask made again finds its trial
# (a section asks once: the budget lock's count-and-create, or an ask outside any section).
def _create_new_trial(self: Any, study_id: int, template_trial: Any = None) -> Any:
    # Only a plain ask looks for one made before; an enqueued or added trial has a mark of its own.
    memory = current().retry_memory()
    key = f"ask mark of study {study_id}"
    earlier = memory.get(key) if template_trial is None else None
    mark = str(earlier) if earlier is not None else uuid.uuid4().hex
    template = _new_trial_template() if template_trial is None else copy.deepcopy(template_trial)
    private.set_system_attrs(template, {**template.system_attrs, ASK_MARK: mark})
    attempts = 0

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts > 1 or earlier is not None:
            made = _marked_trial_id(self, study_id, mark)
            if made is not None:
                return optuna.storages.RDBStorage.get_trial(self, made)
        if template_trial is None:
            memory[key] = mark
        return _create_once(self, study_id, template, claim=template_trial is None)

    return ride_out(attempt, what="ask for a trial")


def _new_trial_template() -> Any:
    return optuna.trial.FrozenTrial(
        number=-1,
        state=optuna.trial.TrialState.RUNNING,
        value=None,
        values=None,
        datetime_start=dt.datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )


def _create_once(storage: Any, study_id: int, template: Any, *, claim: bool) -> Any:
    """One attempt of RDBStorage._create_new_trial. Optuna's own method retries a failed commit
    itself, blind to whether it landed, and would make a second trial with the same mark."""
    models = private.rdb_models()

    with private.scoped_session(storage) as session:
        # Optuna's lock on the study row: numbering a new trial is not atomic otherwise.
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        trial = private.prepared_new_trial(storage, study_id, template, session)
        frozen = copy.deepcopy(template)
        frozen.number = trial.number
        frozen.datetime_start = trial.datetime_start
        private.set_trial_id(frozen, trial.trial_id)
    if claim:  # a plain ask under the budget lock: the lock goes now (a re-queue keeps it)
        budget_section.claimed(storage, private.trial_id_of(frozen))
    return frozen


def _marked_trial_id(storage: Any, study_id: int, mark: str) -> int | None:
    models = private.rdb_models()

    attrs, trials = models.TrialSystemAttributeModel.__table__, models.TrialModel.__table__
    query = (
        sa.select(attrs.c.trial_id)
        .join(trials, trials.c.trial_id == attrs.c.trial_id)
        .where(
            trials.c.study_id == study_id,
            attrs.c.key == ASK_MARK,
            attrs.c.value_json == json.dumps(mark),
        )
    )
    with budget_section.connection_for(storage.engine) as conn:
        return conn.execute(query).scalar()


_RIDING_CLASS: type | None = None


def riding_storage_class() -> type[optuna.storages.RDBStorage]:
    """RDBStorage whose every database call rides out an outage (`orchestrator.record.outages.riding`).

    A subclass, not a wrapper, so that Optuna still puts its trial cache in front of it
    (`optuna.load_study` caches an RDBStorage, and only an RDBStorage)."""
    global _RIDING_CLASS
    if _RIDING_CLASS is None:
        body = {
            name: _ridden(getattr(optuna.storages.RDBStorage, name), what)
            for name, what in _RIDDEN.items()
        }
        body["set_trial_state_values"] = _set_trial_state_values
        body["record_heartbeat"] = _record_heartbeat
        body[private.CREATE_NEW_TRIAL] = _create_new_trial
        body[private.GET_TRIALS] = _get_trials
        body["__module__"] = __name__
        _RIDING_CLASS = type("RidingRDBStorage", (optuna.storages.RDBStorage,), body)
    return _RIDING_CLASS


def __getattr__(name: str) -> Any:
    # `RidingRDBStorage` is made on first use (Optuna is imported late); pickle finds it here.
    if name == "RidingRDBStorage":
        return riding_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
