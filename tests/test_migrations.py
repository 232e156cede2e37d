"""Our alembic chain and Optuna's share one database, whichever ran first, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import optuna
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import (
    current_revision,
    head_revision,
    open_storage,
    upgrade_orchestrator_schema,
)
from orchestrator.record.store.records import TABLE_NAMES, VERSION_TABLE, include_object, metadata
from orchestrator.record.store.storage import create_storage


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(StorageLocation.parse(url).url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _optuna_revision(url: str) -> str | None:
    engine = sa.create_engine(StorageLocation.parse(url).url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def test_optuna_first_then_ours(storage_url):
    optuna.create_study(study_name="before", storage=storage_url)  # Optuna's schema alone
    storage = open_storage(StorageLocation.parse(storage_url))
    tables = _tables(storage_url)
    assert tables >= TABLE_NAMES
    assert {"alembic_version", VERSION_TABLE, "studies", "trials"} <= tables
    assert current_revision(storage) == head_revision()
    assert optuna.load_study(study_name="before", storage=storage_url).study_name == "before"


def test_ours_first_then_optuna_upgrade(storage_url):
    storage = open_storage(StorageLocation.parse(storage_url))
    optuna_version = _optuna_revision(storage_url)
    # Optuna's own check and upgrade path must not see our chain as its own.
    assert optuna_version == storage.get_current_version()
    assert storage.get_current_version() == storage.get_head_version()
    storage.upgrade()
    upgrade_orchestrator_schema(storage)  # a second upgrade is a no-op
    assert current_revision(storage) == head_revision()
    optuna.create_study(study_name="after", storage=storage_url)
    assert _tables(storage_url) >= TABLE_NAMES


def test_autogenerate_sees_no_difference_and_never_touches_optuna(storage_url):
    storage = open_storage(StorageLocation.parse(storage_url))
    with storage.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_object": include_object, "version_table": VERSION_TABLE}
        )
        diff = compare_metadata(context, metadata)
    assert diff == []


def test_cli_db_upgrade_twice(storage_url):
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "db", "upgrade", "--storage", storage_url],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        assert f"orchestrator schema {head_revision()}" in done.stdout
    create_storage(StorageLocation.parse(storage_url))


def test_wheel_ships_the_migration_scripts(tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "migrations/env.py" in names
    assert "migrations/script.py.mako" in names
    assert any(name.startswith("migrations/versions/0001") for name in names)
    for package in ("orchestrator/__init__.py", "samplers/__init__.py", "adapters/__init__.py"):
        assert package in names


def test_reading_a_database_of_an_earlier_version_brings_our_tables_up_to_date(storage_url):
    from alembic import command

    from orchestrator.record.store.migrate import alembic_config
    from tests.cli_helpers import run_cli

    storage = open_storage(StorageLocation.parse(storage_url))
    optuna.create_study(study_name="old", storage=storage)
    config = alembic_config(storage.url)
    with storage.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")  # as the first version left it
    assert current_revision(storage) == "0001"
    shown = run_cli("status", "--study", "old", "--storage", storage_url)
    assert shown.returncode == 0, shown.stderr
    assert current_revision(storage) == head_revision()
