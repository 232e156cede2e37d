"""Bring a database up to date: Optuna's schema first, then our alembic chain beside it."""

from __future__ import annotations

import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import when_a_connection_is_free
from orchestrator.record.store.locks import schema_lock
from orchestrator.record.store.records import VERSION_TABLE
from orchestrator.record.store.sqlite_file import check_sqlite_file
from orchestrator.record.store.storage import create_storage, location_of, sqlite_busy_timeout
from orchestrator.record.store.storage_failures import missing_driver, unreachable

if TYPE_CHECKING:
    import sqlalchemy as sa
    from alembic import command as alembic_command
    from alembic import config as alembic_configuration
    from alembic import script as alembic_script
    from alembic.runtime import migration as alembic_migration
    from optuna.storages import RDBStorage

    from orchestrator.record.store.location import StorageLocation
else:
    alembic_configuration = LazyImport("alembic.config")
    alembic_migration = LazyImport("alembic.runtime.migration")
    alembic_script = LazyImport("alembic.script")
    alembic_command = LazyImport("alembic.command")
    sa = LazyImport("sqlalchemy")


def alembic_config(url: str) -> alembic_configuration.Config:
    """An alembic Config built in code, pointing at the scripts shipped inside the package."""
    config = alembic_configuration.Config()
    config.set_main_option("script_location", str(resources.files("migrations")))
    # ConfigParser interpolation would choke on a '%' in a URL-encoded password.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    scripts = alembic_script.ScriptDirectory.from_config(alembic_config("sqlite://"))
    return scripts.get_current_head() or ""


def current_revision(storage: RDBStorage) -> str | None:
    with storage.engine.connect() as connection:
        context = alembic_migration.MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        )
        return context.get_current_revision()


def upgrade_orchestrator_schema(storage: RDBStorage) -> None:
    """Run our chain to head on the storage's engine (Optuna's tables are left alone)."""
    config = alembic_config(storage.url)
    try:
        with storage.engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "head")
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(location_of(storage), error) from None


def open_storage(location: StorageLocation, **kwargs: Any) -> RDBStorage:
    """Open the storage with both schemas at head: what every command that writes starts with."""
    path = location.sqlite_path
    if path is not None:
        check_sqlite_file(path)  # before the lock file beside it is made
        sqlite_busy_timeout()  # a bad $ORCHESTRATOR_SQLITE_BUSY_TIMEOUT too

    def opened() -> RDBStorage:
        with schema_lock(location):
            storage = _created(location, kwargs)
            if current_revision(storage) != head_revision():
                upgrade_orchestrator_schema(storage)
        return storage

    try:
        # A server with no connection free is waited for (the lock let go meanwhile), not
        # reported as unreachable: a host joining a busy cluster waits its turn.
        storage = when_a_connection_is_free(opened)
    except sa.exc.SQLAlchemyError as error:  # the lock's connection failed: no server there
        raise unreachable(location, error) from None
    except ImportError as error:
        raise missing_driver(location, error) from None
    return storage


CREATE_ATTEMPTS = 3


def _created(location: StorageLocation, kwargs: dict[str, Any]) -> RDBStorage:
    """Optuna's storage, created if missing. Our processes create it under the schema lock, but
    a plain Optuna process (a script's `optuna.load_study`, the dashboard) takes no lock: when it
    creates the same tables at the same moment, one of the two inserts the schema's version row
    second and fails on its unique key. The tables are then there: opening again finds them."""
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            return create_storage(location, **kwargs)
        except UserError as error:
            if attempt == CREATE_ATTEMPTS or not lost_a_creation_race(error):
                raise
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def lost_a_creation_race(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) says another process created the same
    schema first: a duplicate version row, or a table or type that already exists."""
    seen: BaseException | None = error
    for _ in range(10):  # the chain is short; a cycle must not loop for ever
        if seen is None:
            return False
        # SQLite says "table trials already exists" (an OperationalError), PostgreSQL a
        # duplicate key of its catalogue, either one a UNIQUE failure of the version row.
        if isinstance(seen, sa.exc.DBAPIError):
            text = str(seen).lower()
            return any(words in text for words in ("unique", "duplicate", "already exists"))
        seen = seen.__cause__ or seen.__context__
    return False
