"""Each kind of bad input (tests/bad_input_cases.py) gets one line, exit 2, and changes nothing.

The cases run through `main()` in a folder holding a stored study, as its default storage. The
line each one gets must also be the one docs/reliability.md shows for it.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.planning.workloads import WORKLOADS_ENV
from orchestrator.record.outages.riding import RETRY_ENV
from tests.bad_input_cases import CASES, row
from tests.cli_helpers import cli_env

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
STUDY_DB = "orchestrator.db"


def make_study_folder(folder: str | os.PathLike[str]) -> None:
    """A folder as a user has it after a first run: a study of two trials, and a price file."""
    folder = Path(folder)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "synthetic", "--trials", "2",
         "--option", "trial_seconds=0.1", "--epochs", "1", "--gpus", "sim:24576", "-q"],
        capture_output=True, text=True, cwd=folder, env=cli_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    make_study_folder_files(folder)


def make_study_folder_files(folder: str | os.PathLike[str]) -> None:
    """The study folder's files other than its database: prices, and what users mistype."""
    folder = Path(folder)
    (folder / "prices").mkdir()
    (folder / "prices" / "close.csv").write_text("close\n" + "\n".join(["1.0"] * 300) + "\n")
    # Dated prices a user exported by hand: one date twice, and one European date among ISO ones.
    days = [
        (datetime.date(2020, 1, 1) + datetime.timedelta(days=i)).isoformat() for i in range(300)
    ]
    twice, european = list(days), list(days)
    twice[200] = twice[100]  # 2020-04-10, on lines 102 and 202
    european[250] = "31/01/2020"  # line 252
    for name, dates in (("prices.csv", twice), ("eu.csv", european)):
        rows = "".join(f"{date},{100.0 + i}\n" for i, date in enumerate(dates))
        (folder / name).write_text("Date,Close\n" + rows)
    # What a careless user points flags at: binary garbage as a config, a text file and a
    # folder as a database.
    (folder / "garbage.toml").write_bytes(bytes(range(256)) * 4)
    (folder / "notadb.db").write_text("not a database\n")
    (folder / "dirdb.db").mkdir()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("study")
    make_study_folder(folder)
    return folder


def _dump(path: Path) -> list[str]:
    """The database's content, WAL included: what "nothing stored changed" compares."""
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def _files(folder: Path) -> set[str]:
    # SQLite's companions of the study's file come and go as it is opened; they hold nothing new.
    companions = {f"{STUDY_DB}-wal", f"{STUDY_DB}-shm", f"{STUDY_DB}.lock"}
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.name not in companions}


@pytest.fixture
def isolated_environment(monkeypatch):
    # `run` starts a spare trial process before it opens the storage; in this one test process
    # each failing run would leave one until the end (real processes: bad_input_cases.py).
    monkeypatch.setattr("orchestrator.run.pool.processes.prestart", lambda count=1, **_: [])
    # Flags that reach trial processes through the environment must not leak between cases.
    for name in (RETRY_ENV, WORKLOADS_ENV, "ORCHESTRATOR_STORAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCHESTRATOR_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("ORCHESTRATOR_GRACE_PERIOD", "3")


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_changes(
    case, template, tmp_path, monkeypatch, capsys, isolated_environment
):
    folder = tmp_path / "study"
    shutil.copytree(template, folder)
    before, files = _dump(folder / STUDY_DB), _files(folder)
    monkeypatch.chdir(folder)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)

    code = main(list(case.argv))

    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    line = err.strip()
    assert line.startswith("error: ") and case.expect in line, line
    assert "Traceback" not in err and "s3cret" not in err
    assert _dump(folder / STUDY_DB) == before, "the stored study changed"
    assert _files(folder) == files, "a file was made"
    assert row(case, line) in DOCS.read_text(), (
        "docs/reliability.md does not show this line: run "
        "`python tests/bad_input_cases.py --write docs/reliability.md`"
    )


def test_there_are_at_least_forty_kinds():
    assert len({case.kind for case in CASES}) == len(CASES) >= 40


# A bad --gpus or --option, or a manifest, creates no database. (A model that fits no GPU is
# known only from the study's plan, so that case opens the stored study first.)
REFUSED_BEFORE_ANY_DATABASE = [
    case
    for case in CASES
    if case.fresh
    or (
        ("--gpus" in case.argv or "--option" in case.argv or case.argv[:1] == ("manifests",))
        and "sim:100" not in case.argv
    )
]


@pytest.mark.parametrize(
    "case", REFUSED_BEFORE_ANY_DATABASE, ids=[c.kind for c in REFUSED_BEFORE_ANY_DATABASE]
)
def test_refused_before_a_database_is_created(
    case, tmp_path, monkeypatch, capsys, isolated_environment
):
    """In an empty folder, nothing is created: no database, no lock file (the README's promise).
    What a case names (a file in the environment) is put there first, as in the study's folder."""
    make_study_folder_files(tmp_path)
    files = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    assert main(list(case.argv)) == 2
    assert case.expect in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == files
