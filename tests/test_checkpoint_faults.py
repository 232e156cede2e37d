"""A checkpoint is insurance, never the cause of a lost trial: with real processes, the checkpoint
folder fills up or turns read-only in the middle of a study, and every trial still completes.

The folder is a real filesystem (tmpfs, mounted by the test: it runs as root, as the project's CI
does), filled by the test as another program would, or remounted read-only. `run` exits 0; its
log names the folder and the cause in one line; each trial that met it says so once in its own
log, keeps `checkpoint` on its latest usable checkpoint and records `checkpoint_unsaved`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.record.checkpoints import files as stored
from tests.cli_helpers import run_cli, start_cli
from tests.test_machine_faults import small_disk
from tests.waiting import stored_study, wait_for

EPOCHS = 6
HOST_LINE = "checkpoints cannot be saved in"


def _run(url: str, folder: Path, trials: int = 4) -> tuple[str, ...]:
    return (
        "run", "synthetic", "--trials", str(trials), "--epochs", str(EPOCHS), "--option",
        "trial_seconds=6", "--concurrency", "2", "--pruner", "none", "--sampler", "random",
        "--gpus", "sim:24576", "--storage", url, "--artifacts", str(folder),
    )  # fmt: skip


def _fill(disk: Path) -> None:
    """Fill `disk` to its last page, as another program would (again after a trial tidied)."""
    with contextlib.suppress(OSError), (disk / "filler").open("ab", buffering=0) as filler:
        while True:
            filler.write(b"\0" * 4096)


def _first_saved(url: str) -> optuna.trial.FrozenTrial:
    def saved_twice() -> optuna.trial.FrozenTrial | None:
        for trial in stored_study(url, "synthetic").trials:
            if trial.user_attrs.get("checkpoint", {}).get("epoch", -1) >= 1:
                return trial
        return None

    tolerate = (KeyError, optuna.exceptions.StorageInternalError)
    return wait_for(saved_twice, "a trial with two checkpoints", timeout=240, tolerate=tolerate)


def _assert_every_trial_complete_and_said_once(
    url: str, stderr: str, folder: Path, cause: str, victim: int
) -> None:
    study = stored_study(url, "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4, stderr
    said = [line for line in stderr.splitlines() if HOST_LINE in line]
    assert len(said) == 1, stderr  # once for the host, not per trial nor per epoch
    assert f"{HOST_LINE} {folder} ({cause}" in said[0], said
    assert "Traceback" not in stderr, stderr
    unsaved = [t for t in study.trials if "checkpoint_unsaved" in t.user_attrs]
    assert victim in [t.number for t in unsaved], [t.user_attrs for t in study.trials]
    for trial in unsaved:
        failed = trial.user_attrs["checkpoint_unsaved"]
        assert failed["error"].startswith(cause), failed
        log = Path(trial.user_attrs["log_file"]).read_text()
        # Once per spell of failures, not every epoch: a spell ends when a save works again
        # (another trial tidying frees a few pages before the filler takes them back).
        spells, ended = log.count("could not be saved in"), log.count("checkpoints are saved again")
        assert spells >= 1 and spells - ended in (0, 1), log
        assert "database server" not in log, log
        latest = trial.user_attrs.get("checkpoint")
        if latest is None:  # every save it tried failed
            assert "its latest usable checkpoint: none of its own yet" in log, log
        elif latest["epoch"] > failed["epoch"]:  # a later save worked, and the log says so
            assert spells == ended, log
            assert "checkpoints are saved again" in log, log
        else:  # its record names the last one written whole, from before the fault
            assert latest["epoch"] < failed["epoch"], trial.user_attrs
            assert f"its latest usable checkpoint: epoch {latest['epoch']}" in log, log
    assert not [p for p in folder.rglob("*") if p.name.endswith(".partial")]


def test_a_checkpoint_folder_that_fills_mid_study_fails_no_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with small_disk(tmp_path / "ckpt", "1m") as disk:
        runner = start_cli(*_run(url, disk), cwd=tmp_path)
        victim = _first_saved(url)
        stop = threading.Event()

        def keep_full() -> None:  # a trial that tidies frees a few pages: taken again
            while not stop.is_set():
                _fill(disk)
                stop.wait(0.1)

        filler = threading.Thread(target=keep_full, daemon=True)
        filler.start()
        try:
            _, stderr = runner.communicate(timeout=300)
        finally:
            stop.set()
            filler.join()
        assert runner.returncode == 0, stderr
        _assert_every_trial_complete_and_said_once(
            url, stderr, disk, "No space left on device", victim.number
        )


def test_a_checkpoint_folder_made_read_only_mid_study_fails_no_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with small_disk(tmp_path / "ckpt", "8m") as disk:
        runner = start_cli(*_run(url, disk), cwd=tmp_path)
        victim = _first_saved(url)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        _, stderr = runner.communicate(timeout=300)
        assert runner.returncode == 0, stderr
        _assert_every_trial_complete_and_said_once(
            url, stderr, disk, "Read-only file system", victim.number
        )


def test_an_sqlite_study_whose_checkpoint_folder_is_a_file_trains_on(tmp_path):
    """The folder beside the database cannot be made: each trial trains without checkpoints,
    and no line speaks of a database server."""
    (tmp_path / "study-artifacts").write_text("not a folder")
    done = run_cli(
        "run", "synthetic", "--trials", "2", "--epochs", "2", "--option", "trial_seconds=0.2",
        "--concurrency", "1", "--gpus", "sim:24576", "--storage",
        f"sqlite:///{tmp_path / 'study.db'}", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if HOST_LINE in line]
    assert len(said) == 1 and str(tmp_path / "study-artifacts") in said[0], done.stderr
    study = stored_study(f"sqlite:///{tmp_path / 'study.db'}", "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        assert "checkpoint" not in trial.user_attrs
        assert trial.user_attrs["checkpoint_unsaved"]["epoch"] == 1  # its last save that failed
        log = Path(trial.user_attrs["log_file"]).read_text()
        assert "database server" not in log, log


class _CutShort(io.RawIOBase):
    """A body whose reading stops with a full disk after some bytes, as a write would."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.given >= 3 * 65536:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        buffer[:] = b"x" * len(buffer)
        self.given += len(buffer)
        return len(buffer)


def test_a_write_cut_short_leaves_neither_the_file_nor_a_partial_one(tmp_path):
    store = stored.open_store(str(tmp_path / "ckpt"))
    with pytest.raises(OSError):
        store.write("a", io.BufferedReader(_CutShort()))
    assert list((tmp_path / "ckpt").iterdir()) == []
    store.write("b", io.BytesIO(b"whole"))
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["b"]
    with store.open_reader("b") as reader:
        assert reader.read() == b"whole"
    with pytest.raises(ValueError):
        store.write("../escape", io.BytesIO(b"x"))
