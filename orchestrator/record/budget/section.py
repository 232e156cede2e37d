"""A section under a lock on a trial process's one connection, as one transaction; its times.

A trial process's own ask on PostgreSQL does not come here: it is one round trip
(`budget/claim`), and only records its times here (`record_times`, `last_times`). This is for
any other section a trial process runs under a lock (`locks.locked`), and for an ask written as
Optuna code (count, then `study.ask()`), which takes about a dozen round trips under the lock.

A trial process holds at most one PostgreSQL connection at a time
(`storage.engine_kwargs(one_connection=True)`), and no process may wait for a second
connection while it holds the lock on a first (at the server's connection limit, everyone
queued on the lock would wait with it). The section instead runs as one transaction on one
connection:

    BEGIN; SELECT pg_advisory_xact_lock(key)   -- the lock, scoped to this transaction
    count the trials; find a waiting trial or insert a new one, with its heartbeat row
    COMMIT                                      -- the claim lands and the lock goes, together

(`take_lock` waits for the lock in slices, so waiters do not hold PgBouncer's server
connections for ever.) A transaction-scoped lock is what PgBouncer's transaction pooling allows (a session lock would
stay on a server connection that the next client gets). Optuna's own calls inside the section
go through a Session joined to the transaction by savepoints, so an error Optuna catches (an
integrity error it ignores) rolls back its savepoint, never the lock. The lock goes at the claim,
not at the end of the section: the rest of Optuna's ask (reading the trial back, the sampler's
`before_trial`) runs after, outside it, so the lock is held only for counting and creating.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import sqlalchemy as sa
    from optuna.storages import RDBStorage
    from sqlalchemy import orm
    from sqlalchemy.engine import Connection, Engine
else:
    orm = LazyImport("sqlalchemy.orm")
    sa = LazyImport("sqlalchemy")

T = TypeVar("T")

_local = threading.local()


@dataclass
class Section:
    """The section this thread is in: its storage, its connection, and whether it has claimed."""

    storage: RDBStorage
    connection: Connection
    claimed: bool = False
    waiting: int | None = None  # waiting trials, as the section's count found them
    asks: bool = True  # an ask's section (count, then claim); else another one (the stale look)


def counted(engine: Engine, waiting: int) -> None:
    """The section's count found `waiting` waiting trials (none: the look for one is skipped)."""
    section = current(engine)
    if section is not None:
        section.waiting = waiting


def none_waiting(engine: Engine) -> bool:
    """Whether this thread is in a section on `engine` whose count found no waiting trial: the
    lock keeps any from being queued since, so there is nothing to look for."""
    section = current(engine)
    return section is not None and section.asks and not section.claimed and section.waiting == 0


@dataclass(frozen=True)
class LockTimes:
    """How long the last section of this thread waited for the lock, and held it, in ms."""

    wait_ms: float
    held_ms: float
    held_cpu_ms: float  # this thread's CPU time while it held the lock (the rest: waiting)
    granted_at: float | None = None  # the server's clock when it granted the lock (epoch s)


def last_times() -> LockTimes | None:
    """The lock times of this thread's last section (None before any): what the lock really
    cost, from taking it to the claim's commit, without the part of the ask that follows."""
    return getattr(_local, "last", None)


def record_times(times: LockTimes | None) -> None:
    """Set what `last_times` answers in this thread (a section run elsewhere: `budget/claim`)."""
    _local.last = times


def current(engine: Engine | None = None) -> Section | None:
    """This thread's section (on `engine`, when given), or None outside one."""
    section: Section | None = getattr(_local, "section", None)
    if section is None or (engine is not None and section.storage.engine is not engine):
        return None
    return section


def before_claim(engine: Engine) -> bool:
    """Whether this thread holds the budget lock on `engine` and has not claimed a trial yet."""
    section = current(engine)
    return section is not None and section.asks and not section.claimed


@contextlib.contextmanager
def connection_for(engine: Engine) -> Iterator[Connection]:
    """The section's connection when this thread is in one on `engine`, else one from its pool.

    With one connection at a time, asking the pool again inside the section would wait for ever
    on the connection the section holds."""
    section = current(engine)
    if section is not None:
        yield section.connection
        return
    with engine.connect() as connection:
        yield connection


def claimed(storage: RDBStorage, trial_id: int) -> None:
    """A trial was claimed in this thread's section: write its heartbeat row in the same
    transaction and commit, which lets the lock go. From here a lost process always leaves a
    RUNNING trial with a heartbeat, which the next worker finds stale."""
    section = current(storage.engine)
    if section is None or section.claimed or not section.asks:
        return
    # Optuna's record_heartbeat takes four round trips here (a savepoint, a read, the insert,
    # the release); the trial is new to running, so this is one.
    section.connection.execute(
        sa.text(
            "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (:trial, now()) "
            "ON CONFLICT (trial_id) DO UPDATE SET heartbeat = now()"
        ),
        {"trial": trial_id},
    )
    section.connection.commit()
    section.claimed = True
    _local.held_until = time.perf_counter(), time.thread_time()


# A waiter gives up its place this often and asks again (`take_lock`).
LOCK_WAIT_SLICE_MS = 50
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's code for "canceling statement due to lock timeout"


def take_lock(conn: Connection, key: int) -> None:
    """Take the transaction-scoped lock `key` in a new transaction of `conn`, however long it takes.

    Waiting blocks in slices of LOCK_WAIT_SLICE_MS: after each, the waiter ends its transaction
    and asks again. Behind PgBouncer a transaction holds one of the pool's few server
    connections: waiters that blocked without end could fill the pool while the holder of the
    lock waits for a connection of the pool to finish its section, and nobody would move."""
    # One round trip: the bounded wait, the lock, and the transaction's usual lock_timeout back.
    statement = sa.text(
        f"SET LOCAL lock_timeout = '{LOCK_WAIT_SLICE_MS}ms'; SELECT pg_advisory_xact_lock(:key); "
        "SET LOCAL lock_timeout = DEFAULT"
    )
    while True:
        try:
            conn.execute(statement, {"key": key})
            return
        except sa.exc.OperationalError as error:
            if getattr(error.orig, "pgcode", None) != LOCK_NOT_AVAILABLE:
                raise
            conn.rollback()


def run_section(storage: RDBStorage, key: int, section: Callable[[], T], *, asks: bool = True) -> T:
    """`section()` as one transaction under the transaction-scoped lock `key`, on a connection
    of `storage`'s pool that Optuna's calls in this thread share while it runs: the process
    never waits for a second connection while it holds the lock on this one. `asks`: the
    section counts and claims a trial, and the lock goes at the claim."""
    if current() is not None:
        raise RuntimeError("a budget section does not nest")
    registry = storage.scoped_session.registry
    earlier = registry() if registry.has() else None
    asked_at = time.perf_counter()
    with storage.engine.connect() as connection:
        take_lock(connection, key)
        locked_at, locked_cpu = time.perf_counter(), time.thread_time()
        session = orm.Session(bind=connection, join_transaction_mode="create_savepoint")
        registry.set(session)
        _local.section, _local.held_until = Section(storage, connection, asks=asks), None
        try:
            result = section()
            if connection.in_transaction():
                connection.commit()
            until, until_cpu = _local.held_until or (time.perf_counter(), time.thread_time())
            _local.last = LockTimes(
                (locked_at - asked_at) * 1000,
                (until - locked_at) * 1000,
                (until_cpu - locked_cpu) * 1000,
            )
            return result
        finally:
            _local.section = None
            session.close()
            _restore(registry, earlier)


def _restore(registry: Any, earlier: Any) -> None:
    if earlier is None:
        registry.clear()
    else:
        registry.set(earlier)
