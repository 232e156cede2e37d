"""40 trial processes on a PostgreSQL that takes 20 connections, through PgBouncer: nothing fails.

A PostgreSQL and a PgBouncer (transaction mode) of the test's own (tests/pg_cluster.py,
tests/pgbouncer.py). The trial processes are lightweight: each opens its storage as a trial
process does (one connection, heartbeats on), then asks, heartbeats while it "trains", reports
and tells, as the trial runner does, with no torch and no adapter, forked from the test with its
modules already imported: the test is about connections and the budget, and 40 processes
importing torch would not fit this machine's two cores in a test's time. The 40 start at once,
as two hosts of 20 would; every one of them holds its connection to PgBouncer from start to end.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.record.budget_claim import ask_within_budget
from orchestrator.record.migrate import open_storage
from orchestrator.record.outage import Heartbeat
from orchestrator.record.storage import create_storage
from tests.pg_cluster import PgCluster
from tests.pgbouncer import PgBouncer
from tests.test_pgbouncer import PoolWatch

SERVER_CONNECTIONS = 20
POOL_SIZE = 12  # PgBouncer's server connections for the study's database (the rest: the test's)
PROCESSES = 40
BUDGET = 120
STUDY = "limit"


@contextlib.contextmanager
def _server_and_bouncer() -> Iterator[tuple[PgCluster, PgBouncer]]:
    with PgCluster.create() as cluster:
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nmax_connections = {SERVER_CONNECTIONS}\n")
        cluster.restart()
        with PgBouncer.start(cluster.port, pool_size=POOL_SIZE) as bouncer:
            yield cluster, bouncer


def _one(url: str, sql: str) -> object:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql)).scalar()
    finally:
        engine.dispose()


def trial_process(url: str, go: str, index: int) -> None:
    """Ask, train for a moment with a heartbeat and reports, tell; until the budget is used."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = create_storage(url, heartbeat=True, wait=True)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    Path(f"{go}.{index}").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    while (trial := ask_within_budget(study, url, BUDGET)) is not None:
        x = trial.suggest_float("x", 0, 1)
        with Heartbeat(storage, trial._trial_id, 0.05):  # beside the main thread, one connection
            for step in range(3):
                time.sleep(0.05)
                trial.report(x * step, step)
        study.tell(trial, x)


def test_forty_trial_processes_on_twenty_server_connections(tmp_path):
    with _server_and_bouncer() as (cluster, bouncer):
        direct = cluster.create_database("limit")
        assert _one(direct, "SHOW max_connections") == str(SERVER_CONNECTIONS)
        made = open_storage(direct)
        optuna.create_study(study_name=STUDY, storage=made)
        made.engine.dispose()  # no pooled connection of this process goes into the forks
        url = bouncer.database_url("limit")
        go = str(tmp_path / "go")
        context = multiprocessing.get_context("fork")
        processes = [
            context.Process(target=trial_process, args=(url, go, i)) for i in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        _wait_for(lambda: len(list(tmp_path.glob("go.*"))) == PROCESSES, processes)
        watch = PoolWatch(bouncer, "limit")
        watch.start()
        Path(go).touch()
        for process in processes:
            process.join(timeout=400)
        watch.stop.set()
        watch.join()
        assert [p.exitcode for p in processes] == [0] * PROCESSES
        trials = optuna.load_study(study_name=STUDY, storage=direct).trials
        assert [t.number for t in trials] == list(range(BUDGET))
        assert all(t.state == TrialState.COMPLETE for t in trials), "nothing RUNNING, none failed"
        assert _one(direct, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
        # Every process held its connection at once, on at most the pool's server connections.
        assert watch.clients >= PROCESSES > SERVER_CONNECTIONS, (watch.clients, watch.servers)
        assert watch.servers <= POOL_SIZE, (watch.clients, watch.servers)


def _wait_for(ready, processes, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if any(p.exitcode not in (None, 0) for p in processes):
            pytest.fail("a trial process failed before it was ready")
        if time.monotonic() > deadline:
            pytest.fail("the trial processes did not all start")
        time.sleep(0.2)
