from __future__ import annotations

import sqlite3

import pytest

from orchestrator.errors import UserError
from orchestrator.record.store.location import (
    DEFAULT_STORAGE,
    STORAGE_ENV,
    StorageLocation,
    mask_password,
)
from orchestrator.record.store.storage import create_storage, heartbeat_settings


def test_flag_wins_over_environment_over_default():
    env = {STORAGE_ENV: "sqlite:///from-env.db"}
    assert StorageLocation.resolve("sqlite:///flag.db", env).text == "sqlite:///flag.db"
    assert StorageLocation.resolve(None, env).text == "sqlite:///from-env.db"
    assert StorageLocation.resolve(None, {}).text == DEFAULT_STORAGE == "sqlite:///orchestrator.db"
    assert StorageLocation.resolve("", {STORAGE_ENV: ""}).text == DEFAULT_STORAGE


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:s3cret@db.example:5432/studies",
        "postgresql+psycopg2://alice:s3cret@db.example/studies",
        "not a url://alice:s3cret@host/x",
        "postgresql://alice:s3cr@t@127.0.0.1:5433/x",  # an unencoded '@' in the password
    ],
)
def test_password_is_masked(url):
    masked = mask_password(url)
    assert "s3cret" not in masked and "s3cr" not in masked and "t@127" not in masked
    assert "***" in masked


def test_an_unencoded_at_sign_in_a_password_is_never_shown_as_the_host():
    where = StorageLocation.parse("postgresql://alice:s3cr@t@127.0.0.1:5433/x").describe()
    assert where == "PostgreSQL at 127.0.0.1:5433"


def test_the_host_is_what_follows_the_last_at_sign():
    from sqlalchemy.engine import make_url

    url = StorageLocation.parse("postgresql://u:Tr0ub@dorXsecret9@127.0.0.1:5432/db").url
    parsed = make_url(url)
    assert (parsed.host, parsed.port, parsed.password) == ("127.0.0.1", 5432, "Tr0ub@dorXsecret9")


def test_an_at_sign_in_an_sqlite_path_is_a_path():
    assert StorageLocation.parse("sqlite:////tmp/a@b/x@y.db").url == "sqlite:////tmp/a@b/x@y.db"


def test_a_password_with_an_at_sign_reaches_the_server_whole():
    """The issue's report: the password's tail was taken for the host and printed."""
    with pytest.raises(UserError) as caught:
        create_storage(StorageLocation.parse("postgresql://u:Tr0ub@dorXsecret9@127.0.0.1:1/db"))
    message = str(caught.value)
    assert "127.0.0.1:1" in message and "Connection refused" in message
    assert "dorXsecret9" not in message and "Tr0ub" not in message


def test_plain_postgresql_url_uses_the_installed_driver():
    assert StorageLocation.parse("postgresql://u:p@h:5432/d").url.startswith(
        "postgresql+psycopg2://u:p@h:5432/d"
    )
    assert StorageLocation.parse("sqlite:///x.db").url == "sqlite:///x.db"


@pytest.mark.parametrize(
    "url",
    [
        "nonsense",
        "mysql://u@h/d",
        "redis://localhost:6379",
        "postgresql://u:pw@localhost:abc/db",
        "postgresql://u:pw@[::1/db",
        "postgresql://u:pw@localhost:99999/db",
        "postgresql://u:pw@local host/db",
        "postgresql://u:p%00w@localhost/db",  # found by tests/test_secrets.py's property
    ],
)
def test_malformed_or_unsupported_url_is_a_user_error(url):
    with pytest.raises(UserError, match="the storage URL") as caught:
        StorageLocation.parse(url)
    assert "pw" not in str(caught.value).replace("PASSWORD", "")
    assert "\n" not in str(caught.value)


def test_unreachable_postgres_names_host_and_port_not_password():
    with pytest.raises(UserError) as caught:
        create_storage(StorageLocation.parse("postgresql://alice:s3cret@127.0.0.1:1/studies"))
    message = str(caught.value)
    assert "127.0.0.1:1" in message
    assert "s3cret" not in message
    assert "\n" not in message


def test_sqlite_file_is_in_wal_mode_with_a_busy_timeout(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = create_storage(StorageLocation.parse(url))
    mode = sqlite3.connect(tmp_path / "study.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert storage.engine.dialect.name == "sqlite"
    with storage.engine.connect() as conn:
        timeout_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    assert timeout_ms >= 30_000


def test_postgres_engine_checks_connections_before_use(postgres_url):
    storage = create_storage(StorageLocation.parse(postgres_url))
    assert storage.engine.pool._pre_ping


def test_heartbeat_settings_from_environment():
    assert heartbeat_settings({}) == (10, 40)
    assert heartbeat_settings(
        {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "1", "ORCHESTRATOR_GRACE_PERIOD": "3"}
    ) == (1, 3)
    with pytest.raises(UserError, match="whole number"):
        heartbeat_settings({"ORCHESTRATOR_GRACE_PERIOD": "soon"})
