"""The budget section on a trial process's one connection: lock, count and claim in one transaction.

A trial process holds one PostgreSQL connection (`storage.engine_kwargs(one_connection=True)`),
so the budget lock cannot live on a second one. The section instead runs as one transaction on
that connection:

    BEGIN; SELECT pg_advisory_xact_lock(key)   -- the lock, scoped to this transaction
    count the trials; find a waiting trial or insert a new one, with its heartbeat row
    COMMIT                                      -- the claim lands and the lock goes, together

A transaction-scoped lock is what PgBouncer's transaction pooling allows (a session lock would
stay on a server connection that the next client gets). Optuna's own calls inside the section
go through a Session joined to the transaction by savepoints, so an error Optuna catches (an
integrity error it ignores) rolls back its savepoint, never the lock. The lock goes at the claim,
not at the end of the section: the rest of Optuna's ask (reading the trial back, the sampler's
`before_trial`) runs after, outside it, so the lock is held only for counting and creating.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from optuna.storages import RDBStorage
    from sqlalchemy.engine import Connection, Engine

T = TypeVar("T")

_local = threading.local()


@dataclass
class Section:
    """The section this thread is in: its storage, its connection, and whether it has claimed."""

    storage: RDBStorage
    connection: Connection
    claimed: bool = False


def current(engine: Engine | None = None) -> Section | None:
    """This thread's section (on `engine`, when given), or None outside one."""
    section: Section | None = getattr(_local, "section", None)
    if section is None or (engine is not None and section.storage.engine is not engine):
        return None
    return section


def before_claim(engine: Engine) -> bool:
    """Whether this thread holds the budget lock on `engine` and has not claimed a trial yet."""
    section = current(engine)
    return section is not None and not section.claimed


@contextlib.contextmanager
def connection_for(engine: Engine) -> Iterator[Connection]:
    """The section's connection when this thread is in one on `engine`, else one from its pool.

    With a pool of one, asking the pool again inside the section would wait for ever on the
    connection the section holds."""
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
    from optuna.storages import RDBStorage as Plain

    section = current(storage.engine)
    if section is None or section.claimed:
        return
    Plain.record_heartbeat(storage, trial_id)
    section.connection.commit()
    section.claimed = True


def run_section(storage: RDBStorage, key: int, section: Callable[[], T]) -> T:
    """`section()` as one transaction under the transaction-scoped lock `key`, on a connection
    of `storage`'s pool that Optuna's calls in this thread share while it runs."""
    import sqlalchemy as sa
    from sqlalchemy import orm

    if current() is not None:
        raise RuntimeError("a budget section does not nest")
    registry = storage.scoped_session.registry
    earlier = registry() if registry.has() else None
    with storage.engine.connect() as connection:
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        session = orm.Session(bind=connection, join_transaction_mode="create_savepoint")
        registry.set(session)
        _local.section = Section(storage, connection)
        try:
            result = section()
            if connection.in_transaction():
                connection.commit()
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
