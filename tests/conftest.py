"""Shared fixtures: a real SQLite file and a real PostgreSQL database per test.

PostgreSQL comes from ORCHESTRATOR_TEST_POSTGRES (a server URL; each test makes its own database
and drops it). Unset outside CI, those tests skip with the reason; under CI=true they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "ORCHESTRATOR_TEST_POSTGRES"


def _server_url() -> str | None:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {POSTGRES_ENV} is unset: CI must test against a real PostgreSQL")
    pytest.skip(f"{POSTGRES_ENV} is unset: set it to a PostgreSQL server URL to run this test")
    return None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL to a brand-new PostgreSQL database, dropped after the test."""
    import sqlalchemy as sa

    server = _server_url()
    assert server is not None
    name = f"orch_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as error:
        admin.dispose()
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"PostgreSQL at {POSTGRES_ENV} does not answer: {error.orig}")
    url = sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request) -> str:
    """Each test that takes this runs once on an SQLite file and once on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")
