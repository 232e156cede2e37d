"""A throwaway PostgreSQL cluster of a test's own, to stop and restart: never the shared server.

    with PgCluster.create() as cluster:
        url = cluster.url            # postgresql+psycopg2://postgres@127.0.0.1:PORT/postgres
        cluster.restart()            # pg_ctl restart -m fast: a few seconds without a server
        cluster.stop(); cluster.start()

`initdb` runs as the `postgres` user when the tests run as root (PostgreSQL refuses root), into a
temporary folder of its own, on a free port, with fsync off (a test's data need not survive a
power cut). Where PostgreSQL's binaries are missing the fixture skips, or fails under CI=true.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    for candidate in [
        os.environ.get("PG_BINDIR", ""),
        *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True),
        str(Path(shutil.which("initdb") or "/nonexistent").parent),
    ]:
        if candidate and (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgCluster:
    def __init__(self, bindir: Path, folder: Path, port: int) -> None:
        self.bindir, self.folder, self.port = bindir, folder, port
        self.data = folder / "data"
        self.log = folder / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[PgCluster]:
        bindir = _bindir()
        if bindir is None:
            if os.environ.get("CI") == "true":
                pytest.fail("CI=true but PostgreSQL's initdb is not installed")
            pytest.skip("PostgreSQL's initdb is not installed: the outage tests need a cluster")
        # Not under pytest's tmp_path: its parents are private to root, and the server runs as
        # the postgres user.
        folder = Path(tempfile.mkdtemp(prefix="orchestrator-pg-"))
        cluster = cls(bindir, folder, _free_port())
        try:
            cluster._initdb()
            cluster.start()
            yield cluster
        finally:
            with contextlib.suppress(Exception):
                cluster._pg_ctl("stop", "-m", "immediate")
            shutil.rmtree(folder, ignore_errors=True)

    def _as_owner(self, *command: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *command]
        return list(command)

    def _initdb(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        subprocess.run(
            self._as_owner(
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        subprocess.run(
            self._as_owner(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                action,
                *extra,
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        """A fast shutdown: clients are disconnected (admin shutdown), as in an upgrade."""
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def create_database(self, name: str) -> str:
        import sqlalchemy as sa

        engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.database_url(name)

    def wait_until_up(self, timeout: float = 30) -> None:
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres").close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
