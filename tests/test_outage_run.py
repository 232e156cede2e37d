"""`run` rides out a PostgreSQL outage end to end: a restart mid-study, and a stop longer than a
heartbeat interval. Exactly N trials finish, none is left RUNNING, `run` exits 0, and the outage
takes a few lines, not tracebacks. Past --storage-retry-seconds, one line says how long the
database has been gone and how to resume, and resuming finishes the study exactly.

The cluster is the test's own (tests/pg_cluster.py), never the shared server.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from tests.cli_helpers import run_cli, start_cli
from tests.pg_cluster import PgCluster

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Three waves of 4 trials: one finished before the outage, one in flight through it, one after.
TRIALS = 12
RUN = (
    "run", "synthetic", "--trials", str(TRIALS), "--option", "trial_seconds=2", "--epochs", "4",
    "--gpus", "sim:24576", "--concurrency", "4", "--pruner", "none",
)  # fmt: skip


@pytest.fixture(scope="module")
def _one_cluster():
    """One cluster for the module (an initdb and a shutdown each test saved); each test its own
    database in it."""
    with PgCluster.create() as made:
        yield made


@pytest.fixture
def cluster(_one_cluster):
    yield _one_cluster
    # Up again for the next test, where this one failed mid-outage (already up: pg_ctl says so).
    with contextlib.suppress(subprocess.CalledProcessError):
        _one_cluster.start()


def _states(url: str) -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name="synthetic", storage=url).trials]


def _wait_for_complete(url: str, count: int, timeout: float = 120) -> None:
    engine = sa.create_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                with engine.connect() as conn:
                    done = conn.execute(
                        sa.text("SELECT count(*) FROM trials WHERE state = 'COMPLETE'")
                    ).scalar()
                if done >= count:
                    return
            except sa.exc.SQLAlchemyError:
                pass  # the schema is not there yet
            time.sleep(0.5)
    finally:
        engine.dispose()
    raise AssertionError(f"fewer than {count} trials completed in {timeout} s")


def _outage_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "went away" in line or "is back" in line]


def _assert_study_finished_exactly(url: str, done: subprocess.Popen[str], stderr: str) -> None:
    assert done.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    states = _states(url)
    assert states.count(TrialState.COMPLETE) == TRIALS, states
    assert TrialState.RUNNING not in states, states
    lines = _outage_lines(stderr)
    assert 1 <= len(lines) <= 4, lines  # one when it goes, one when it is back, per process


def test_run_rides_out_a_restart_mid_study(cluster):
    """A restart as a minor-version upgrade does it: about 3 s without a server."""
    url = cluster.create_database("restart")
    runner = start_cli(*RUN, "--storage", url)
    _wait_for_complete(url, 4)
    cluster.stop()
    time.sleep(3)
    cluster.start()
    _, stderr = runner.communicate(timeout=600)
    _assert_study_finished_exactly(url, runner, stderr)


def test_run_rides_out_a_stop_longer_than_a_heartbeat_interval(cluster):
    """cli_env's heartbeat is 1 s, its grace period 3 s: the database is away for 8."""
    url = cluster.create_database("stop")
    runner = start_cli(*RUN, "--storage", url)
    _wait_for_complete(url, 4)
    cluster.stop()
    time.sleep(8)
    cluster.start()
    _, stderr = runner.communicate(timeout=600)
    _assert_study_finished_exactly(url, runner, stderr)


def test_past_the_bound_one_line_says_how_to_resume_and_resuming_finishes(cluster):
    url = cluster.create_database("bound")
    runner = start_cli(*RUN, "--storage", url, "--storage-retry-seconds", "6")
    _wait_for_complete(url, 4)
    cluster.stop()
    _, stderr = runner.communicate(timeout=600)
    cluster.start()
    last = stderr.strip().splitlines()[-1]
    assert runner.returncode == 75, stderr
    assert "Traceback" not in stderr, stderr
    assert last.startswith("error: the database (PostgreSQL at 127.0.0.1:") and (
        "has been unreachable for" in last
    ), last
    assert "resume with `python -m orchestrator run synthetic" in last, last
    again = run_cli(*RUN, "--storage", url)
    _assert_study_finished_exactly(url, again, again.stderr + "went away")
