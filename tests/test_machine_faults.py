"""Faults of the machine under an SQLite study: a full disk, a read-only filesystem, two processes
creating one database at once. Each is one line and nothing is left behind.

The disks are real filesystems of a few hundred KB (tmpfs, mounted by the test: it runs as root,
as the project's CI does).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import current_revision, head_revision, open_storage
from tests.cli_helpers import run_cli

RUN = ("run", "synthetic", "--trials", "2", "--option", "trial_seconds=0.05", "--epochs", "1",
       "--gpus", "sim:24576", "-q")  # fmt: skip


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A filesystem of `size` mounted at `folder` while the block runs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.fail("these faults need root to mount a small filesystem (the CI runs as root)")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        # Lazily: a connection the test still holds must not keep the mount (or fail the test).
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_disk_too_full_for_a_study_is_refused_before_anything_is_stored(tmp_path):
    with small_disk(tmp_path / "disk", "200k") as disk:
        done = run_cli(*RUN, "--storage", f"sqlite:///{disk}/study.db", cwd=tmp_path)
        line = _one_error_line(done)
        assert done.returncode == 2
        assert f"the disk holding the database (SQLite file {disk}/study.db) is full" in line
        assert "free some space there" in line
        assert list(disk.iterdir()) == []  # no database, no lock file


def test_a_stored_study_on_a_disk_that_filled_keeps_its_budget(tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        url = f"sqlite:///{disk}/study.db"
        assert run_cli(*RUN, "--storage", url, cwd=tmp_path).returncode == 0
        # Fill the disk to a few KB, as another program would.
        with contextlib.suppress(OSError), (disk / "filler").open("wb", buffering=0) as filler:
            while True:
                filler.write(b"\0" * 4096)
        done = run_cli(*RUN[:3], "5", *RUN[4:], "--storage", url, cwd=tmp_path)
        line = _one_error_line(done)
        assert done.returncode == 2 and "is full" in line
        (disk / "filler").unlink()
        storage = optuna.storages.RDBStorage(url)
        study = optuna.load_study(study_name="synthetic", storage=storage)
        assert study.user_attrs["orchestrator"]["trials"] == 2  # the new budget was not stored
        assert all(t.state.is_finished() for t in study.trials) and len(study.trials) == 2
        storage.engine.dispose()
        # The logs, and the best trial's final checkpoint beside the database: nothing half-written.
        assert sorted(p.name for p in disk.iterdir() if not p.name.startswith("study.db")) == [
            "study-artifacts",
            "study-logs",
        ]
        assert not [p for p in disk.rglob("*") if p.suffix == ".partial"]


def test_a_read_only_filesystem_is_one_line_for_a_stored_and_a_new_file(tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        stored = f"sqlite:///{disk}/study.db"
        assert run_cli(*RUN, "--storage", stored, cwd=tmp_path).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        before = sorted(p.name for p in disk.iterdir())
        for url in (stored, f"sqlite:///{disk}/new.db"):
            done = run_cli(*RUN, "--storage", url, cwd=tmp_path)
            line = _one_error_line(done)
            assert done.returncode == 2 and "is read-only" in line, line
            assert "make the file and its folder writable" in line
        assert sorted(p.name for p in disk.iterdir()) == before


RACER = """
import sys, time
kind, url, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
if kind == "ours":
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.migrate import open_storage as opened

    url = StorageLocation.parse(url)
else:
    from optuna.storages import RDBStorage as opened
while time.time() < at:  # every racer starts at one moment, imports done
    pass
opened(url)
"""


def test_processes_that_create_one_database_at_once_all_open_it(tmp_path):
    """Two of ours and a plain Optuna process, started at one instant on a new file, a few
    times over: ours always open it (the plain one may lose the race inside Optuna: its error)."""
    for attempt in range(3):
        url = f"sqlite:///{tmp_path}/race-{attempt}.db"
        at = str(time.time() + 3.0)
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, kind, url, at],
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for kind in ("ours", "ours", "plain")
        ]
        results = [(racer.wait(timeout=120), racer.stderr.read()) for racer in racers]
        for code, err in results[:2]:
            assert code == 0, err
        storage = open_storage(StorageLocation.parse(url))
        assert current_revision(storage) == head_revision()
        assert optuna.get_all_study_names(storage) == []


def test_a_disk_that_fills_during_a_write_is_named_in_the_last_line(tmp_path):
    """SQLite's own error when the disk fills mid-run becomes the line that names the disk."""
    import sqlite3

    from orchestrator.record.store.storage_failures import storage_failure

    with small_disk(tmp_path / "disk", "200k") as disk:
        connection = sqlite3.connect(disk / "study.db")
        connection.execute("CREATE TABLE t (b BLOB)")
        with pytest.raises(sqlite3.OperationalError) as raised:
            for _ in range(100):
                connection.execute("INSERT INTO t VALUES (?)", (b"\0" * 16384,))
                connection.commit()
        connection.close()
    line = str(storage_failure(raised.value))
    assert line.startswith("the disk holding the database (") and "is full" in line, line
    assert "free some space there" in line


def _fill(disk: Path) -> None:
    """Fill the disk to its last bytes, as another program writing there would."""
    with contextlib.suppress(OSError), (disk / "filler").open("wb", buffering=0) as filler:
        while True:
            filler.write(b"\0" * 4096)


def _finished(url: str) -> list[str]:
    """The trials' states, read straight from the file (none before the run made its tables)."""
    import sqlite3

    try:
        connection = sqlite3.connect(f"file:{url.removeprefix('sqlite:///')}?mode=ro", uri=True)
        try:
            return [row[0] for row in connection.execute("SELECT state FROM trials")]
        finally:
            connection.close()
    except sqlite3.Error:
        return []


def test_a_disk_that_fills_during_a_run_is_one_line_and_loses_nothing(tmp_path):
    """SQLite and the trial logs on one small disk, filled while trials run: the run stops with
    one line naming the disk, what was told is kept, and the run resumes once there is room."""
    from tests.cli_helpers import cli_env

    run = ("run", "synthetic", "--trials", "30", "--option", "trial_seconds=0.3", "--epochs",
           "3", "--gpus", "sim:24576", "--concurrency", "2", "--pruner", "none")  # fmt: skip
    with small_disk(tmp_path / "disk", "8m") as disk:
        url = f"sqlite:///{disk}/study.db"
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *run, "--storage", url],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 240
        while "COMPLETE" not in _finished(url):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no trial finished"
            time.sleep(0.5)
        _fill(disk)
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, err
        assert "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: the disk holding the database (SQLite file {disk}/"), err
        assert "is full" in last and "free some space there" in last, err
        kept = _finished(url)
        assert "COMPLETE" in kept
        empty = [p for p in disk.rglob("*.partial") if p.stat().st_size == 0]
        assert not empty, f"empty partial files left: {empty}"
        (disk / "filler").unlink()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *run, "--storage", url, "-q"],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        states = _finished(url)
        assert states.count("COMPLETE") >= kept.count("COMPLETE"), "nothing told was lost"
        assert "RUNNING" not in states
