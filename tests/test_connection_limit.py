"""A PostgreSQL that takes few connections: through PgBouncer, and straight, with hosts at its limit.

The first test: 40 trial processes on a PostgreSQL that takes 20 connections, through PgBouncer:
nothing fails.

A PostgreSQL and a PgBouncer (transaction mode) of the test's own (tests/pg_cluster.py,
tests/pgbouncer.py). The trial processes are lightweight: each opens its storage as a trial
process does (one connection, heartbeats on), then asks, heartbeats while it "trains", reports
and tells, as the trial runner does, with no torch and no adapter, forked from the test with its
modules already imported: the test is about connections and the budget, and 40 processes
importing torch would not fit this machine's two cores in a test's time. The 40 start at once,
as two hosts of 20 would.

Then two real hosts (`run` and `worker`, 4 trial processes each) straight on a server that takes
6 connections: the study ends on its exact budget, both hosts exit 0, nobody calls the database
unreachable (benchmarks/bench_connection_limit.py runs the same at 3 hosts x 8 on 20). And what
a refused connection is: not an outage, retried without the bound, said once.
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

from benchmarks.bench_connection_limit import run_scenario
from orchestrator.record.budget.claim import ask_within_budget
from orchestrator.record.outages import riding as outage
from orchestrator.record.outages import state as outage_state
from orchestrator.record.outages.errors import FULL, outage_kind
from orchestrator.record.outages.riding import Heartbeat
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.store.storage import create_storage
from orchestrator.record.store.storage_failures import storage_failure
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
    storage = create_storage(StorageLocation.parse(url), heartbeat=True, wait=True)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    Path(f"{go}.{index}").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    while (trial := ask_within_budget(study, StorageLocation.parse(url), BUDGET)) is not None:
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
        made = open_storage(StorageLocation.parse(direct))
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
        # A trial process connects only while it calls (never more than one connection), and
        # PgBouncer's server side stayed within its pool.
        assert 0 < watch.clients <= PROCESSES, (watch.clients, watch.servers)
        assert watch.servers <= POOL_SIZE, (watch.clients, watch.servers)


def _wait_for(ready, processes, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if any(p.exitcode not in (None, 0) for p in processes):
            pytest.fail("a trial process failed before it was ready")
        if time.monotonic() > deadline:
            pytest.fail("the trial processes did not all start")
        time.sleep(0.2)


def test_two_hosts_at_the_server_s_limit_end_on_the_exact_budget():
    outcome = run_scenario(
        hosts=2, slots=4, trials=40, trial_seconds=0.05, max_connections=6, timeout=400
    )
    assert outcome.exit_statuses == [0, 0], outcome.host_lines
    assert outcome.said_unreachable == [False, False], outcome.host_lines
    assert (outcome.finished, outcome.running_left) == (40, 0), outcome
    assert outcome.trials_stored == 40, "no trial re-run: none was failed as lost"
    # Said at most once by each host (whether a host sees the limit depends on timing).
    said = [sum("has no connection free" in line for line in lines) for lines in outcome.host_lines]
    assert max(said) <= 1, outcome.host_lines
    for lines in outcome.host_lines:
        assert not any("Traceback" in line for line in lines), lines


def _too_many_clients() -> sa.exc.OperationalError:
    import psycopg2

    refused = psycopg2.OperationalError(
        'connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many '
        "clients already"
    )
    return sa.exc.OperationalError("connect", {}, refused)


def test_a_refused_connection_is_no_outage_and_is_said_once(caplog):
    now, pauses = [0.0], []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    state = outage_state.Outages(clock=lambda: now[0], sleep=sleep)
    outage_state.note_connections(max_connections=20, host_connections=9, outages=state)
    refusals = iter(range(400))

    def call() -> str:
        if next(refusals) < 399:
            raise _too_many_clients()
        return "done"

    assert outage_kind(_too_many_clients()) == FULL
    with caplog.at_level("WARNING", logger="orchestrator.record.outages.riding"):
        # A bound of 0 would give up on an outage at once: a full server is waited for.
        assert outage.ride_out(call, what="ask for a trial", bound=0, outages=state) == "done"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "max_connections=20" in lines[0] and "up to 9" in lines[0]
    assert "PgBouncer" in lines[0] and "too many clients" in lines[0]
    assert max(pauses) <= outage.FULL_LONGEST_PAUSE_S, "knocks again soon"
    assert len(set(pauses)) > len(pauses) // 2, "at random moments"
    assert state.began_at is None and state.outages == 0, "no outage began"
    assert not state.quiet_for(10), "no trial is failed as lost while the server refuses"
    failure = storage_failure(_too_many_clients(), outages=state)
    assert failure is not None and "no connection free" in str(failure)
