"""Where a study lives: storage URL resolution, masking, and the one place RDBStorage is built."""

from __future__ import annotations

import os
import re
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


def repair_url(url: str) -> str:
    """The URL with any '@' inside the user or password written as %40.

    SQLAlchemy ends the password at its first '@', so `u:Tr0ub@dor@host` would connect to the
    host "dor@host" and print the password's tail in the error. The host is what follows the
    last '@'; everything between '://' and it is credentials. (An SQLite path may hold an '@'.)
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.startswith("sqlite") or rest.count("@") < 2:
        return url
    credentials, _, location = rest.rpartition("@")
    return f"{scheme}://{credentials.replace('@', '%40')}@{location}"


GOOD_URLS = "use sqlite:///FILE.db or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def parse_url(url: str) -> URL:
    """Parse and check a storage URL; a bad one is a UserError that says what a good one looks like."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(repair_url(url))
        port = parsed.port  # SQLAlchemy reads the port as it parses; check its range here
    except (ArgumentError, ValueError) as error:
        location = url.rpartition("@")[2]
        why = (
            "an IPv6 host needs its closing bracket, e.g. [::1]:5432"
            if "[" in location and "]" not in location
            else "its port is not a number"
            if "int()" in str(error)
            else "it is malformed"
        )
        raise UserError(f"the storage URL {mask_password(url)!r}: {why}; {GOOD_URLS}") from None
    if port is not None and not 0 < port < 65536:
        raise UserError(
            f"the storage URL {mask_password(url)!r} has port {port}: use 1-65535 (PostgreSQL's "
            "is 5432)"
        )
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise UserError(f"the storage URL {mask_password(url)!r} names {backend!r}: {GOOD_URLS}")
    if backend == "postgresql" and parsed.host and not _is_host(parsed.host):
        raise UserError(
            f"the storage URL {mask_password(url)!r} has no readable host: {GOOD_URLS} "
            "(an IPv6 address goes in brackets, [::1])"
        )
    return parsed


def _is_host(host: str) -> bool:
    # A name, an IPv4 address, or the inside of [IPv6] brackets; never a bracket or a space.
    return not any(char in host for char in "[]@ /\\?#")


def normalize_url(url: str) -> str:
    """A plain postgresql:// URL uses psycopg2, the driver we install (SQLAlchemy 2.1 would pick psycopg 3)."""
    parsed = parse_url(url)
    if parsed.drivername == "postgresql":
        return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    if parsed.get_backend_name() == "postgresql":
        return parsed.render_as_string(hide_password=False)
    return url


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, safe to print or log."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest or scheme.startswith("sqlite"):
        return url
    # By hand, not by SQLAlchemy: a URL that does not parse must be masked as well as one that does.
    credentials, _, location = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}:***@{location}" if colon else url


# --- secrets: never printed, never logged --------------------------------------------------

# Passwords seen in this process (in --storage, $ORCHESTRATOR_STORAGE, a trial's job), in every
# spelling they may take in a message: as typed, decoded, and percent-encoded.
_SECRETS: set[str] = set()
# A shorter password is hidden where a URL shows it, not in every word that happens to hold it.
SHORTEST_SECRET = 4
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_PASSWORD_IN_DSN = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def password_of(url: str | None) -> str | None:
    """The password written in `url` (by the same rule as repair_url), or None."""
    scheme, sep, rest = (url or "").partition("://")
    if not sep or "@" not in rest or scheme.startswith("sqlite"):
        return None
    _user, colon, password = rest.rpartition("@")[0].partition(":")
    return password if colon and password else None


def remember_secret(url: str | None) -> None:
    """Hide the password of `url` from every message and log line of this process from now on."""
    password = password_of(url)
    if not password:
        return
    from urllib.parse import quote, unquote

    plain = unquote(password)
    for form in {password, plain, quote(plain, safe=""), quote(plain)}:
        if len(form) >= SHORTEST_SECRET:
            _SECRETS.add(form)


def redact(text: str) -> str:
    """`text` with every URL's password and every remembered password replaced by ***."""
    if "://" in text:
        text = _URL_IN_TEXT.sub(_mask_match, text)
    if "password" in text.lower():
        text = _PASSWORD_IN_DSN.sub(r"\1***", text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _mask_match(match: re.Match[str]) -> str:
    # Our own messages show the form of a URL: USER:PASSWORD is a placeholder, not a secret.
    url = match.group(0)
    return url if password_of(url) == "PASSWORD" else mask_password(url)


_redacting = False


def protect_output() -> None:
    """From now on, log records and uncaught tracebacks of this process are redacted.

    A log record factory, not a handler filter, so that a handler added later (a log file) gets
    redacted records too. Idempotent; every process that opens a storage calls it."""
    global _redacting
    if _redacting:
        return
    _redacting = True
    import logging
    import sys
    import traceback

    make_record = logging.getLogRecordFactory()

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        message = record.getMessage()
        safe = redact(message)
        if safe != message:
            record.msg, record.args = safe, ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_text = record.exc_text.rstrip("\n")
        return record

    logging.setLogRecordFactory(redacted_record)

    def redacted_excepthook(kind, value, tb) -> None:  # noqa: ANN001
        sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = redacted_excepthook


def describe_location(url: str) -> str:
    """Where a storage is, in words a user can check: the file, or host and port."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite file {parsed.database or ':memory:'}"
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

    remember_secret(url)
    protect_output()
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
