"""StorageLocation: the storage URL read once, what each kind of URL gives, and never its password."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.record.store.location import DEFAULT_STORAGE, STORAGE_ENV, StorageLocation

PASSWORD = "s3cretPw9"
POSTGRES = f"postgresql://alice:{PASSWORD}@db.example:5433/studies"


def test_a_relative_sqlite_file():
    location = StorageLocation.parse("sqlite:///runs/study.db")
    assert location.is_sqlite and location.backend == "sqlite"
    assert location.sqlite_path == Path("runs/study.db")
    assert location.url == location.text == "sqlite:///runs/study.db"
    assert location.describe() == "SQLite file runs/study.db"
    assert location.masked == str(location) == "sqlite:///runs/study.db"


def test_an_absolute_sqlite_file():
    location = StorageLocation.parse("sqlite:////data/runs/dqn.db")
    assert location.sqlite_path == Path("/data/runs/dqn.db")
    assert location.describe() == "SQLite file /data/runs/dqn.db"


def test_an_in_memory_sqlite_database_has_no_file():
    location = StorageLocation.parse("sqlite://")
    assert location.is_sqlite and location.sqlite_path is None
    assert location.describe() == "SQLite file :memory:"


def test_postgresql_with_a_password():
    location = StorageLocation.parse(POSTGRES)
    assert not location.is_sqlite and location.backend == "postgresql"
    assert location.sqlite_path is None
    assert (location.host, location.port, location.database) == ("db.example", 5433, "studies")
    assert location.describe() == "PostgreSQL at db.example:5433"
    # What SQLAlchemy and Optuna open: the installed driver, and the password whole.
    assert location.url == f"postgresql+psycopg2://alice:{PASSWORD}@db.example:5433/studies"
    assert location.text == POSTGRES


def test_postgresql_without_a_port_is_described_with_the_default_one():
    assert StorageLocation.parse("postgresql://bob@db/x").describe() == "PostgreSQL at db:5432"


@pytest.mark.parametrize(
    "url",
    [
        POSTGRES,
        f"postgresql+psycopg2://alice:{PASSWORD}@db/x",
        f"postgresql://a:Tr0ub@{PASSWORD}@h/x",
    ],
)
def test_the_password_is_never_in_repr_str_or_masked(url):
    location = StorageLocation.parse(url)
    for shown in (repr(location), str(location), location.masked, f"{location}", f"{location!r}"):
        assert PASSWORD not in shown and "***" in shown
    assert repr(location).startswith("StorageLocation(")
    assert PASSWORD not in repr([location]) and PASSWORD not in repr({"storage": location})


def test_it_pickles_to_an_equal_value():
    for url in (POSTGRES, "sqlite:///runs/study.db"):
        location = StorageLocation.parse(url)
        again = pickle.loads(pickle.dumps(location))
        assert again == location and again.url == location.url
        assert hash(again) == hash(location)


def test_it_is_frozen():
    location = StorageLocation.parse("sqlite:///a.db")
    with pytest.raises(AttributeError):
        location.url = "sqlite:///b.db"  # type: ignore[misc]


def test_resolve_takes_the_flag_then_the_environment_then_the_default():
    env = {STORAGE_ENV: "sqlite:///from-env.db"}
    assert StorageLocation.resolve("sqlite:///flag.db", env).text == "sqlite:///flag.db"
    assert StorageLocation.resolve(None, env).text == "sqlite:///from-env.db"
    assert StorageLocation.resolve(None, {}).text == DEFAULT_STORAGE
    given = StorageLocation.parse("sqlite:///given.db")
    assert StorageLocation.resolve(given, env) is given  # a flag already read is not read again


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "mysql://u@h/d",
            "the storage URL 'mysql://u@h/d' names 'mysql': use sqlite:///FILE.db or "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
        ),
        (
            "postgresql://u:pw@localhost:99999/db",
            "the storage URL 'postgresql://u:***@localhost:99999/db' has port 99999: use 1-65535 "
            "(PostgreSQL's is 5432)",
        ),
        (
            "postgresql://u:pw@localhost:abc/db",
            "the storage URL 'postgresql://u:***@localhost:abc/db': its port is not a number; use "
            "sqlite:///FILE.db or postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
        ),
        (
            "sqlite://cli.db",
            "the storage URL 'sqlite://cli.db' names no SQLite file (two slashes make 'cli.db' a "
            "host): use three, sqlite:///cli.db",
        ),
    ],
)
def test_a_bad_url_is_the_same_one_line_user_error(url, message):
    with pytest.raises(UserError) as caught:
        StorageLocation.parse(url)
    assert str(caught.value) == message


def test_a_bad_url_in_the_environment_is_said_when_resolved():
    with pytest.raises(UserError, match="names 'redis'"):
        StorageLocation.resolve(None, {STORAGE_ENV: "redis://localhost:6379"})
