"""Which errors are outages (a lost or refused connection, a busy SQLite file), and their telling line."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.store.passwords import redact

if TYPE_CHECKING:
    import psycopg2
    import sqlalchemy as sa
else:
    psycopg2 = LazyImport("psycopg2")
    sa = LazyImport("sqlalchemy")

CONNECTION = "connection"  # the server is gone, refused us, or dropped the connection
LOCKED = "locked"  # an SQLite file another process holds
FULL = "full"  # the server is up but has no connection slot free ("too many clients")

# PostgreSQL's SQLSTATEs of a lost or refused connection: class 08 (connection exception),
# 57P01-57P03 (admin shutdown, crash shutdown, cannot connect now: the server is starting or
# stopping).
_CONNECTION_SQLSTATE_CLASSES = ("08",)
_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# A server with every connection slot taken: 53300 (too_many_connections). libpq reports the
# refusal at connect time without a code, so its words are matched too; PgBouncer's own
# refusal when its client limit is reached reads "no more connections allowed".
_FULL_SQLSTATE = "53300"
_FULL_WORDS = (
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    "no more connections allowed",
)
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
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_CANTOPEN = 5, 6, 8, 14


def error_chain(error: BaseException) -> Iterator[BaseException]:
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
    if is_full(error):
        return FULL
    for link in error_chain(error):
        if isinstance(link, sa.exc.IntegrityError | sa.exc.DataError | sa.exc.ProgrammingError):
            return None  # a real error about the data or the statement: never retried
        if isinstance(link, sa.exc.DBAPIError) and link.connection_invalidated:
            return CONNECTION  # SQLAlchemy's dialect recognised a disconnect
        if isinstance(link, sqlite3.Error):
            code = getattr(link, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED):
                return LOCKED
            return None
        kind = _psycopg2_kind(link)
        if kind != "unknown":
            return kind
    return None


def _psycopg2_kind(error: BaseException) -> str | None:
    """CONNECTION, None (a real error), or "unknown" when `error` is not psycopg2's."""
    try:
        psycopg2_error = psycopg2.Error
    except ImportError:  # psycopg2 not installed: no error can be its
        return "unknown"
    if not isinstance(error, psycopg2_error):
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


def is_full(error: BaseException) -> bool:
    """Whether the server refused a connection because all its connection slots are taken: it is
    up, and a connection is free again as soon as another client lets one go."""
    for link in error_chain(error):
        if getattr(link, "pgcode", None) == _FULL_SQLSTATE:
            return True
        if type(link).__module__.split(".")[0] == "psycopg2":
            text = str(link).lower()
            if any(words in text for words in _FULL_WORDS):
                return True
    return False


def is_outage(error: BaseException) -> bool:
    return outage_kind(error) is not None


def first_line(error: BaseException) -> str:
    """The most telling line of an error: the driver's own message, redacted."""
    for link in error_chain(error):
        if link.__module__.split(".")[0] in ("psycopg2", "sqlite3") or isinstance(link, OSError):
            text = str(link).strip()
            if text:
                return redact(text.splitlines()[0])
    text = str(error).strip()
    return redact(text.splitlines()[0]) if text else type(error).__name__
