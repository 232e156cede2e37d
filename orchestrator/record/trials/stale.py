"""Failing the trials whose process is gone: stale heartbeats and orphans, never during an outage."""

from __future__ import annotations

import copy
import datetime as dt
import logging
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.budget.section import connection_for
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.outages.state import Outages, current
from orchestrator.record.store.optuna_private import (
    rdb_models,
    rdb_storage_of,
    storage_of,
    study_id_of,
)

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

# Every outage line comes from one logger, whichever module says it.
logger = logging.getLogger("orchestrator.record.outages.riding")


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
        optuna.storages.fail_stale_trials(study)
        _fail_orphans(study, grace_s)
        return True

    return ride_out(look, what="look for lost trials", outages=outages)


def _server_restarted_within(study: optuna.Study, grace_s: float, state: Outages) -> bool:
    """Whether the PostgreSQL server started less than `grace_s` ago (said once per restart).

    Behind PgBouncer a restart is no error to anyone: PgBouncer holds the calls until the
    server is back, and this process may never see an outage. But every heartbeat sent meanwhile
    waited too, and a trial that looks silent is healthy: its heartbeats get the grace period to
    resume from the server's start, as after an outage this process saw."""
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
    if earlier is not None and earlier != started:
        logger.warning(
            "the database server (%s) restarted %.0f s ago: no trial is failed as lost until "
            "its heartbeat had %.0f s to resume",
            state.where,
            age,
            grace_s,
        )
    return age < grace_s


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
