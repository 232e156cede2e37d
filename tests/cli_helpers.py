"""Running the command line as a user would: a real process, its exit status and its output."""

from __future__ import annotations

import os
import subprocess
import sys


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
