"""Alembic environment for the orch_* tables, living beside Optuna's tables in one database.

Optuna's own chain uses alembic's default `alembic_version` table, so ours keeps its revision in
`orchestrator_alembic_version`, and autogenerate only ever looks at our tables.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from orchestrator.record.store.records import VERSION_TABLE, include_object, metadata

config = context.config


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        _run_with(connection)


def _run_with(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
