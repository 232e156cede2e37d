"""A PostgreSQL restart behind PgBouncer: healthy trials are not failed as lost, and it is said.

Behind PgBouncer a restart is no error to anyone: PgBouncer holds every call until the server is
back, so no process sees an outage. The heartbeats sent meanwhile wait too; the pool's look for
lost trials, let through first, would find healthy trials silent past the grace period, fail
them and re-run them, and their processes' results would then be dropped as "its process woke".
The look instead gives the heartbeats the grace period from the server's start.

A real `run` (simulated GPU, trials of 4 s, heartbeat 1 s, grace 3 s) through a PgBouncer of the
test's own; the server is stopped for longer than the grace period while trials train.
"""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from tests.cli_helpers import cli_env
from tests.pg_cluster import PgCluster
from tests.pgbouncer import PgBouncer

TRIALS = 4


def _running(url: str) -> int:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = "SELECT count(*) FROM trials WHERE state = 'RUNNING'"
            return int(conn.execute(sa.text(query)).scalar())
    except sa.exc.SQLAlchemyError:
        return 0  # no tables yet
    finally:
        engine.dispose()


def test_a_restart_behind_pgbouncer_re_runs_nothing_healthy(tmp_path):
    with PgCluster.create() as cluster, PgBouncer.start(cluster.port, pool_size=4) as bouncer:
        direct = cluster.create_database("restart")
        url = bouncer.database_url("restart")
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "synthetic",
                "--storage",
                url,
                "--trials",
                str(TRIALS),
                "--option",
                "trial_seconds=4",
                "--epochs",
                "2",
                "--gpus",
                "sim:24576",
                "--concurrency",
                "2",
                "--pruner",
                "none",
            ],  # fmt: skip
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 240
        while _running(direct) < 2:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no two trials started"
            time.sleep(0.2)
        cluster.stop()
        time.sleep(5)  # past the grace period of 3 s
        cluster.start()
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        assert "woke" not in err, err
        # Said once: as a restart, or as an outage when a call of the host's was on the server
        # as it stopped (PgBouncer then passes the closed connection on).
        said = [line for line in err.splitlines() if "restarted" in line or "went away" in line]
        assert len(said) == 1, err
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        trials = optuna.load_study(study_name="synthetic", storage=direct).trials
        assert [t.state for t in trials] == [TrialState.COMPLETE] * TRIALS, "nothing re-run"
