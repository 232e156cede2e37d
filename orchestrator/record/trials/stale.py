"""Failing the trials whose process is gone: stale heartbeats and orphans, never during an outage.

A trial is failed as lost only if it is lost at the moment it is failed. The pool's look
(`look_for_lost_trials`) reads first, without any lock, whether a trial looks lost; only then does
it take the budget lock, and there, on PostgreSQL, one UPDATE fails exactly the trials whose
heartbeat is still older than the grace period as it runs (`_LOST`): a heartbeat that landed
between the look and the lock keeps its trial. Beside other work (a load of 70 on 2 cores) a
host's look took seconds from its read to its write, and failed live trials whose heartbeat had
come in meanwhile; and each host held the budget lock through its look every 5 s, so that every
trial start waited behind it.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import time
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.budget.section import connection_for
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.outages.state import Outages, current
from orchestrator.record.store.locks import locked
from orchestrator.record.store.optuna_private import (
    rdb_models,
    rdb_storage_of,
    storage_of,
    study_id_of,
)

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from sqlalchemy.engine import Engine

    from orchestrator.record.store.location import StorageLocation
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

# Every outage line comes from one logger, whichever module says it.
logger = logging.getLogger("orchestrator.record.outages.riding")
_PROCESS_STARTED = time.monotonic()  # its first import: never before the process started


# The trials of a study that are lost as this statement runs: RUNNING, and either a heartbeat
# older than the grace period (the server's clock: heartbeats are stamped with it) or, for an
# orphan, no heartbeat at all and a start older than it (the asking client's clock, as Optuna
# stamps datetime_start). LOCALTIMESTAMP is the transaction's start: under the lock, a heartbeat
# that lands while the section runs is newer than it.
_LOST = """
t.study_id = %(study)s AND t.state = 'RUNNING' AND (
  EXISTS (SELECT 1 FROM trial_heartbeats h WHERE h.trial_id = t.trial_id
          AND h.heartbeat < LOCALTIMESTAMP - make_interval(secs => %(grace)s))
  OR (NOT EXISTS (SELECT 1 FROM trial_heartbeats h WHERE h.trial_id = t.trial_id)
      AND t.datetime_start < %(cutoff)s))
"""
_ANY_LOST_SQL = f"SELECT EXISTS (SELECT 1 FROM trials t WHERE {_LOST})"
_FAIL_LOST_SQL = f"""
UPDATE trials t SET state = 'FAIL', datetime_complete = %(now)s WHERE {_LOST}
RETURNING t.trial_id, NOT EXISTS (SELECT 1 FROM trial_heartbeats h WHERE h.trial_id = t.trial_id)
"""


def look_for_lost_trials(
    location: StorageLocation, study: optuna.Study, grace_s: float, outages: Outages | None = None
) -> bool:
    """The pool's look for lost trials: on PostgreSQL a read without any lock first, and the
    budget lock (`fail_stale_trials` under it) only when a trial looks lost. True when it
    looked."""
    if not current(outages).quiet_for(grace_s):
        return False

    def look() -> bool | None:
        if _server_restarted_within(study, grace_s, current(outages)):
            return None
        engine = _postgres_engine(study)
        return engine is None or _any_lost(engine, study_id_of(study), grace_s)

    seen = ride_out(look, what="look for lost trials", outages=outages)
    if seen is None:
        return False
    if seen:
        locked(
            location,
            f"budget:{study.study_name}",
            lambda: fail_stale_trials(study, grace_s, outages),
            what="look for lost trials",
        )
    return True


def fail_stale_trials(study: optuna.Study, grace_s: float, outages: Outages | None = None) -> bool:
    """Fail (and hand to the stale-trial callback) the trials whose process is gone:

    - Optuna's stale trials, whose heartbeat is older than the grace period;
    - orphans: RUNNING trials with no heartbeat at all, older than the grace period. A connection
      lost as `ask` committed leaves one behind (its process retried and got another trial), and
      Optuna never finds it stale, so it would hold a slot of the budget for ever.

    Not while the database is away, nor for `grace_s` after it is back: until then no trial
    could record its heartbeat, and live ones would be failed; nor for `grace_s` after the
    PostgreSQL server (re)started. True when it looked."""
    if not current(outages).quiet_for(grace_s):
        return False

    def look() -> bool:
        if _server_restarted_within(study, grace_s, current(outages)):
            return False
        if _postgres_engine(study) is not None:
            _fail_lost(study, grace_s)
        else:
            optuna.storages.fail_stale_trials(study)
            _fail_orphans(study, grace_s)
        return True

    return ride_out(look, what="look for lost trials", outages=outages)


def _postgres_engine(study: optuna.Study) -> Engine | None:
    """The study's engine on PostgreSQL with heartbeats on (None: elsewhere, Optuna's look)."""
    backend = rdb_storage_of(storage_of(study))
    engine = getattr(backend, "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        return None
    return engine if backend.get_heartbeat_interval() is not None else None


def _lost_params(study_id: int, grace_s: float) -> dict[str, object]:
    now = dt.datetime.now()
    return {
        "study": study_id,
        "grace": float(grace_s),
        "cutoff": now - dt.timedelta(seconds=grace_s),
        "now": now,
    }


def _any_lost(engine: Engine, study_id: int, grace_s: float) -> bool:
    with connection_for(engine) as conn:
        return bool(conn.exec_driver_sql(_ANY_LOST_SQL, _lost_params(study_id, grace_s)).scalar())


def _fail_lost(study: optuna.Study, grace_s: float) -> None:
    """Fail the trials lost as the UPDATE runs, and hand each to the stale-trial callback (a
    re-run queued in the same transaction, under the budget lock). Each trial is failed once:
    the UPDATE moves it from RUNNING, and only the trials it moved come back."""
    storage = storage_of(study)
    backend = rdb_storage_of(storage)
    engine = backend.engine
    params = _lost_params(study_id_of(study), grace_s)
    with connection_for(engine) as conn:
        failed = [(int(i), bool(o)) for i, o in conn.exec_driver_sql(_FAIL_LOST_SQL, params)]
        if budget_section.current(engine) is None:
            conn.commit()  # outside a section (a test): the failures land now
    callback = backend.get_heartbeat_stale_trial_callback()
    for trial_id, orphan in failed:
        if orphan:
            logger.info("trial id %d was asked for but never started: failed", trial_id)
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(trial_id)))


def _server_restarted_within(study: optuna.Study, grace_s: float, state: Outages) -> bool:
    """Whether the PostgreSQL server started, or this process first saw it restarted, less than
    `grace_s` ago (said once per restart).

    Behind PgBouncer a restart is no error to anyone: PgBouncer holds the calls until the
    server is back, and this process may never see an outage. But every heartbeat sent meanwhile
    waited too, and a trial that looks silent is healthy: its heartbeats get the grace period to
    resume, as after an outage this process saw. Counted from the later of the server's start and
    this look: PgBouncer tries a server it could not reach again only every 15 s
    (`server_login_retry`), so calls held there may reach the server long after it started,
    this look's among them."""
    storage = storage_of(study)
    engine = getattr(rdb_storage_of(storage), "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        return False
    # The same look counts the server's connections: its trial processes meet a full server
    # without a word (they are quiet), so the host says it when it sees the server at its limit.
    query = sa.text(
        "SELECT pg_postmaster_start_time()::text, "
        "extract(epoch FROM now() - pg_postmaster_start_time())::float8, "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), "
        "current_setting('max_connections')::int, "
        "current_setting('superuser_reserved_connections')::int"
    )
    with connection_for(engine) as conn:  # under the budget lock: the section's connection
        started, age, in_use, limit, reserved = conn.execute(query).one()
    if in_use >= limit - reserved:
        state.server_at_limit(in_use, limit)
    earlier, state.server_started = state.server_started, started
    restarted = earlier is not None and earlier != started
    # A restart seen, or this host's first look at a server that started after it did.
    if restarted or (earlier is None and age < time.monotonic() - _PROCESS_STARTED):
        state.restart_seen_at = state.clock()
    if restarted and not _said_as_an_outage(state, age):
        logger.warning(
            "the database server (%s) restarted %.0f s ago: no trial is failed as lost until "
            "its heartbeat had %.0f s to resume",
            state.where,
            age,
            grace_s,
        )
    seen = state.restart_seen_at
    return age < grace_s or (seen is not None and state.clock() - seen < grace_s)


def _said_as_an_outage(state: Outages, age: float) -> bool:
    """Whether this process already said this restart: an outage of its own ("went away", "is
    back") that ended after the server started, `age` seconds ago (a second's slack for the
    two clocks)."""
    back = state.said_back_at
    return back is not None and state.clock() - back <= age + 1.0


def _fail_orphans(study: optuna.Study, grace_s: float) -> None:
    models = rdb_models()
    storage = storage_of(study)
    backend = rdb_storage_of(storage)  # under Optuna's cache, the RDBStorage
    engine = getattr(backend, "engine", None)
    if engine is None or backend.get_heartbeat_interval() is None:
        return
    trials, beats = models.TrialModel.__table__, models.TrialHeartbeatModel.__table__
    # Optuna stamps datetime_start with the local clock of the process that asked.
    cutoff = dt.datetime.now() - dt.timedelta(seconds=grace_s)
    query = (
        sa.select(trials.c.trial_id)
        .select_from(trials.outerjoin(beats, beats.c.trial_id == trials.c.trial_id))
        .where(
            trials.c.study_id == study_id_of(study),
            trials.c.state == optuna.trial.TrialState.RUNNING.name,
            beats.c.trial_id.is_(None),
            trials.c.datetime_start < cutoff,
        )
    )
    with connection_for(engine) as conn:  # under the budget lock: the section's connection
        orphans = [row[0] for row in conn.execute(query)]
    callback = backend.get_heartbeat_stale_trial_callback()
    for trial_id in orphans:
        try:
            if not storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        logger.info("trial id %d was asked for but never started: failed", trial_id)
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(trial_id)))
