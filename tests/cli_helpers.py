"""Running the command line as a user would: a real process, its exit status and its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ORCHESTRATOR_STORAGE", None)
    env.update(
        {
            "ORCHESTRATOR_HEARTBEAT_INTERVAL": "1",
            "ORCHESTRATOR_GRACE_PERIOD": "3",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


def run_cli(*args: str, cwd=None, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=env or cli_env(),
    )


def start_cli(*args: str, cwd=None, env=None) -> subprocess.Popen:
    """Start in a session of its own, so the test can kill the worker and every trial process."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env or cli_env(),
        start_new_session=True,
    )


def freeze(pid: int) -> None:
    """SIGSTOP `pid` at a moment it holds no lock that others wait for: no write lock on an
    SQLite file (a write transaction: a heartbeat's, each second) and no file lock (the budget's,
    the simulated GPU ledger's). A process frozen holding SQLite's one writer lock stops every
    writer of the file until it wakes, its host's look for lost trials among them: that is
    SQLite's nature, not what a test that freezes a trial is about. The locks an idle process
    keeps are shared ones."""
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        # A lock held: "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("1: -> ..." waits).
        held = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
        held = [f for f in held if f[1] != "->" and f[4] == str(pid)]
        if not any(f[1] == "FLOCK" or f[3] == "WRITE" for f in held):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"process {pid} held a lock at each of 200 tries to freeze it")
