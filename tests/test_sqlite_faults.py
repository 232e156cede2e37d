"""A locked or read-only SQLite file: one line, no traceback, and the study as it was."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import cli_env, run_cli

RUN = ("run", "synthetic", "--trials", "4", "--option", "trial_seconds=0.1", "--epochs", "1",
       "--gpus", "sim:24576")  # fmt: skip


@pytest.fixture
def folder(tmp_path):
    done = run_cli(*RUN[:3], "2", *RUN[4:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@contextlib.contextmanager
def held_exclusively(path: Path) -> Iterator[None]:
    """Another process's write lock on the file, held until the block ends."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_file_locked_for_longer_than_the_bound_is_one_line(folder):
    database = folder / "orchestrator.db"
    before = _dump(database)
    env = cli_env(ORCHESTRATOR_SQLITE_BUSY_TIMEOUT="1")
    with held_exclusively(database):
        done = run_cli(*RUN, "--storage-retry-seconds", "3", cwd=folder, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    errors = _error_lines(done.stderr)
    assert len(errors) == 1, done.stderr
    assert done.returncode == 75, done.stderr
    assert errors[0].startswith(
        "error: the database (SQLite file orchestrator.db) has been locked by another process for"
    ), errors
    assert "resume with `python -m orchestrator run synthetic --trials 4" in errors[0]
    assert done.stderr.strip().splitlines()[-1] == errors[0]
    assert _dump(database) == before


def test_a_lock_that_goes_within_the_bound_is_ridden_out(folder):
    database = folder / "orchestrator.db"
    env = cli_env(ORCHESTRATOR_SQLITE_BUSY_TIMEOUT="1")
    with held_exclusively(database):
        runner = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *RUN],
            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)  # the run meets the lock, waits, and goes on once it is released
    out, err = runner.communicate(timeout=300)
    assert runner.returncode == 0, err
    assert "4/4 trials done" in out
    said = [line for line in err.splitlines() if "locked by another process" in line]
    assert len(said) <= 1 and "Traceback" not in err, err


def _make_read_only(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return
    # Root writes through file modes; the immutable attribute stops root as well.
    if shutil.which("chattr") is None:
        pytest.fail("running as root without chattr: cannot make a file read-only")
    subprocess.run(["chattr", "+i", str(path)], check=True)


def _make_writable(path: Path) -> None:
    if os.geteuid() != 0:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    else:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_file_is_one_line(folder):
    database = folder / "orchestrator.db"
    before = _dump(database)
    _make_read_only(database)
    try:
        done = run_cli(*RUN, cwd=folder)
    finally:
        _make_writable(database)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = _error_lines(done.stderr)
    assert errors == [done.stderr.strip().splitlines()[-1]], done.stderr
    assert errors[0].startswith("error: the database (SQLite file orchestrator.db) is read-only")
    assert "make the file and its folder writable" in errors[0]
    assert _dump(database) == before
