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
    parts = (parsed.username, parsed.password, parsed.host, parsed.database)
    if any("\x00" in str(part) for part in parts if part is not None):
        raise UserError(
            f"the storage URL {mask_password(url)!r} holds a NUL character (%00), which no "
            "database accepts: remove it"
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


def engine_kwargs(url: str) -> dict[str, Any]:
    """Engine settings that ride out outages.

    Every engine checks a pooled connection before using it (`pool_pre_ping`: after a
    PostgreSQL restart the pool holds dead connections, and SQLAlchemy replaces them instead of
    failing the call; Optuna's RDBStorage then just works on its next session). PostgreSQL
    connections time out and keep alive; SQLite waits for a busy file."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": sqlite_busy_timeout()}
    else:
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVES}
    return kwargs


def _enable_sqlite_wal(url: str) -> None:
    # WAL lets readers and one writer work at once; the mode is stored in the file, so once is enough.
    path = sqlite_path(url)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=sqlite_busy_timeout())
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

    def filter(self, record: Any) -> bool:
        message = record.getMessage()
        if not message.startswith("Caught an error from sqlalchemy"):
            return True
        return not any(words in message for words in self.LOST)


def _quiet_optuna_fallback() -> None:
    import logging

    logger = logging.getLogger("optuna.storages._rdb.storage")
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


def create_storage(
    url: str,
    *,
    heartbeat: bool = False,
    heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    wait: bool = False,
) -> RDBStorage:
    """Open Optuna's RDBStorage on URL, creating Optuna's schema when it is missing.

    With `heartbeat`, trials record heartbeats and a silent one is failed (and handed to the
    callback) by `optuna.storages.fail_stale_trials`. Opening fails at once when the database
    cannot be reached (a wrong URL says so in a second), unless `wait`: then it rides out an
    outage as every later call does (see RidingRDBStorage). A process that a running study
    starts (a trial process) waits; a command the user just typed does not.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.record.outage import note_storage

    remember_secret(url)
    protect_output()
    note_storage(url)  # outage lines name the storage
    url = normalize_url(url)
    quiet_optuna_warnings()
    interval, grace = heartbeat_settings() if heartbeat else (None, None)

    def open_it() -> RDBStorage:
        _enable_sqlite_wal(url)
        return _riding_storage_class()(
            url,
            engine_kwargs=engine_kwargs(url),
            heartbeat_interval=interval,
            grace_period=grace,
            heartbeat_stale_trial_callback=heartbeat_stale_trial_callback,
        )

    try:
        if wait:
            from orchestrator.record.outage import ride_out

            return ride_out(open_it, what="open the storage")
        return open_it()
    except (SQLAlchemyError, sqlite3.Error, OSError) as error:
        raise unreachable(url, error) from None
    except ImportError as error:
        raise missing_driver(url, error) from None


# --- Optuna's storage, riding out outages --------------------------------------------------

# RDBStorage's methods that use the database, and what each does in a user's words.
_RIDDEN = {
    "create_new_study": "create the study",
    "delete_study": "delete a study",
    "set_study_user_attr": "store the study's settings",
    "set_study_system_attr": "store the sampler's state",
    "get_study_id_from_name": "find the study",
    "get_study_name_from_id": "read the study's name",
    "get_study_directions": "read the study's direction",
    "get_study_user_attrs": "read the study's settings",
    "get_study_system_attrs": "read the sampler's state",
    "get_trial_user_attrs": "read a trial's attributes",
    "get_trial_system_attrs": "read a trial's sampler state",
    "get_all_studies": "list the studies",
    "create_new_trial": "ask for a trial",
    "set_trial_param": "store a trial's parameter",
    "_set_trial_param": "store a trial's parameter",  # what Optuna's trial cache calls
    "_get_best_trial_id": "read the best trial",
    "get_trial_param": "read a trial's parameter",
    "set_trial_intermediate_value": "report a trial's progress",
    "set_trial_user_attr": "store a trial's attribute",
    "set_trial_system_attr": "store a trial's sampler state",
    "get_trial_id_from_study_id_trial_number": "find a trial",
    "get_trial": "read a trial",
    "get_all_trials": "read the trials",
    "_get_trials": "read the trials",
    "get_best_trial": "read the best trial",
    "record_heartbeat": "record a trial's heartbeat",
    "_get_stale_trial_ids": "look for lost trials",
}


def _ridden(method: Callable[..., Any], what: str) -> Callable[..., Any]:
    import functools

    from orchestrator.record.outage import ride_out

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ride_out(lambda: method(self, *args, **kwargs), what=what)

    return call


def _set_trial_state_values(self: Any, trial_id: int, state: Any, values: Any = None) -> bool:
    """Tell, riding out an outage. A connection lost at the commit leaves it unknown whether the
    state landed: a retry that finds the trial finished in that very state has told it."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import RDBStorage

    from orchestrator.record.outage import ride_out

    attempts = 0

    def attempt() -> bool:
        nonlocal attempts
        attempts += 1
        try:
            return RDBStorage.set_trial_state_values(self, trial_id, state, values)
        except UpdateFinishedTrialError:
            landed = attempts > 1 and state.is_finished()
            if landed and RDBStorage.get_trial(self, trial_id).state == state:
                return True
            raise

    return ride_out(attempt, what="tell a trial's result")


# Each new trial carries a mark of its own, written in the same transaction: a retry after a
# connection lost at the commit finds the trial its lost attempt made instead of making another
# (which would stay RUNNING for ever, holding a slot of the budget).
ASK_MARK = "orchestrator:ask"


def _create_new_trial(self: Any, study_id: int, template_trial: Any = None) -> Any:
    import copy
    import datetime as dt
    import uuid

    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial, TrialState

    from orchestrator.record.outage import ride_out

    mark = uuid.uuid4().hex
    if template_trial is None:
        template = FrozenTrial(
            number=-1,
            state=TrialState.RUNNING,
            value=None,
            values=None,
            datetime_start=dt.datetime.now(),
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={},
            system_attrs={},
            intermediate_values={},
            trial_id=-1,
        )
    else:
        template = copy.deepcopy(template_trial)
    template._system_attrs = {**template.system_attrs, ASK_MARK: mark}
    attempts = 0

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            made = _marked_trial_id(self, study_id, mark)
            if made is not None:
                return RDBStorage.get_trial(self, made)
        return _create_once(self, study_id, template)

    return ride_out(attempt, what="ask for a trial")


def _create_once(storage: Any, study_id: int, template: Any) -> Any:
    """One attempt of RDBStorage._create_new_trial. Optuna's own method retries a failed commit
    itself, blind to whether it landed, and would make a second trial with the same mark."""
    import copy

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(storage.scoped_session) as session:
        # Optuna's lock on the study row: numbering a new trial is not atomic otherwise.
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        trial = storage._get_prepared_new_trial(study_id, template, session)
        frozen = copy.deepcopy(template)
        frozen.number = trial.number
        frozen.datetime_start = trial.datetime_start
        frozen._trial_id = trial.trial_id
        return frozen


def _marked_trial_id(storage: Any, study_id: int, mark: str) -> int | None:
    import json

    import sqlalchemy as sa
    from optuna.storages._rdb import models

    attrs, trials = models.TrialSystemAttributeModel.__table__, models.TrialModel.__table__
    query = (
        sa.select(attrs.c.trial_id)
        .join(trials, trials.c.trial_id == attrs.c.trial_id)
        .where(
            trials.c.study_id == study_id,
            attrs.c.key == ASK_MARK,
            attrs.c.value_json == json.dumps(mark),
        )
    )
    with storage.engine.connect() as conn:
        return conn.execute(query).scalar()


_RIDING_CLASS: type | None = None


def _riding_storage_class() -> type[RDBStorage]:
    """RDBStorage whose every database call rides out an outage (`orchestrator.record.outage`).

    A subclass, not a wrapper, so that Optuna still puts its trial cache in front of it
    (`optuna.load_study` caches an RDBStorage, and only an RDBStorage)."""
    global _RIDING_CLASS
    if _RIDING_CLASS is None:
        from optuna.storages import RDBStorage

        body = {name: _ridden(getattr(RDBStorage, name), what) for name, what in _RIDDEN.items()}
        body["set_trial_state_values"] = _set_trial_state_values
        body["_create_new_trial"] = _create_new_trial
        body["__module__"] = __name__
        _RIDING_CLASS = type("RidingRDBStorage", (RDBStorage,), body)
    return _RIDING_CLASS


def __getattr__(name: str) -> Any:
    # `RidingRDBStorage` is made on first use (Optuna is imported late); pickle finds it here.
    if name == "RidingRDBStorage":
        return _riding_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
