"""`--data` in time order: a price file with a date column is sorted by it (said in one line), a
repeated date is refused with one line and exit 2 before anything is stored, so the held-out
part ("the part no trial saw") is always the latest. Through `run` processes on the forecaster."""

from __future__ import annotations

import datetime
import os
import random
import sqlite3
from pathlib import Path

import pytest

from adapters.envs import load_prices
from orchestrator.errors import UserError
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]
DAY = datetime.date(2020, 1, 1)


def _rows(count: int) -> list[tuple[str, float]]:
    """(date, close) for `count` days in date order; each close a distinct rising price."""
    return [((DAY + datetime.timedelta(days=i)).isoformat(), 100.0 + i) for i in range(count)]


def _csv(path: Path, rows: list[tuple[str, float]], header: str = "Date,Close") -> Path:
    path.write_text(header + "\n" + "".join(f"{date},{close}\n" for date, close in rows))
    return path


def test_rows_out_of_date_order_are_sorted_by_date(tmp_path, caplog):
    rows = _rows(250)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    prices = load_prices(_csv(tmp_path / "shuffled.csv", shuffled))
    assert list(prices) == [close for _, close in rows]
    said = [r.getMessage() for r in caplog.records if "sorted by date" in r.getMessage()]
    assert len(said) == 1 and "not in date order" in said[0], said


def test_rows_in_order_and_files_without_dates_stay_as_they_are(tmp_path, caplog):
    rows = _rows(250)
    assert list(load_prices(_csv(tmp_path / "sorted.csv", rows))) == [c for _, c in rows]
    backwards = [("", close) for _, close in reversed(rows)]
    plain = tmp_path / "plain.csv"
    plain.write_text("close\n" + "".join(f"{close}\n" for _, close in backwards))
    assert list(load_prices(plain)) == [c for _, c in backwards]  # no dates: file order
    assert not [r for r in caplog.records if "sorted" in r.getMessage()]


@pytest.mark.parametrize(
    ("cells", "problem"),
    [
        (["2020-01-02"], "'2020-01-02' appears twice (lines 3 and 251)"),
        (["31/01/2020"], "line 251: date '31/01/2020' is not a date: give ISO dates"),
        (["nan"], "line 251: date 'nan' is not a date"),
    ],
)
def test_a_repeated_or_unreadable_date_is_refused_naming_the_lines(tmp_path, cells, problem):
    rows = _rows(249) + [(cells[0], 500.0)]
    with pytest.raises(UserError) as caught:
        load_prices(_csv(tmp_path / "bad.csv", rows))
    assert problem in str(caught.value), caught.value


def test_timestamps_with_zones_and_epoch_numbers_sort_as_time(tmp_path):
    base = datetime.datetime(2021, 3, 1, 9, 30, tzinfo=datetime.UTC)
    rows = [((base + datetime.timedelta(hours=i)).isoformat(), 10.0 + i) for i in range(200)]
    swapped = [rows[1], rows[0], *rows[2:]]
    assert list(load_prices(_csv(tmp_path / "zones.csv", swapped, "timestamp,close"))) == [
        c for _, c in rows
    ]
    epoch = [(str(1_600_000_000 + 60 * i), 5.0 + i) for i in range(200)]
    assert list(load_prices(_csv(tmp_path / "epoch.csv", epoch[::-1], "time,close"))) == [
        c for _, c in epoch
    ]


def _run_tft(tmp_path: Path, data: Path):
    env = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return run_cli(
        "run", "tft", "--data", str(data), "--trials", "1", "--epochs", "1", "--gpus", "none",
        "--option", "max_window=16", "--option", "max_width=16", "--concurrency", "1",
        "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--log-dir", str(tmp_path / "logs"),
        env=env, cwd=tmp_path,
    )  # fmt: skip


def test_run_refuses_repeated_dates_before_storing_anything(tmp_path):
    rows = _rows(300)
    rows[200] = rows[100]
    ran = _run_tft(tmp_path, _csv(tmp_path / "repeats.csv", rows))
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "'2020-04-10' appears twice (lines 102 and 202)" in lines[0], lines
    assert "Traceback" not in ran.stderr
    db = tmp_path / "study.db"
    if db.exists():  # opened, perhaps, but no study in it
        with sqlite3.connect(db) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            if "studies" in tables:
                assert conn.execute("SELECT count(*) FROM studies").fetchone()[0] == 0


def test_run_sorts_an_unsorted_file_and_says_so_once(tmp_path):
    rows = _rows(300)
    rows[10], rows[250] = rows[250], rows[10]
    ran = _run_tft(tmp_path, _csv(tmp_path / "unsorted.csv", rows))
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "sorted by date" in line]
    assert len(said) == 1 and "unsorted.csv" in said[0], ran.stderr
