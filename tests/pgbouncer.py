"""A PgBouncer of a test's own, in transaction mode, in front of a test's own PostgreSQL.

    with PgCluster.create() as cluster, PgBouncer.start(cluster.port, pool_size=8) as bouncer:
        url = bouncer.database_url("studies")   # postgresql+psycopg2://postgres@127.0.0.1:PORT/studies

Debian's `pgbouncer` package (`apt-get install -y --no-install-recommends pgbouncer`), run as the
`postgres` user when the tests run as root (PgBouncer refuses root), on a free port, trusting
every client as the cluster does. Transaction pooling is the mode that multiplexes many client
connections onto few server ones, and the one that breaks session state: the mode to test.
Where the binary is missing the fixture skips with the reason, or fails under CI=true.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PGBOUNCER = "/usr/sbin/pgbouncer"


def _binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return PGBOUNCER if Path(PGBOUNCER).is_file() else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    def __init__(self, folder: Path, port: int, process: subprocess.Popen[bytes]) -> None:
        self.folder, self.port, self.process = folder, port, process
        self.log = folder / "pgbouncer.log"

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    @classmethod
    @contextlib.contextmanager
    def start(cls, server_port: int, *, pool_size: int) -> Iterator[PgBouncer]:
        binary = _binary()
        if binary is None:
            if os.environ.get("CI") == "true":
                pytest.fail("CI=true but pgbouncer is not installed")
            pytest.skip("pgbouncer is not installed (apt-get install -y pgbouncer)")
        folder = Path(tempfile.mkdtemp(prefix="orchestrator-pgbouncer-"))
        port = _free_port()
        config = _write_config(folder, port, server_port, pool_size)
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", binary, str(config)]
        else:
            command = [binary, str(config)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        bouncer = cls(folder, port, process)
        try:
            bouncer._wait_until_up()
            yield bouncer
        finally:
            # PgBouncer's own pid from its pidfile: as root the process started is runuser, which
            # does not pass SIGINT on, and a PgBouncer left behind outlives the test for good.
            _stop_pid(_read_pid(folder / "pgbouncer.pid"))
            process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            shutil.rmtree(folder, ignore_errors=True)

    def _wait_until_up(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: {log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start listening")
            time.sleep(0.1)

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        """A connection to PgBouncer's admin console, held for many `SHOW` commands."""
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="pgbouncer"
        )
        try:
            conn.autocommit = True
            yield conn
        finally:
            conn.close()

    def pools(self, admin: Any = None) -> list[dict[str, object]]:
        """PgBouncer's `SHOW POOLS`: per database, its clients (cl_*) and server connections (sv_*)."""
        if admin is None:
            with self.admin() as conn:
                return self.pools(conn)
        with admin.cursor() as cursor:
            cursor.execute("SHOW POOLS")
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _write_config(folder: Path, port: int, server_port: int, pool_size: int) -> Path:
    users = folder / "userlist.txt"
    users.write_text('"postgres" ""\n')
    config = folder / "pgbouncer.ini"
    config.write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host=127.0.0.1 port={server_port}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                "admin_users = postgres",
                f"auth_file = {users}",
                "pool_mode = transaction",
                f"default_pool_size = {pool_size}",
                # The tests' databases share one server of few connections: a database's idle
                # server connections go after a second, or one test's idle pool would starve
                # the next test's database of connections.
                "server_idle_timeout = 1",
                "max_client_conn = 500",
                f"logfile = {folder / 'pgbouncer.log'}",
                f"pidfile = {folder / 'pgbouncer.pid'}",
                "",
            ]
        )
    )
    return config


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pid(pid: int | None, timeout: float = 10) -> None:
    """SIGINT (PgBouncer's immediate shutdown) to `pid`, SIGKILL if it is still there after
    `timeout` seconds."""
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    try:
        os.kill(pid, signal.SIGINT)
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
