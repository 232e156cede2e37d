"""The one-line failures of a storage: unreachable, locked, read-only, refused; never a password."""

from __future__ import annotations

import errno
import sqlite3
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.outages.errors import (
    CONNECTION,
    FULL,
    LOCKED,
    SQLITE_CANTOPEN,
    SQLITE_READONLY,
    error_chain,
    first_line,
    outage_kind,
)
from orchestrator.record.outages.state import Outages, current
from orchestrator.record.store.location import StorageLocation, mask_password

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

EXIT_STATUS = 75  # EX_TEMPFAIL: try again later (the study is intact)
SQLITE_FULL = 13  # "database or disk is full": the disk, or a file at the size limit


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
            f"resume with {resume if resume.startswith('`') else f'`{resume}`'}"
        )


class StorageFull(StorageUnreachable):
    """The disk holding an SQLite study is full: one line naming it, whoever meets it first (a
    trial process says it to its host, which stops with it). Waiting would not help: exit 2."""

    exit_status = 2

    def __init__(self, where: str, detail: str) -> None:
        UserError.__init__(
            self,
            f"the disk holding the database ({where}) is full ({detail}): free some space "
            "there, then run the command again; what was stored is kept",
        )
        self.seconds = 0.0


def disk_full(error: BaseException) -> bool:
    """Whether SQLite said "database or disk is full" somewhere in the error's chain (Optuna
    wraps it as "invalid data in the commit, e.g. exceeding max length")."""
    return any(
        (getattr(link, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL
        or isinstance(link, OSError)
        and link.errno == errno.ENOSPC
        for link in error_chain(error)
    )


def storage_failure(error: BaseException, outages: Outages | None = None) -> UserError | None:
    """The one line for a database error that reached the command line, or None if it is not one.

    A locked or read-only SQLite file, a server that went away: what happened, where, what to do."""
    chain = list(error_chain(error))
    if not any(
        isinstance(
            e, sa.exc.SQLAlchemyError | sqlite3.Error | optuna.exceptions.StorageInternalError
        )
        for e in chain
    ):
        return None
    where, detail = current(outages).where, first_line(error)
    kind = outage_kind(error)
    if kind == LOCKED:
        return UserError(
            f"the database ({where}) is locked by another process ({detail}): wait for it to "
            "finish or stop it, then run the command again"
        )
    if kind == FULL:
        return UserError(
            f"the database server ({where}) has no connection free ({detail}): too many "
            "processes hold connections (its max_connections); try again when fewer run, put "
            "PgBouncer in front of the server, or raise max_connections"
        )
    if kind == CONNECTION:
        return UserError(
            f"cannot reach the storage ({where}): {detail}; check that the database is running "
            "and the URL in --storage or ORCHESTRATOR_STORAGE"
        )
    codes = {getattr(e, "sqlite_errorcode", 0) & 0xFF for e in chain}
    if SQLITE_FULL in codes:
        return UserError(
            f"the disk holding the database ({where}) is full ({detail}): free some space there, "
            "then run the command again; what was stored is kept"
        )
    if SQLITE_READONLY in codes:
        return UserError(
            f"the database ({where}) is read-only ({detail}): make the file and its folder "
            "writable by this user, or give another --storage"
        )
    if SQLITE_CANTOPEN in codes:
        return UserError(
            f"cannot open the database ({where}): {detail}; check that its folder exists and "
            "this user may write there"
        )
    return UserError(f"the storage ({where}) refused the operation: {detail}")


def unreachable(location: StorageLocation, error: BaseException) -> UserError:
    """A UserError for a storage that could not be opened or used: where it is, never the password."""
    reason = str(getattr(error, "orig", None) or error).strip().splitlines()
    detail = mask_password(reason[0]) if reason else type(error).__name__
    if outage_kind(error) == FULL:
        return UserError(
            f"the database server ({location.describe()}) has no connection free ({detail}): "
            "too many processes hold connections (its max_connections); try again when fewer "
            "run, put PgBouncer in front of the server, or raise max_connections"
        )
    if isinstance(error, sa.exc.OperationalError | sqlite3.OperationalError | OSError):
        return UserError(
            f"cannot reach the storage ({location.describe()}): {detail}; "
            "check that the database is running and the URL in --storage or ORCHESTRATOR_STORAGE"
        )
    return UserError(f"the storage ({location.describe()}) refused the operation: {detail}")


def missing_driver(location: StorageLocation, error: ImportError) -> UserError:
    return UserError(
        f"no database driver for {location.masked!r} ({error}): use postgresql:// "
        "(psycopg2, installed with this package) or sqlite:///FILE.db"
    )
