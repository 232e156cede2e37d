"""`optimize` shows its progress by default where someone watches (stderr a terminal) and is
quiet elsewhere, as `study.optimize` is: a real script on a pseudo-terminal, then on pipes."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

from orchestrator.api import quiet_by_default

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import orchestrator
from tests.api_objective import objective

orchestrator.optimize(objective, n_trials=2, storage={url!r}, gpus="sim:24576",
                      memory_model=(200.0, 0.5), batch_sizes=(64, 4096), pruner="none")
print("script: done")
"""


def _command(tmp_path: Path, name: str) -> list[str]:
    url = f"sqlite:///{tmp_path / name}.db"
    return [sys.executable, "-c", SCRIPT.format(url=url)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "120"}


def _on_a_terminal(command: list[str]) -> tuple[int, str]:
    """Run `command` with its stdin, stdout and stderr on a pseudo-terminal; its exit status and
    everything it wrote there."""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        command, stdin=follower, stdout=follower, stderr=follower, cwd=REPO, env=_env()
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its side: all has been read
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return child.wait(timeout=300), out.decode(errors="replace")


def test_progress_is_shown_on_a_terminal_by_default(tmp_path):
    code, seen = _on_a_terminal(_command(tmp_path, "tty"))
    assert code == 0, seen[-3000:]
    assert "script: done" in seen
    assert "tests.api_objective:objective" in seen and "2/2" in seen  # the live panel
    assert "done: 2/2 trials" in seen


def test_no_progress_off_a_terminal_by_default(tmp_path):
    done = subprocess.run(
        _command(tmp_path, "pipe"), cwd=REPO, env=_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "script: done"
    assert "2/2" not in done.stderr and "running" not in done.stderr, done.stderr


def test_what_quiet_is_when_left_out():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert quiet_by_default(None, Terminal()) is False
    assert quiet_by_default(None, io.StringIO()) is True
    closed = io.StringIO()
    closed.close()  # its isatty raises
    assert quiet_by_default(None, closed) is True
    assert quiet_by_default(None, object()) is True  # no isatty at all
    assert quiet_by_default(True, Terminal()) is True  # said, it is kept
    assert quiet_by_default(False, io.StringIO()) is False
