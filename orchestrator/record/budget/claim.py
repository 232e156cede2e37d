"""A trial process's ask on PostgreSQL: lock, count and claim in one round trip.

The budget lock is what makes a study's budget exact, and every trial start of the study
queues on it, so the lock must be held for as short a time as the database allows. Here the
whole section is one SQL string, sent once and run by the server as one implicit transaction:

    take the transaction-scoped budget lock (waiting at most LOCK_WAIT_SLICE_MS)
    lock the study's row, as Optuna does before it numbers a trial
    count the budget; claim the first waiting trial, or insert a new one (number, RUNNING,
    datetime_start) with its ask mark and its heartbeat row
    commit, which lets the lock go

The lock is held only while the server runs those statements: no reply goes back to the client
and no Python runs between taking it and letting it go. The trial is then read back and handed
to the sampler (`optuna.Trial`) outside the lock, and entered in Optuna's trial cache as
Optuna's own create would enter it. Nothing Optuna needs is skipped: a claimed waiting trial
keeps its fixed parameters and attributes (Optuna's `Trial` reads them from the database), and
a new one carries what Optuna's create writes for a plain ask (its row, nothing else) plus our
ask mark.

Elsewhere (SQLite; a process that did not open its storage as a trial process does) the ask is the
budget section of `locks.under_budget_lock`: count, then Optuna's own ask, under the lock.

A sampler that would wait inside the ask for other trials to end (population-based training with
no free member says so through `can_start_now`) is asked first, under the lock on SQLite: the ask
lets the lock go and waits outside it. Waiting inside would hold the lock that the pool's look for
lost trials takes on SQLite, and a pool waiting on it admits no trial: not the one holding the
member the ask waits for.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.budget.counts import stored_count
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.outages.storage import ASK_MARK
from orchestrator.record.store.locks import lock_key, under_budget_lock
from orchestrator.record.store.optuna_private import (
    add_to_trial_cache,
    forget_cached_trials,
    rdb_storage_of,
    storage_of,
    study_id_of,
    trial_id_of,
)
from orchestrator.record.store.storage import one_connection_storage

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from optuna.storages import RDBStorage
    from sqlalchemy.engine import Connection

    from orchestrator.record.store.location import StorageLocation
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

# A claimed waiting trial gets this mark: an ask retried after its answer was lost finds it.
CLAIM_MARK = "orchestrator:claim"

# Each statement of a simple query sees what committed before it started: the count runs after
# the lock and the study's row lock are taken, so it sees every trial made before them.
# The claim's commit does not wait for its WAL to reach the disk (synchronous_commit off, for
# this transaction only): the lock is let go at the commit, and a flush (12 ms on a busy shared
# disk, 0.1-1 ms on a database server's SSD) would be most of the time it is held. The risk is
# PostgreSQL's documented one: a server crash in the next few hundred ms (before any later
# commit flushes the log) can lose the claim, never corrupt anything. A lost claim is a trial
# that does not exist: the budget does not count it, and its process's next write fails.
# READ COMMITTED whatever the server's default: each statement must see what committed before
# it began (the count, after the locks), not one snapshot taken before the lock was granted.
_CLAIM_SQL = f"""
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SET LOCAL synchronous_commit = off;
SET LOCAL lock_timeout = '{budget_section.LOCK_WAIT_SLICE_MS}ms';
SELECT pg_advisory_xact_lock(%(key)s);
SET LOCAL lock_timeout = DEFAULT;
SELECT set_config('orchestrator.locked_at', extract(epoch FROM clock_timestamp())::text, true);
SELECT 1 FROM studies WHERE study_id = %(study)s FOR UPDATE;
WITH earlier AS (
    SELECT t.trial_id, t.number FROM trial_system_attributes a
    JOIN trials t ON t.trial_id = a.trial_id
    WHERE %(retry)s AND t.study_id = %(study)s AND a.key IN ('{ASK_MARK}', '{CLAIM_MARK}')
      AND a.value_json = %(mark)s
), counts AS (
    SELECT
      (SELECT coalesce(max(number) + 1, 0) FROM trials WHERE study_id = %(study)s) AS total,
      (SELECT count(*) FROM trials WHERE study_id = %(study)s AND state = 'WAITING') AS waiting,
      (SELECT count(*) FROM trials WHERE study_id = %(study)s AND state = 'FAIL') AS failed,
      (SELECT count(DISTINCT a.value_json::jsonb ->> -1) FROM trial_system_attributes a
       JOIN trials t ON t.trial_id = a.trial_id
       WHERE a.key = 'retry_history' AND t.study_id = %(study)s) AS requeued
), decision AS (
    SELECT total, waiting, total - waiting - least(failed, requeued) AS used,
           NOT EXISTS (SELECT 1 FROM earlier) AS first_claim
    FROM counts
), queued AS (
    SELECT trial_id FROM trials
    WHERE study_id = %(study)s AND state = 'WAITING' AND (SELECT first_claim FROM decision)
    ORDER BY number LIMIT 1 FOR UPDATE SKIP LOCKED
), popped AS (
    UPDATE trials t SET state = 'RUNNING', datetime_start = %(start)s FROM queued q
    WHERE t.trial_id = q.trial_id AND t.state = 'WAITING'
    RETURNING t.trial_id, t.number, true AS was_waiting
), created AS (
    INSERT INTO trials (number, study_id, state, datetime_start)
    SELECT total, %(study)s, 'RUNNING', %(start)s FROM decision
    WHERE first_claim AND waiting = 0 AND used < %(budget)s
    RETURNING trial_id, number, false AS was_waiting
), claimed AS (
    SELECT * FROM popped UNION ALL SELECT * FROM created
), marked AS (
    INSERT INTO trial_system_attributes (trial_id, key, value_json)
    SELECT trial_id, CASE WHEN was_waiting THEN '{CLAIM_MARK}' ELSE '{ASK_MARK}' END, %(mark)s
    FROM claimed
    ON CONFLICT (trial_id, key) DO UPDATE SET value_json = excluded.value_json
), beat AS (
    INSERT INTO trial_heartbeats (trial_id, heartbeat) SELECT trial_id, now() FROM claimed
    ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat
)
SELECT c.trial_id, c.number, c.was_waiting, d.waiting,
       current_setting('orchestrator.locked_at')::float8,
       extract(epoch FROM clock_timestamp())::float8,
       extract(epoch FROM statement_timestamp())::float8
FROM decision d LEFT JOIN (
    SELECT trial_id, number, was_waiting FROM claimed
    UNION ALL SELECT trial_id, number, false FROM earlier
) c ON true
"""


@dataclass(frozen=True)
class Claim:
    """What one run of the claim found: the trial it claimed (None: none), and the lock's times."""

    trial_id: int | None
    number: int | None
    was_waiting: bool
    waiting: int  # waiting trials the count found
    locked_at: float  # server clock, epoch seconds: the lock granted
    done_at: float  # server clock: the claim's last statement done (its commit follows)
    sent_at: float  # server clock: the string arrived
    sent_from: float  # this process's perf_counter when it sent the string


_last = threading.local()


class AskStopped(Exception):
    """A sampler that waits inside an ask (population-based training, for a free member) found
    the ask told to stop (`ask_stopped`): the ask has no trial for its caller. Trial
    `trial_id` was made for it, is RUNNING and has no params: the caller ends it."""

    def __init__(self, trial_id: int) -> None:
        super().__init__(f"the ask for trial id {trial_id} was stopped")
        self.trial_id = trial_id


def ask_stopped() -> bool:
    """Whether the ask in progress in this thread was told to stop (its `stop()` says so): a
    sampler that waits inside it for something other processes do must stop waiting, or a
    process whose host is gone waits for ever (and on SQLite holds the budget lock)."""
    stop = getattr(_last, "stop", None)
    return bool(stop is not None and stop())


def last_claim() -> Claim | None:
    """This thread's last claim that found a trial, with the server's times (a benchmark's)."""
    return getattr(_last, "claim", None)


def ask_within_budget(
    study: optuna.Study,
    location: StorageLocation,
    budget: int,
    *,
    stop: Callable[[], bool] | None = None,
    wait: bool = True,
) -> optuna.Trial | None:
    """The next trial of `study` (a waiting one first), or None when its budget of `budget`
    trials is used up or `stop()` says so. `budget_section.last_times()` then has the lock's
    wait and held time. A sampler waiting inside the ask reads `stop()` too (`ask_stopped`).

    While the sampler says it cannot start a trial now (`can_start_now`), the ask waits outside
    the lock and looks again; with `wait=False` it answers None instead (a fused group that
    holds members takes no more rather than wait for one of its own)."""
    _last.stop = stop
    try:
        while (trial := _ask(study, location, budget, stop)) is _NOT_NOW:
            if not wait:
                return None
            # Look again outside the lock; take it again once a trial could start.
            while True:
                if stop is not None and stop():
                    return None
                time.sleep(NOT_NOW_POLL_S)
                if not _sampler_would_wait(study):
                    break
        return trial
    finally:
        _last.stop = None


NOT_NOW_POLL_S = 0.5  # how often an ask the sampler holds back looks again (PBT's own wait)
_NOT_NOW: Any = object()  # the sampler would wait inside the ask: nothing was claimed


def _sampler_would_wait(study: optuna.Study) -> bool:
    ready = getattr(study.sampler, "can_start_now", None)
    return ready is not None and not ready(study)


def _ask(
    study: optuna.Study, location: StorageLocation, budget: int, stop: Callable[[], bool] | None
) -> optuna.Trial | None:
    storage = one_connection_storage(location)
    if storage is None or storage.engine.dialect.name != "postgresql":
        return _ask_in_section(study, location, budget, stop)
    # The sampler runs after the lock went here (`_trial_of`): its own wait holds nothing.
    if _sampler_would_wait(study):
        return _NOT_NOW
    asked_at = time.perf_counter()
    claim = claim_trial(storage, study_id_of(study), study.study_name, budget, stop)
    if claim is None or claim.trial_id is None:
        return None
    _last.claim = claim
    budget_section.record_times(
        budget_section.LockTimes(
            # The earlier sends whose wait slice ran out, then the last one's wait on the server.
            wait_ms=(claim.sent_from - asked_at) * 1000 + (claim.locked_at - claim.sent_at) * 1000,
            held_ms=(claim.done_at - claim.locked_at) * 1000,
            held_cpu_ms=0.0,  # no Python runs under the lock
            granted_at=claim.locked_at,
        )
    )
    return _trial_of(study, claim)


def claim_trial(
    storage: RDBStorage,
    study_id: int,
    study_name: str,
    budget: int,
    stop: Callable[[], bool] | None = None,
) -> Claim | None:
    """Run the claim until it answers, riding out an outage (None: `stop()` said stop).

    A retry after a lost answer looks for the trial its earlier attempt may have claimed (the
    mark) before it claims another: a second claim would leave the first RUNNING for ever."""
    mark = json.dumps(uuid.uuid4().hex)
    attempts = 0

    def attempt() -> Claim | None:
        nonlocal attempts
        attempts += 1
        params = {
            "key": lock_key(f"budget:{study_name}"),
            "study": study_id,
            "budget": budget,
            "mark": mark,
            "retry": attempts > 1,
            "start": dt.datetime.now(),  # Optuna's datetime_start: the client's local time
        }
        while True:
            if stop is not None and stop():
                return None
            with storage.engine.connect() as connection:
                claim = _run_once(connection, params)
            if claim is None:
                continue  # the lock's wait slice ran out: ask again
            if claim.trial_id is None and claim.waiting > 0:
                continue  # every waiting trial was being claimed elsewhere: count again
            return claim

    return ride_out(attempt, what="ask for a trial")


def _run_once(connection: Connection, params: dict[str, Any]) -> Claim | None:
    """One send of the claim (None: the lock was not granted within its wait slice)."""
    # The driver's autocommit: the string is one implicit transaction that commits as the
    # server finishes it, with no BEGIN or COMMIT round trip of the driver's own around it.
    # (SQLAlchemy's AUTOCOMMIT option would send a session SET before and after, and a session
    # SET stays behind on PgBouncer's server connection.) The flag sends nothing itself.
    driver = connection.connection.dbapi_connection
    assert driver is not None
    driver.autocommit = True
    sent_from = time.perf_counter()
    try:
        row = connection.exec_driver_sql(_CLAIM_SQL, params).one()
    except sa.exc.OperationalError as error:
        if getattr(error.orig, "pgcode", None) == budget_section.LOCK_NOT_AVAILABLE:
            return None
        raise
    finally:
        if not driver.closed:
            driver.autocommit = False
    trial_id, number, was_waiting, waiting, locked_at, done_at, sent_at = row
    return Claim(
        trial_id, number, bool(was_waiting), int(waiting), locked_at, done_at, sent_at, sent_from
    )


def _trial_of(study: optuna.Study, claim: Claim) -> optuna.Trial:
    """The claimed trial as Optuna's ask returns it, read back outside the lock."""
    assert claim.trial_id is not None and claim.number is not None
    # What Optuna's create enters (its trial id and number); the next read of the study reads
    # the trial again, as it is unfinished.
    add_to_trial_cache(
        study,
        optuna.trial.FrozenTrial(
            number=claim.number,
            state=optuna.trial.TrialState.RUNNING,
            value=None,
            values=None,
            datetime_start=None,
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={},
            system_attrs={},
            intermediate_values={},
            trial_id=claim.trial_id,
        ),
    )
    forget_cached_trials(study)  # Optuna's ask syncs the study once a trial
    return optuna.Trial(study, claim.trial_id)  # reads the trial back; the sampler's before_trial


def _ask_in_section(
    study: optuna.Study, location: StorageLocation, budget: int, stop: Callable[[], bool] | None
) -> optuna.Trial | None:
    storage = storage_of(study)
    backend = rdb_storage_of(storage)
    marks: dict[str, float] = {}

    def count_and_create() -> optuna.Trial | None:
        marks["locked"] = time.perf_counter()  # a section redone after an outage: its last start
        if stop is not None and stop():
            return None
        if not stored_count(backend.engine, study_id_of(study)).may_ask(budget):
            return None
        if _sampler_would_wait(study):
            return _NOT_NOW
        trial = study.ask()
        # A RUNNING trial with no heartbeat row is never found stale: record one before the
        # lock goes, so that from here on a lost process always leaves a trial someone can fail.
        if backend.get_heartbeat_interval() is not None:
            backend.record_heartbeat(trial_id_of(trial))
        return trial

    budget_section.record_times(None)
    asked_at = time.perf_counter()
    trial = under_budget_lock(location, study.study_name, count_and_create, what="ask for a trial")
    if budget_section.last_times() is None:  # a lock of its own: held to the end of the ask
        done = time.perf_counter()
        locked = marks.get("locked", done)
        budget_section.record_times(
            budget_section.LockTimes((locked - asked_at) * 1000, (done - locked) * 1000, 0.0)
        )
    return trial
