"""An SQLite file checked before a command that writes opens it: one line for each way it cannot be.

Opening an unfit file would fail deep inside SQLAlchemy, Optuna or our lock file (`FILE.lock`
beside it), with a traceback or a misleading line ("check that the database is running"), and
could leave a lock file or a new folder behind. So the file is looked at first, and nothing is
made until it passes: its folder must exist (SQLite itself refuses a missing one: we do not
create it), the path must not be a folder, an existing file must be an SQLite database, the file
and its folder writable (SQLite writes its `-wal` and `-shm` files there), and the disk must have
room for a study's first writes.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from orchestrator.errors import UserError

# Room a run needs before it stores anything: a new database's two schemas take about 300 KB
# and its write-ahead log grows by a page per write until SQLite checkpoints it back into the
# file, at 1000 pages (4 MB of 4 KB pages; while other processes read, it can grow past that).
# Below this, a run would store the study's settings and then fail part-way through its first
# trials (a 3 MB disk filled at the fifth trial, the log at 3 MB).
SCHEMA_BYTES = 1024 * 1024
WAL_CHECKPOINT_BYTES = 1000 * 4096
MIN_FREE_BYTES = SCHEMA_BYTES + WAL_CHECKPOINT_BYTES


def check_sqlite_file(path: Path, *, min_free: int = MIN_FREE_BYTES) -> None:
    """Refuse an SQLite file that a writing command could not use, with the line that says why."""
    where = f"SQLite file {path}"
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(
            f"cannot open the database ({where}): its folder {folder} does not exist (SQLite "
            "does not create folders); create it, or give another --storage"
        )
    if path.is_dir():
        raise UserError(
            f"the database ({where}) is a folder, not a file: give a file's path, e.g. "
            f"--storage sqlite:///{path / 'study.db'}"
        )
    if path.exists() and not _is_sqlite(path):
        raise UserError(
            f"the file {path} is not an SQLite database: give another --storage, or move the "
            "file away"
        )
    if not (os.access(folder, os.W_OK | os.X_OK) and (not path.exists() or _writable(path))):
        raise UserError(
            f"the database ({where}) is read-only (the file or its folder cannot be written): "
            "make the file and its folder writable by this user, or give another --storage"
        )
    free = shutil.disk_usage(folder).free
    if free < min_free:
        raise UserError(
            f"the disk holding the database ({where}) is full: {free // 1024} KB free, a run "
            f"needs at least {min_free // 1024} KB; free some space there or give another --storage"
        )


def _is_sqlite(path: Path) -> bool:
    """An SQLite database, or an empty file (which SQLite makes one of).

    Asked of SQLite itself, never by opening the file: closing any descriptor of a file drops
    every POSIX lock the process holds on it, the locks of this process's own SQLite
    connections included (a second `optimize` in one process still has the first one's). Other
    processes then take this process for gone and remove the WAL index under it, and what they
    write after that is lost to it, then to the file."""
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            connection.execute("PRAGMA schema_version")
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        return "not a database" not in str(error)  # else let SQLite say why, later
    return True


def _writable(path: Path) -> bool:
    # access() answers for a read-only mount and an immutable file too, root included.
    return os.access(path, os.W_OK)
