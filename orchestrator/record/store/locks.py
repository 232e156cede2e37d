"""Locks shared by every process and machine that uses one storage.

- The budget lock: counting a study's trials and asking for the next one happen under it, so the
  budget never overshoots.
- The schema lock: creating Optuna's tables and upgrading ours happen under it, so workers that
  start together on an empty database do not create the same tables twice.

On PostgreSQL each is a transaction-scoped advisory lock (`pg_advisory_xact_lock`) on a key
derived from its name: it goes with the transaction's end, so it works through PgBouncer's
transaction pooling, where a session lock would stay behind on a server connection that the
next client gets. A process that opened the storage to run a study (a trial process, a host's
pool) runs its section as one transaction on one connection, which the section's calls share
(`budget_section`); any other process holds the lock in a transaction of a connection of its
own, open while the section works through others. Beside an SQLite file the
lock is an exclusive file lock.

A lock lives as long as its transaction: when PostgreSQL restarts, the lock is gone with it, and
another process may take it. So a section is never resumed half-way after an outage: `locked`
runs the whole section again (take the lock on a new connection, count, ask) until it completes.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.outages.errors import is_outage
from orchestrator.record.outages.riding import ride_out, when_a_connection_is_free
from orchestrator.record.store.storage import engine_kwargs, section_storage

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection

    from orchestrator.record.store.location import StorageLocation
else:
    sa = LazyImport("sqlalchemy")

T = TypeVar("T")


def lock_key(name: str) -> int:
    # Advisory locks take a bigint; a 32-bit CRC under a fixed namespace avoids other users' keys.
    return (0x6F7263 << 32) | zlib.crc32(name.encode())


@contextlib.contextmanager
def storage_lock(location: StorageLocation, name: str) -> Iterator[None]:
    """Hold the lock called `name` on this storage, waiting for it as long as it takes."""
    path = location.sqlite_path
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{path}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if location.is_sqlite:
        yield  # in-memory SQLite: one process only
        return
    # A connection for the lock alone, closed with it: only the connection settings apply.
    connect_args = engine_kwargs(location)["connect_args"]
    engine = sa.create_engine(location.url, poolclass=sa.pool.NullPool, connect_args=connect_args)
    try:
        with when_a_connection_is_free(engine.connect) as conn:
            # The transaction this opens stays open while the section runs, and holds the lock.
            budget_section.take_lock(conn, lock_key(name))
            try:
                yield
            finally:
                _unlock(conn)
    finally:
        engine.dispose()


def _unlock(conn: Connection) -> None:
    try:
        conn.rollback()  # the transaction wrote nothing: ending it lets the lock go
    except sa.exc.SQLAlchemyError as error:
        if not is_outage(error):
            raise
        # The connection is gone, and the lock with its transaction: nothing is left to release.
        conn.invalidate()


def locked(
    location: StorageLocation, name: str, section: Callable[[], T], *, what: str, asks: bool = False
) -> T:
    """`section()` under the lock called `name`, riding out an outage: a section that a lost
    connection interrupted is run again whole, under the lock taken anew.

    In a process that opened this PostgreSQL storage to run a study (a trial process, a host's
    pool), the section is one transaction on one connection of that storage, which Optuna's
    calls inside it share (`budget_section`): holding the lock on one connection while waiting
    for another would stall everyone queued on the lock when the server has no slot free.
    `asks`: the section is an ask (count, then claim)."""
    shared = section_storage(location)
    held = (location.url, name)
    if held in _held_here():
        # This thread holds it already (a re-queue inside the look for lost trials, which holds
        # the budget lock): taking it again would wait on itself (a second flock of the file, a
        # second connection's advisory lock).
        return section()

    def attempt() -> T:
        _held_here().add(held)
        try:
            if shared is not None:
                return budget_section.run_section(shared, lock_key(name), section, asks=asks)
            with storage_lock(location, name):
                return section()
        finally:
            _held_here().discard(held)

    return ride_out(attempt, what=what)


_held = threading.local()


def _held_here() -> set[tuple[str, str]]:
    """The locks (storage URL, name) this thread holds through `locked`."""
    if not hasattr(_held, "locks"):
        _held.locks = set()
    return _held.locks


def under_budget_lock(
    location: StorageLocation, study_name: str, section: Callable[[], T], *, what: str
) -> T:
    """Count and ask under the study's budget lock, whole or not at all (see `locked`)."""
    return locked(location, f"budget:{study_name}", section, what=what, asks=True)


def schema_lock(location: StorageLocation) -> contextlib.AbstractContextManager[None]:
    return storage_lock(location, "schema")
