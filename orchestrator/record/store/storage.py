"""Opening a study's storage: the one place Optuna's RDBStorage is built, and its settings.

The storage is a `StorageLocation`, read and checked where the user gave it (`location`); its
password is hidden from every line of output (`passwords`), and every database call of the
storage rides out an outage (`outages/storage`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import ride_out, when_a_connection_is_free
from orchestrator.record.outages.state import note_connections, note_storage
from orchestrator.record.outages.storage import riding_storage_class
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.optuna_private import RDB_STORAGE_LOGGER, use_engine
from orchestrator.record.store.passwords import protect_output, remember_secret
from orchestrator.record.store.storage_failures import missing_driver, unreachable

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial
    from sqlalchemy import orm

else:
    optuna = LazyImport("optuna")
    orm = LazyImport("sqlalchemy.orm")
    sa = LazyImport("sqlalchemy")


# A trial process records a heartbeat this often; a trial silent for the grace period is stale
# (failed and re-queued by the next worker that looks). Both can be set in the environment.
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 40
HEARTBEAT_ENV = "ORCHESTRATOR_HEARTBEAT_INTERVAL"
GRACE_ENV = "ORCHESTRATOR_GRACE_PERIOD"
SQLITE_BUSY_TIMEOUT_S = 60
SQLITE_BUSY_ENV = "ORCHESTRATOR_SQLITE_BUSY_TIMEOUT"
# PostgreSQL connections: give up connecting after this long (a server that is down answers at
# once; one behind a dead network would hang for minutes), and let TCP keepalives find a
# connection whose server vanished without a word (a failover, a cut cable) in about a minute.
CONNECT_TIMEOUT_S = 10
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def sqlite_busy_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """How long SQLite waits for another process's lock before it says "database is locked"."""
    text = environ.get(SQLITE_BUSY_ENV)
    try:
        value = float(text) if text else SQLITE_BUSY_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UserError(f"{SQLITE_BUSY_ENV}={text!r} must be a number of seconds, e.g. 60")
    return value


# A thread of a one-connection process waits this long for the connection another thread uses
# (a heartbeat behind a tell): calls are short, so a longer wait means something hangs.
ONE_CONNECTION_WAIT_S = 120
# Any other process on PostgreSQL keeps at most one idle connection (a host's pool loop is one
# thread); a few more may be open for a moment when its threads call at once.
IDLE_CONNECTIONS = 1
BURST_CONNECTIONS = 4


def engine_kwargs(location: StorageLocation, *, one_connection: bool = False) -> dict[str, Any]:
    """Engine settings that ride out outages and share a server's few connections.

    Every pooled engine checks a connection before using it (`pool_pre_ping`: after a
    PostgreSQL restart the pool holds dead connections, and SQLAlchemy replaces them instead of
    failing the call; Optuna's RDBStorage then just works on its next session). PostgreSQL
    connections time out and keep alive; SQLite waits for a busy file.

    With `one_connection` (a trial process), a PostgreSQL engine opens a connection for each
    use and closes it after, one at a time: the threads of the process take turns
    (`OneAtATimePool`). A trial process then holds no connection while it trains or waits for
    its next trial, so a cluster's hundreds of trial processes need only as many server
    connections as are in use at one moment, and a process never waits for a connection while
    it holds one. Any other PostgreSQL engine keeps at most IDLE_CONNECTIONS idle."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if location.is_sqlite:
        kwargs["connect_args"] = {"timeout": sqlite_busy_timeout()}
        return kwargs
    kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVES}
    if one_connection:
        # A fresh connection needs no ping: the pool never hands out an old one.
        kwargs.update(poolclass=one_at_a_time_pool_class(), pool_pre_ping=False)
    else:
        kwargs.update(pool_size=IDLE_CONNECTIONS, max_overflow=BURST_CONNECTIONS)
    return kwargs


_POOL_CLASS: type | None = None


def one_at_a_time_pool_class() -> type:
    """SQLAlchemy's NullPool (a connection per use, closed after) that lets one thread of the
    process hold a connection at a time; the others wait their turn, at most
    ONE_CONNECTION_WAIT_S. Made on first use: SQLAlchemy is imported late."""
    global _POOL_CLASS
    if _POOL_CLASS is None:

        class OneAtATimePool(sa.pool.NullPool):
            def __init__(self, *args: Any, turn: Any = None, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._turn = turn or threading.BoundedSemaphore(1)

            def _do_get(self) -> Any:
                if not self._turn.acquire(timeout=ONE_CONNECTION_WAIT_S):
                    raise sa.exc.TimeoutError(
                        f"another thread of this process held its one database connection "
                        f"for {ONE_CONNECTION_WAIT_S} s"
                    )
                try:
                    return super()._do_get()
                except BaseException:
                    self._turn.release()
                    raise

            def _do_return_conn(self, record: Any) -> None:
                try:
                    super()._do_return_conn(record)
                finally:
                    self._turn.release()

            def checkedout(self) -> int:
                """Connections open now: 0 or 1 (QueuePool's name for it)."""
                if self._turn.acquire(blocking=False):
                    self._turn.release()
                    return 0
                return 1

            def recreate(self) -> Any:
                # Every use closes its connection: nothing is pooled to recreate, and the
                # turn stays the one the process's threads share.
                return self

        _POOL_CLASS = OneAtATimePool
    return _POOL_CLASS


# The storage each URL was opened with in this process, when it holds one connection: the
# budget section runs on that connection (`budget_section`), not on a second one.
_ONE_CONNECTION: dict[str, RDBStorage] = {}
# The PostgreSQL storage each URL was opened with to run a study (heartbeats on): a section
# under a lock runs on one connection of it (`locks.locked`).
_RUNNING: dict[str, RDBStorage] = {}


def one_connection_storage(location: StorageLocation) -> RDBStorage | None:
    """The one-connection PostgreSQL storage this process opened at `location`, if any."""
    return _ONE_CONNECTION.get(location.url)


def section_storage(location: StorageLocation) -> RDBStorage | None:
    """The PostgreSQL storage this process opened at `location` to run a study, if any."""
    return _RUNNING.get(location.url)


def location_of(storage: RDBStorage) -> StorageLocation:
    """Where a storage is: as `create_storage` set it, or read from a plain RDBStorage's URL."""
    location = getattr(storage, "location", None)
    return location if location is not None else StorageLocation.parse(str(storage.url))


def _enable_sqlite_wal(location: StorageLocation) -> None:
    # WAL lets readers and one writer work at once; the mode is stored in the file, so once is enough.
    path = location.sqlite_path
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=sqlite_busy_timeout())
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


def quiet_optuna_warnings() -> None:
    """Heartbeats with ask/tell are what we mean to use: Optuna's experimental-feature warnings
    and its "heartbeat is supposed to be used with Study.optimize" note would only be noise."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    _quiet_optuna_fallback()


class _LostConnectionFallback:
    """Drops Optuna's "Caught an error from sqlalchemy ... Falling back" warning when the error
    is a lost connection: the fallback fails as well, and the outage says so in one line."""

    LOST = (
        "server closed the connection",
        "connection refused",
        "terminating connection",
        "could not connect",
        "connection already closed",
        "the database system is",
        "database is locked",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Caught an error from sqlalchemy"):
            return True
        return not any(words in message for words in self.LOST)


def _quiet_optuna_fallback() -> None:
    logger = logging.getLogger(RDB_STORAGE_LOGGER)
    if not any(isinstance(f, _LostConnectionFallback) for f in logger.filters):
        logger.addFilter(_LostConnectionFallback())


def heartbeat_settings(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(interval, grace period) in seconds; a bad value in the environment is a UserError."""
    values = []
    for name, default in ((HEARTBEAT_ENV, HEARTBEAT_INTERVAL_S), (GRACE_ENV, GRACE_PERIOD_S)):
        text = environ.get(name)
        try:
            value = int(text) if text else default
        except ValueError:
            raise UserError(f"{name}={text!r} must be a whole number of seconds") from None
        if value < 1:
            raise UserError(f"{name}={text!r} must be at least 1 second")
        values.append(value)
    interval, grace = values
    return interval, max(grace, interval + 1)


def _hold_one_connection(storage: RDBStorage, location: StorageLocation) -> None:
    """Swap the storage's engine for one that keeps a single connection. Not from the start:
    Optuna's first opening of a new database nests a session inside a connection it holds."""
    opened_with = storage.engine
    kwargs = engine_kwargs(location, one_connection=True)
    storage.engine = sa.create_engine(location.url, **kwargs)
    storage.scoped_session = orm.scoped_session(orm.sessionmaker(bind=storage.engine))
    use_engine(storage)
    opened_with.dispose()
    _ONE_CONNECTION[location.url] = storage


def _note_max_connections(storage: RDBStorage) -> None:
    """The server's connection limit, for the line a host says if the server runs out (then it
    could not be asked)."""
    try:
        with storage.engine.connect() as connection:
            value = connection.exec_driver_sql("SHOW max_connections").scalar()
        note_connections(max_connections=int(value))
    except (sa.exc.SQLAlchemyError, TypeError, ValueError):
        pass  # the line then names the setting without its value


def create_storage(
    location: StorageLocation,
    *,
    heartbeat: bool = False,
    heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    wait: bool = False,
    one_connection: bool | None = None,
) -> RDBStorage:
    """Open Optuna's RDBStorage at `location`, creating Optuna's schema when it is missing.

    With `heartbeat`, trials record heartbeats and a silent one is failed (and handed to the
    callback) by `optuna.storages.fail_stale_trials`. Opening fails at once when the database
    cannot be reached (a wrong URL says so in a second), unless `wait`: then it rides out an
    outage as every later call does (see RidingRDBStorage). A process that a running study
    starts (a trial process) waits; a command the user just typed does not.

    A trial process also holds at most one connection (`one_connection`, by default `wait`):
    its heartbeat and its main thread share it, and its budget section runs on it.
    """
    remember_secret(location.text)
    protect_output()
    note_storage(location)  # outage lines name the storage
    quiet_optuna_warnings()
    interval, grace = heartbeat_settings() if heartbeat else (None, None)
    single = (wait if one_connection is None else one_connection) and not location.is_sqlite

    def open_it() -> RDBStorage:
        _enable_sqlite_wal(location)
        storage = riding_storage_class()(
            location.url,
            engine_kwargs=engine_kwargs(location),
            # Optuna's check of the schema's version reads it on a second connection while its
            # session holds a first: at a server with no slot free, trial processes that each
            # held one and waited for another would wait for ever. The host that started the
            # process opened the storage with the check (`migrate.open_storage`) just before.
            skip_compatibility_check=single,
            heartbeat_interval=interval,
            grace_period=grace,
            heartbeat_stale_trial_callback=heartbeat_stale_trial_callback,
        )
        storage.location = location  # what the storage's own failures and locks name
        if single:
            _hold_one_connection(storage, location)
        elif heartbeat and not location.is_sqlite:
            _note_max_connections(storage)
        if heartbeat and not location.is_sqlite:
            _RUNNING[location.url] = storage
        return storage

    try:
        if wait:
            return ride_out(open_it, what="open the storage")
        return when_a_connection_is_free(open_it)  # a full server is not a wrong URL
    except (sa.exc.SQLAlchemyError, sqlite3.Error, OSError) as error:
        raise unreachable(location, error) from None
    except ImportError as error:
        raise missing_driver(location, error) from None
