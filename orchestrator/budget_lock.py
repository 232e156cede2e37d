"""One asker at a time per study, across processes and machines, so the budget never overshoots.

Counting the study's trials and asking for the next one happen under this lock: PostgreSQL's
advisory lock on a key derived from the study name (held by its own connection while Optuna's
ask commits through another), or an exclusive lock on a file beside an SQLite database.
"""

from __future__ import annotations

import contextlib
import fcntl
import zlib
from collections.abc import Iterator

from orchestrator.storage import engine_kwargs, normalize_url, sqlite_path


def lock_key(study_name: str) -> int:
    # Advisory locks take a bigint; a 32-bit CRC under a fixed namespace avoids other users' keys.
    return (0x6F7263 << 32) | zlib.crc32(study_name.encode())


@contextlib.contextmanager
def budget_lock(url: str, study_name: str) -> Iterator[None]:
    path = sqlite_path(url)
    if path is not None:
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

    engine = sa.create_engine(normalize_url(url), poolclass=sa.pool.NullPool, **_no_pool(url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": lock_key(study_name)})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(
                    sa.text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key(study_name)}
                )
                conn.commit()
    finally:
        engine.dispose()


def _no_pool(url: str) -> dict:
    kwargs = engine_kwargs(url)
    kwargs.pop("pool_pre_ping", None)
    return kwargs
