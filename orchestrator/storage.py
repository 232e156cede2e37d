"""Where a study lives: storage URL resolution, masking, and the one place RDBStorage is built."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial
    from sqlalchemy.engine import URL

DEFAULT_STORAGE = "sqlite:///orchestrator.db"
STORAGE_ENV = "ORCHESTRATOR_STORAGE"

# A trial process records a heartbeat this often; a trial silent for the grace period is stale
# (failed and re-queued by the next worker that looks). Both can be set in the environment.
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 40
HEARTBEAT_ENV = "ORCHESTRATOR_HEARTBEAT_INTERVAL"
GRACE_ENV = "ORCHESTRATOR_GRACE_PERIOD"
SQLITE_BUSY_TIMEOUT_S = 60


def resolve_storage_url(cli_value: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """`--storage` wins, then ORCHESTRATOR_STORAGE, then an SQLite file in the current directory."""
    for value in (cli_value, environ.get(STORAGE_ENV)):
        if value:
            return value
    return DEFAULT_STORAGE


def parse_url(url: str) -> URL:
    """Parse and check a storage URL; a bad one is a UserError that says what a good one looks like."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(
            f"the storage URL {mask_password(url)!r} is malformed: use sqlite:///FILE.db or "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise UserError(
            f"the storage URL {mask_password(url)!r} names {backend!r}: "
            "use sqlite:///FILE.db or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        )
    return parsed


def normalize_url(url: str) -> str:
    """A plain postgresql:// URL uses psycopg2, the driver we install (SQLAlchemy 2.1 would pick psycopg 3)."""
    parsed = parse_url(url)
    if parsed.drivername == "postgresql":
        return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    return url


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, safe to print or log."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if "@" in (parsed.host or ""):  # part of the password went into the host: hide both
            return parsed.set(host="***").render_as_string(hide_password=True)
        return parsed.render_as_string(hide_password=True)
    except Exception:
        # Not parseable: hide anything between '://user:' and '@' by hand.
        scheme, sep, rest = url.partition("://")
        if not sep or "@" not in rest:
            return url
        credentials, _, host = rest.rpartition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in credentials else url


def describe_location(url: str) -> str:
    """Where a storage is, in words a user can check: the file, or host and port."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite file {parsed.database or ':memory:'}"
    if "@" in (parsed.host or ""):
        # An '@' in the password ends it early: what looks like the host holds the rest of it.
        return "PostgreSQL at an unreadable host (write an '@' in the password as %40)"
    return f"PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}"


def is_sqlite(url: str) -> bool:
    return parse_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL, or None for memory and other backends."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def engine_kwargs(url: str) -> dict[str, Any]:
    """Engine settings: connection liveness checks everywhere, a busy timeout for SQLite."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    return kwargs


def _enable_sqlite_wal(url: str) -> None:
    # WAL lets readers and one writer work at once; the mode is stored in the file, so once is enough.
    path = sqlite_path(url)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


def unreachable(url: str, error: BaseException) -> UserError:
    """A UserError for a storage that could not be opened or used: where it is, never the password."""
    from sqlalchemy.exc import OperationalError

    reason = str(getattr(error, "orig", None) or error).strip().splitlines()
    detail = mask_password(reason[0]) if reason else type(error).__name__
    if isinstance(error, OperationalError | sqlite3.OperationalError | OSError):
        return UserError(
            f"cannot reach the storage ({describe_location(url)}): {detail}; "
            "check that the database is running and the URL in --storage or ORCHESTRATOR_STORAGE"
        )
    return UserError(f"the storage ({describe_location(url)}) refused the operation: {detail}")


def missing_driver(url: str, error: ImportError) -> UserError:
    return UserError(
        f"no database driver for {mask_password(url)!r} ({error}): use postgresql:// "
        "(psycopg2, installed with this package) or sqlite:///FILE.db"
    )


def quiet_optuna_warnings() -> None:
    """Heartbeats with ask/tell are what we mean to use: Optuna's experimental-feature warnings
    and its "heartbeat is supposed to be used with Study.optimize" note would only be noise."""
    import warnings

    from optuna.exceptions import ExperimentalWarning

    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


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


def create_storage(
    url: str,
    *,
    heartbeat: bool = False,
    heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> RDBStorage:
    """Open Optuna's RDBStorage on URL, creating Optuna's schema when it is missing.

    With `heartbeat`, trials record heartbeats and a silent one is failed (and handed to the
    callback) by `optuna.storages.fail_stale_trials`.
    """
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import SQLAlchemyError

    url = normalize_url(url)
    quiet_optuna_warnings()
    try:
        _enable_sqlite_wal(url)
        return RDBStorage(
            url,
            engine_kwargs=engine_kwargs(url),
            heartbeat_interval=heartbeat_settings()[0] if heartbeat else None,
            grace_period=heartbeat_settings()[1] if heartbeat else None,
            heartbeat_stale_trial_callback=heartbeat_stale_trial_callback,
        )
    except (SQLAlchemyError, sqlite3.Error, OSError) as error:
        raise unreachable(url, error) from None
    except ImportError as error:
        raise missing_driver(url, error) from None
