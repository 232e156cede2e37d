"""A result is never thrown away: a trial that finished training while the database stayed away
past --storage-retry-seconds keeps its outcome in the spool beside the trial logs, and the next
`run` on the host stores it before asking for a new trial (not trained again). The outage takes
one line when it begins, with time and level, however many trial processes meet it, and the
exit-75 line's resume command, pasted into a shell as shown, resumes (its URL's password is read
from $ORCHESTRATOR_STORAGE, never shown). Real processes, on a throwaway PostgreSQL cluster
stopped for longer than the bound."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.record.spool import spool
from tests.cli_helpers import cli_env, start_cli
from tests.pg_cluster import PgCluster

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "hunter2-pw"


def _env() -> dict[str, str]:
    return cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_a_trial_finished_during_a_long_outage_is_stored_at_the_next_start(tmp_path):
    marker, release, logs = tmp_path / "marker", tmp_path / "release", tmp_path / "logs"
    with PgCluster.create() as cluster:
        url = cluster.create_database("spool").replace("postgres@", f"postgres:{PASSWORD}@")
        run = (
            "run", "--adapter-path", "tests.misbehaving_adapter:adapter", "--study", "kept",
            "--trials", "2", "--epochs", "2", "--pruner", "none", "--concurrency", "1",
            "--gpus", "none", "--storage", url, "--log-dir", str(logs),
            "--option", f"marker={marker}", "--option", "behave=wait",
            "--option", f"release={release}",
        )  # fmt: skip
        first = start_cli(*run, "--storage-retry-seconds", "8", env=_env())
        deadline = time.monotonic() + 240
        while not Path(f"{marker}.0").exists():  # trial 0 trains: stop the database, then
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.1)
        cluster.stop()
        release.touch()  # ... let it finish training while the database is away
        _, stderr = first.communicate(timeout=300)
        assert first.returncode == 75, stderr
        assert "Traceback" not in stderr and PASSWORD not in stderr, stderr
        went = [line for line in stderr.splitlines() if "went away" in line]
        assert len(went) == 1 and re.match(r"\d\d:\d\d:\d\d WARNING the database", went[0]), went
        resume = re.search(r"resume with `([^`]+)`", stderr.strip().splitlines()[-1])
        assert resume and '--storage "$ORCHESTRATOR_STORAGE"' in resume[1], stderr
        (kept,) = spool.kept_in(spool.spool_dir(logs, "kept"))
        assert kept.number == 0 and kept.state == "COMPLETE" and len(kept.reports) == 2

        cluster.start()
        again = subprocess.run(  # the command as shown, in a shell, the URL in the environment
            ["bash", "-c", resume[1].replace("python", sys.executable, 1)],
            env={**_env(), "ORCHESTRATOR_STORAGE": url},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 0, again.stderr
        assert "trial 0: its result (COMPLETE), kept while the database was away" in again.stderr
        trials = sorted(
            optuna.load_study(study_name="kept", storage=url).trials, key=lambda t: t.number
        )
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[0].value == pytest.approx(kept.values[0])
    assert trials[0].intermediate_values == {0: kept.values[0], 1: kept.values[0]}
    assert not any(t.user_attrs.get("retry_of") == 0 for t in trials)  # not trained again
    assert spool.kept_in(spool.spool_dir(logs, "kept")) == []
