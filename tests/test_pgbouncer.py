"""Through PgBouncer in transaction mode, with fewer server connections than trial processes.

A PostgreSQL and a PgBouncer of the tests' own (tests/pg_cluster.py, tests/pgbouncer.py): the
server's `max_connections` is low on purpose, and every process of the study (the `run` and
`worker` commands and their trial processes) talks to PgBouncer, never to the server. Each trial
process imports torch (~250 MB and a second of CPU each), so the crowd here is 10 trial
processes on a server that takes 5 connections: the ratio of the 40-on-20 case, on a 2-core
machine shared with other work. tests/test_connection_limit.py runs 40 lightweight ones on a
server of 20.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.pg_cluster import PgCluster
from tests.pgbouncer import PgBouncer
from tests.waiting import wait_for

SERVER_CONNECTIONS = 5
POOL_SIZE = 4  # PgBouncer's server connections for the study's database (the rest: the test's own)
WORKERS = 2
SLOTS = 5  # per worker: 10 trial processes in all
DATABASES = ("exact", "many")


@contextlib.contextmanager
def _server_and_bouncer() -> Iterator[tuple[PgCluster, PgBouncer]]:
    with PgCluster.create() as cluster:
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nmax_connections = {SERVER_CONNECTIONS}\n")
        cluster.restart()
        # Created before PgBouncer holds any server connection: once a test's study has run, its
        # pool keeps up to POOL_SIZE of the server's few connections for a second or more.
        for name in DATABASES:
            cluster.create_database(name)
        with PgBouncer.start(cluster.port, pool_size=POOL_SIZE) as bouncer:
            yield cluster, bouncer


@pytest.fixture(scope="module")
def crowd() -> Iterator[tuple[PgCluster, PgBouncer]]:
    with _server_and_bouncer() as both:
        yield both


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args, "--quiet"]


def _env() -> dict[str, str]:
    return dict(os.environ)


def _states_and_locks(url: str, study: str) -> tuple[dict[str, int], int]:
    """The study's trials by state, and the advisory locks held on the server, read on one
    direct connection. Retried while the server is full: right after a run, PgBouncer's idle
    server connections and the run's exiting backends can hold every slot for a moment."""
    return wait_for(
        lambda: _read_states_and_locks(url, study),
        "a free server connection",
        timeout=30,
        tolerate=(sa.exc.OperationalError,),
    )


def _read_states_and_locks(url: str, study: str) -> tuple[dict[str, int], int]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT t.state, count(*) FROM trials t JOIN studies s USING (study_id) "
                    "WHERE s.study_name = :name GROUP BY t.state"
                ),
                {"name": study},
            ).all()
            query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            locks = int(conn.execute(sa.text(query)).scalar())
    finally:
        engine.dispose()
    return {str(state): int(n) for state, n in rows}, locks


class PoolWatch(threading.Thread):
    """The most clients and server connections PgBouncer had at once for one database.

    A trial process holds a connection only while it talks to the study (none while it
    trains), so clients crowd in bursts, when trials start and end together: the watch keeps
    one admin connection and looks every 20 ms so that a burst is seen."""

    def __init__(self, bouncer: PgBouncer, database: str) -> None:
        super().__init__(daemon=True)
        self.bouncer, self.database = bouncer, database
        self.stop = threading.Event()
        self.clients = self.servers = 0

    def run(self) -> None:
        with self.bouncer.admin() as admin:
            while not self.stop.wait(0.02):
                for pool in self.bouncer.pools(admin):
                    if pool["database"] != self.database:
                        continue
                    clients = sum(
                        int(v) for k, v in pool.items() if k in ("cl_active", "cl_waiting")
                    )
                    servers = sum(int(v) for k, v in pool.items() if str(k).startswith("sv_"))
                    self.clients = max(self.clients, clients)
                    self.servers = max(self.servers, servers)


def test_a_study_through_pgbouncer_has_an_exact_budget(crowd):
    cluster, bouncer = crowd
    url = bouncer.database_url("exact")
    run = subprocess.run(
        _command("run", "synthetic", "--storage", url, "--trials", "6", "--gpus", "sim:4000")
        + ["--option", "trial_seconds=0.2", "--epochs", "2", "--concurrency", "3"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    states, locks = _states_and_locks(cluster.database_url("exact"), "synthetic")
    assert sum(states.values()) == 6, states
    assert states.get("COMPLETE", 0) + states.get("PRUNED", 0) == 6, states
    assert locks == 0, "a lock outlived its section"


def test_more_trial_processes_than_server_connections_and_nothing_fails(crowd):
    cluster, bouncer = crowd
    url = bouncer.database_url("many")
    budget = 2 * WORKERS * SLOTS
    common = ["--storage", url, "--gpus", "sim:24000", "--concurrency", str(SLOTS)]
    common += ["--recycle-after", "1000"]
    first = subprocess.Popen(
        _command("run", "synthetic", "--trials", str(budget), *common)
        + ["--option", "trial_seconds=1", "--option", "overhead_mb=50", "--epochs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    stored = lambda: _study_exists(cluster.database_url("many"))  # noqa: E731
    wait_for(stored, "the study", every=0.5, tolerate=(sa.exc.SQLAlchemyError,))
    others = [
        subprocess.Popen(
            _command("worker", "--study", "synthetic", *common),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for _ in range(WORKERS - 1)
    ]
    alive = PoolWatch(bouncer, "many")
    alive.start()
    outputs = [process.communicate(timeout=540) for process in [first, *others]]
    alive.stop.set()
    alive.join()
    for process, (_, err) in zip([first, *others], outputs, strict=True):
        assert process.returncode == 0, err[-2000:]
        assert "too many clients" not in err, err[-2000:]
    states, locks = _states_and_locks(cluster.database_url("many"), "synthetic")
    assert sum(states.values()) == budget, states
    assert states.get("COMPLETE", 0) + states.get("PRUNED", 0) == budget, states
    # More processes held a connection at once than the server takes, on at most the pool's.
    print(f"most at once: {alive.clients} clients on {alive.servers} server connections")
    assert alive.clients > SERVER_CONNECTIONS, (alive.clients, alive.servers)
    assert alive.servers <= POOL_SIZE, (alive.clients, alive.servers)
    assert locks == 0, "a lock outlived its section"


def _study_exists(url: str) -> bool:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = "SELECT count(*) FROM studies WHERE study_name = 'synthetic'"
            return bool(conn.execute(sa.text(query)).scalar())
    finally:
        engine.dispose()
