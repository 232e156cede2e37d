"""Locks shared by every process and machine that uses one storage.

- The budget lock: counting a study's trials and asking for the next one happen under it, so the
  budget never overshoots.
- The schema lock: creating Optuna's tables and upgrading ours happen under it, so workers that
  start together on an empty database do not create the same tables twice.

On PostgreSQL each is an advisory lock on a key derived from its name, held by a connection of
its own while Optuna works through another; beside an SQLite file, an exclusive file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import zlib
from collections.abc import Iterator

from orchestrator.storage import engine_kwargs, normalize_url, sqlite_path


def lock_key(name: str) -> int:
    # Advisory locks take a bigint; a 32-bit CRC under a fixed namespace avoids other users' keys.
    return (0x6F7263 << 32) | zlib.crc32(name.encode())


@contextlib.contextmanager
def storage_lock(url: str, name: str) -> Iterator[None]:
    """Hold the lock called `name` on this storage, waiting for it as long as it takes."""
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{path}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if url.startswith("sqlite"):
        yield  # in-memory SQLite: one process only
        return
    import sqlalchemy as sa

    kwargs = engine_kwargs(url)
    kwargs.pop("pool_pre_ping", None)
    engine = sa.create_engine(normalize_url(url), poolclass=sa.pool.NullPool, **kwargs)
    key = {"key": lock_key(name)}
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), key)
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), key)
                conn.commit()
    finally:
        engine.dispose()


def budget_lock(url: str, study_name: str) -> contextlib.AbstractContextManager[None]:
    return storage_lock(url, f"budget:{study_name}")


def schema_lock(url: str) -> contextlib.AbstractContextManager[None]:
    return storage_lock(url, "schema")
