"""Riding out a database outage: a lost connection is retried for a while, a real error is not.

A PostgreSQL restart, a failover or a network blip takes the database away for seconds. Every
storage call of a long-running process goes through `ride_out`, which

- tells a connection-level failure (refused, reset, closed, admin shutdown, SQLite busy) from a
  real error (integrity, data, programming): only the first is retried;
- retries with capped exponential backoff for at most `--storage-retry-seconds` in all;
- logs one line when the database goes away and one when it is back, however many calls and
  threads of the process wait at once (the state is shared per process);
- after the bound, raises `StorageUnreachable`, whose one line says how long the database has
  been gone and the command that resumes.

A retry repeats the whole call. Calls nest: only the outermost `ride_out` retries, so a block
that must be redone whole (take the budget lock, count, ask) is wrapped once, outside.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_ENV = "ORCHESTRATOR_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 300.0
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 8.0
EXIT_STATUS = 75  # EX_TEMPFAIL: try again later (the study is intact)

CONNECTION = "connection"  # the server is gone, refused us, or dropped the connection
LOCKED = "locked"  # an SQLite file another process holds

# PostgreSQL's SQLSTATEs of a lost or refused connection: class 08 (connection exception),
# 57P01-57P03 (admin shutdown, crash shutdown, cannot connect now: the server is starting or
# stopping), 53300 (too many connections: every client reconnecting at once after a restart).
_CONNECTION_SQLSTATE_CLASSES = ("08",)
_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# What libpq says, with no SQLSTATE, when the connection itself cannot be made for a reason that
# waiting will not fix: these are set-up errors, reported at once.
_SETUP_FAILURES = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "invalid dsn",
    "invalid connection option",
    "sslmode",
    "certificate",
)
# sqlite3's primary result codes (an extended code keeps its primary one in the low byte).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_CANTOPEN = 5, 6, 8, 14


# --- which errors are outages ----------------------------------------------------------


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then what caused it: Optuna wraps SQLAlchemy's error, which wraps the driver's."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        if isinstance(orig, BaseException) and id(orig) not in seen:
            yield orig
            seen.add(id(orig))
        current = current.__cause__ or current.__context__


def outage_kind(error: BaseException) -> str | None:
    """CONNECTION or LOCKED when `error` means the database is away for now, else None.

    Decided by exception types and codes (SQLAlchemy's, psycopg2's SQLSTATE, sqlite3's result
    code); the text of a message is read only for what libpq reports without a code."""
    import sqlite3

    from sqlalchemy import exc as sa_exc

    for link in _chain(error):
        if isinstance(link, sa_exc.IntegrityError | sa_exc.DataError | sa_exc.ProgrammingError):
            return None  # a real error about the data or the statement: never retried
        if isinstance(link, sa_exc.DBAPIError) and link.connection_invalidated:
            return CONNECTION  # SQLAlchemy's dialect recognised a disconnect
        if isinstance(link, sqlite3.Error):
            code = getattr(link, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
                return LOCKED
            return None
        kind = _psycopg2_kind(link)
        if kind != "unknown":
            return kind
    return None


def _psycopg2_kind(error: BaseException) -> str | None:
    """CONNECTION, None (a real error), or "unknown" when `error` is not psycopg2's."""
    try:
        import psycopg2
    except ImportError:
        return "unknown"
    if not isinstance(error, psycopg2.Error):
        return "unknown"
    code = error.pgcode
    if code:
        if code.startswith(_CONNECTION_SQLSTATE_CLASSES) or code in _CONNECTION_SQLSTATES:
            return CONNECTION
        return None
    if isinstance(error, psycopg2.InterfaceError):
        return CONNECTION  # "connection already closed"
    if isinstance(error, psycopg2.OperationalError):
        # No SQLSTATE: libpq could not connect or lost the connection (refused, reset, "server
        # closed the connection unexpectedly", a name that did not resolve for now).
        text = str(error).lower()
        return None if any(words in text for words in _SETUP_FAILURES) else CONNECTION
    return None


def is_outage(error: BaseException) -> bool:
    return outage_kind(error) is not None


# --- the bound, and what a user reads ------------------------------------------------------


def set_retry_seconds(seconds: float) -> None:
    """The bound for this process and the trial processes it starts (they read the environment)."""
    os.environ[RETRY_ENV] = repr(float(seconds))


def retry_seconds(environ: Mapping[str, str] = os.environ) -> float:
    text = environ.get(RETRY_ENV)
    if not text:
        return DEFAULT_RETRY_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{RETRY_ENV}={text!r} must be a number of seconds, e.g. 300") from None
    if not (value >= 0 and value != float("inf")):
        raise UserError(f"{RETRY_ENV}={text!r} must be 0 or more seconds, e.g. 300")
    return value


class StorageUnreachable(UserError):
    """The database stayed away for longer than the bound: one line, and how to resume."""

    exit_status = EXIT_STATUS

    def __init__(
        self,
        seconds: float,
        *,
        where: str,
        what: str,
        detail: str,
        resume: str,
        kind: str = CONNECTION,
    ) -> None:
        self.seconds = seconds
        state = "locked by another process" if kind == LOCKED else "unreachable"
        back = "free" if kind == LOCKED else "back"
        super().__init__(
            f"the database ({where}) has been {state} for {seconds:.0f} s (last: {detail}, "
            f"while trying to {what}); the study is kept as it was: when the database is {back}, "
            f"resume with `{resume}`"
        )


# --- the shared state of one process -------------------------------------------------------


@dataclass
class Outages:
    """What this process knows of the database's outages; one per process (`OUTAGES`).

    Clock, sleep and jitter are injected so that tests run outages without waiting."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2)  # noqa: E731
    log: logging.Logger = logger
    where: str = "the study database"
    resume: str = "the same command again"
    began_at: float | None = None  # the first failed call of the outage in progress
    ended_at: float | None = None  # when the last outage ended
    outages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _depth: threading.local = field(default_factory=threading.local, repr=False)

    def went_away(self, kind: str, error: BaseException, bound: float) -> float:
        """Note a failed call; the first of an outage logs one line. Returns when it began."""
        with self._lock:
            if self.began_at is None:
                self.began_at = self.clock()
                self.outages += 1
                what = "is locked by another process" if kind == LOCKED else "went away"
                self.log.warning(
                    "the database (%s) %s: %s; retrying for up to %.0f s",
                    self.where,
                    what,
                    first_line(error),
                    bound,
                )
            return self.began_at

    def came_back(self) -> None:
        """A call worked: if an outage was on, it is over (one line)."""
        if self.began_at is None:
            return
        with self._lock:
            if self.began_at is None:
                return
            now = self.clock()
            self.log.warning(
                "the database (%s) is back after %.0f s", self.where, now - self.began_at
            )
            self.began_at, self.ended_at = None, now

    def quiet_for(self, seconds: float) -> bool:
        """No outage now and none ended in the last `seconds`: heartbeats are to be trusted."""
        if self.began_at is not None:
            return False
        return self.ended_at is None or self.clock() - self.ended_at >= seconds

    @contextlib.contextmanager
    def nested(self) -> Iterator[bool]:
        """True inside the outermost ride_out of this thread."""
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        try:
            yield depth == 0
        finally:
            self._depth.value = depth


OUTAGES = Outages()


def first_line(error: BaseException) -> str:
    """The most telling line of an error: the driver's own message, redacted."""
    from orchestrator.record.storage import redact

    for link in _chain(error):
        if link.__module__.split(".")[0] in ("psycopg2", "sqlite3") or isinstance(link, OSError):
            text = str(link).strip()
            if text:
                return redact(text.splitlines()[0])
    text = str(error).strip()
    return redact(text.splitlines()[0]) if text else type(error).__name__


def note_storage(url: str, outages: Outages | None = None) -> None:
    """Name the storage in the outage lines of this process."""
    from orchestrator.record.storage import describe_location

    with contextlib.suppress(UserError):
        (outages or OUTAGES).where = describe_location(url)


def note_command(argv: list[str], outages: Outages | None = None) -> None:
    """The command that resumes after an outage: this one again (it resumes), redacted."""
    from orchestrator.record.storage import redact

    (outages or OUTAGES).resume = redact(shlex.join(["python", "-m", "orchestrator", *argv]))


def storage_failure(error: BaseException, outages: Outages | None = None) -> UserError | None:
    """The one line for a database error that reached the command line, or None if it is not one.

    A locked or read-only SQLite file, a server that went away: what happened, where, what to do."""
    import sqlite3

    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import SQLAlchemyError

    chain = list(_chain(error))
    if not any(
        isinstance(e, SQLAlchemyError | sqlite3.Error | StorageInternalError) for e in chain
    ):
        return None
    where, detail = (outages or OUTAGES).where, first_line(error)
    kind = outage_kind(error)
    if kind == LOCKED:
        return UserError(
            f"the database ({where}) is locked by another process ({detail}): wait for it to "
            "finish or stop it, then run the command again"
        )
    if kind == CONNECTION:
        return UserError(
            f"cannot reach the storage ({where}): {detail}; check that the database is running "
            "and the URL in --storage or ORCHESTRATOR_STORAGE"
        )
    codes = {getattr(e, "sqlite_errorcode", 0) & 0xFF for e in chain}
    if _SQLITE_READONLY in codes:
        return UserError(
            f"the database ({where}) is read-only ({detail}): make the file and its folder "
            "writable by this user, or give another --storage"
        )
    if _SQLITE_CANTOPEN in codes:
        return UserError(
            f"cannot open the database ({where}): {detail}; check that its folder exists and "
            "this user may write there"
        )
    return UserError(f"the storage ({where}) refused the operation: {detail}")


# --- the retry ----------------------------------------------------------------------------


def ride_out(
    call: Callable[[], T],
    *,
    what: str,
    bound: float | None = None,
    outages: Outages | None = None,
) -> T:
    """`call()`, retried while the database is away, for at most `bound` seconds in all.

    `what` says in a few words what the call does ("tell trial 12"), for the final line."""
    state = outages or OUTAGES
    with state.nested() as outermost:
        if not outermost:
            return call()  # the outermost ride_out retries the whole block
        limit = retry_seconds() if bound is None else bound
        pause = FIRST_PAUSE_S
        waited_here = False
        while True:
            try:
                result = call()
            except Exception as error:
                kind = outage_kind(error)
                if kind is None:
                    raise
                waited_here = True
                began = state.went_away(kind, error, limit)
                waited = state.clock() - began
                if waited >= limit:
                    raise StorageUnreachable(
                        waited,
                        where=state.where,
                        what=what,
                        detail=first_line(error),
                        resume=state.resume,
                        kind=kind,
                    ) from None
                state.sleep(max(0.0, min(pause * state.jitter(), limit - waited)))
                pause = min(pause * 2, LONGEST_PAUSE_S)
                continue
            # Only a call that met the outage may end it: beside a locked SQLite file, reads
            # go on while every write waits.
            if waited_here:
                state.came_back()
            return result


def retried(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A decorator: every call of the function rides out an outage (see `ride_out`)."""
    import functools

    def decorate(function: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return ride_out(lambda: function(*args, **kwargs), what=what)

        return wrapper

    return decorate


# --- heartbeats and stale trials during and after an outage --------------------------------


class Heartbeat:
    """A trial's heartbeat that lives through an outage (Optuna's thread dies at the first error).

    While the database is away it keeps trying, quietly: the outage has its one line already.
    A real error ends it with one warning."""

    def __init__(
        self,
        storage: Any,
        trial_id: int,
        interval: float,
        *,
        outages: Outages | None = None,
    ) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._state = outages or OUTAGES
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        failed = False
        while not self._stop.is_set():
            try:
                with single_attempt(self._state):
                    self._storage.record_heartbeat(self._trial_id)
            except Exception as error:
                kind = outage_kind(error)
                if kind is None:
                    logger.warning("heartbeat of trial id %d stopped: %s", self._trial_id, error)
                    return
                failed = True
                self._state.went_away(kind, error, retry_seconds())
                self._stop.wait(min(self._interval, FIRST_PAUSE_S * 4))
                continue
            if failed:
                self._state.came_back()
                failed = False
            self._stop.wait(self._interval)


@contextlib.contextmanager
def single_attempt(outages: Outages | None = None) -> Iterator[None]:
    """Inside, storage calls are tried once: an outage raises at once instead of waiting.

    For what must not stop while the database is away, such as a trial's progress reports
    during training: the caller keeps them and delivers them later."""
    with (outages or OUTAGES).nested():
        yield


def fail_stale_trials(study: optuna.Study, grace_s: float, outages: Outages | None = None) -> bool:
    """Fail (and hand to the stale-trial callback) the trials whose process is gone:

    - Optuna's stale trials, whose heartbeat is older than the grace period;
    - orphans: RUNNING trials with no heartbeat at all, older than the grace period. A connection
      lost as `ask` committed leaves one behind (its process retried and got another trial), and
      Optuna never finds it stale, so it would hold a slot of the budget for ever.

    Not while the database is away, nor for `grace_s` after it is back: until then no trial
    could record its heartbeat, and live ones would be failed. True when it looked."""
    import optuna

    if not (outages or OUTAGES).quiet_for(grace_s):
        return False

    def look() -> None:
        optuna.storages.fail_stale_trials(study)
        _fail_orphans(study, grace_s)

    ride_out(look, what="look for lost trials", outages=outages)
    return True


def _fail_orphans(study: optuna.Study, grace_s: float) -> None:
    import copy
    import datetime as dt

    import sqlalchemy as sa
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # under Optuna's cache, the RDBStorage
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
            trials.c.study_id == study._study_id,
            trials.c.state == TrialState.RUNNING.name,
            beats.c.trial_id.is_(None),
            trials.c.datetime_start < cutoff,
        )
    )
    with engine.connect() as conn:
        orphans = [row[0] for row in conn.execute(query)]
    callback = backend.get_heartbeat_stale_trial_callback()
    for trial_id in orphans:
        try:
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue
        logger.info("trial id %d was asked for but never started: failed", trial_id)
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(trial_id)))
