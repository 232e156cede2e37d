"""How trial processes start: forked from a fork server that imported torch once and never
initialised CUDA, or spawned where there is no fork server; either way with the supervisor's
environment of the moment."""

from __future__ import annotations

import os
import sys

import pytest

from orchestrator.errors import UserError
from orchestrator.run.pool.trial_start import (
    PRELOAD,
    START_ENV,
    start_method,
    start_process,
    trial_process_context,
)


def _what_the_process_has(conn) -> None:
    """In the started process, before anything else: what it inherited."""
    already = "torch" in sys.modules
    import torch

    conn.send(
        {
            "torch_preloaded": already,
            "cuda_initialized": torch.cuda.is_initialized(),
            # Set in a process forked from one that had initialised CUDA.
            "bad_fork": torch.cuda._is_in_bad_fork(),
            "marker": os.environ.get("ORCHESTRATOR_TEST_MARKER"),
        }
    )
    conn.close()


def _start_and_hear(context) -> dict:
    ours, theirs = context.Pipe()
    process = start_process(context, _what_the_process_has, theirs)
    theirs.close()
    heard = ours.recv() if ours.poll(120) else {}
    process.join(30)
    return heard


def test_the_fork_server_imported_torch_and_never_initialised_cuda(monkeypatch):
    monkeypatch.delenv(START_ENV, raising=False)
    context = trial_process_context()
    assert context.get_start_method() == "forkserver"
    heard = _start_and_hear(context)
    assert heard["torch_preloaded"], "the process imported torch itself: no preload"
    assert heard["cuda_initialized"] is False and heard["bad_fork"] is False


def test_nothing_the_fork_server_imports_is_about_cuda():
    assert "torch" in PRELOAD and not any("cuda" in name.lower() for name in PRELOAD)


def test_a_trial_process_has_the_environment_its_supervisor_has_when_it_starts(monkeypatch):
    context = trial_process_context()
    _start_and_hear(context)  # the server runs now, with the environment it started with
    monkeypatch.setenv("ORCHESTRATOR_TEST_MARKER", "set after the server started")
    assert _start_and_hear(context)["marker"] == "set after the server started"


def _leave_on_sigterm(conn) -> None:
    """In the started process: exit 7 on SIGTERM (as a trial process leaves after re-queuing)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    conn.send("ready")
    time.sleep(120)


def test_a_sigterm_to_the_whole_job_leaves_the_fork_server_to_report_the_exit(monkeypatch):
    # Slurm signals every process of a job: the fork server too. The exit code of a process
    # forked from it is read through the server, so the server must outlive the signal.
    import signal
    from multiprocessing import forkserver

    monkeypatch.delenv(START_ENV, raising=False)
    context = trial_process_context()
    ours, theirs = context.Pipe()
    process = start_process(context, _leave_on_sigterm, theirs)
    theirs.close()
    assert ours.poll(120) and ours.recv() == "ready"
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGTERM)
    os.kill(process.pid, signal.SIGTERM)
    process.join(30)
    # 255 when the server died and could not say. None was seen once in a whole suite (not
    # reproduced alone): the states say whether the server or the process was still there.
    states = {"server": _state(server), "process": _state(process.pid)}
    assert process.exitcode == 7, states


def _state(pid: int) -> str:
    """A process's state letter (R, S, Z, ...) from /proc, or "gone"."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


@pytest.mark.parametrize(
    ("environ", "available", "method"),
    [
        ({}, ("fork", "spawn", "forkserver"), "forkserver"),
        ({START_ENV: "spawn"}, ("fork", "spawn", "forkserver"), "spawn"),
        ({START_ENV: "Forkserver "}, ("fork", "spawn", "forkserver"), "forkserver"),
        ({}, ("spawn",), "spawn"),  # no fork server here (Windows)
        ({START_ENV: "forkserver"}, ("spawn",), "spawn"),
    ],
)
def test_the_start_method(environ, available, method):
    assert start_method(environ, available) == method


def test_an_unknown_start_method_is_refused_in_one_line():
    with pytest.raises(UserError, match=f"{START_ENV}='fork' must be spawn or forkserver"):
        start_method({START_ENV: "fork"}, ("fork", "spawn", "forkserver"))


def _processes_marked(marker: str) -> list[int]:
    """Processes whose environment carries `marker` (a command and what it started)."""
    from pathlib import Path

    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_run_that_fails_on_its_storage_leaves_no_fork_server_importing(tmp_path):
    """The fork server starts before the storage is opened, to overlap it; a storage that
    refuses the run ends the run in a second, and its server with it, not after importing torch."""
    import subprocess
    import time
    import uuid

    marker = f"ORCHESTRATOR_TEST_MARKER=fork-{uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=", 1)[1]}
    # Its output to a file: a pipe would make this wait for every process holding it, the
    # server included (each test that captured a refused run's output waited seconds so).
    with open(tmp_path / "said.txt", "w") as said:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "run", "synthetic", "--gpus", "none",
             "--storage", "postgresql://alice@127.0.0.1:1/studies"],
            cwd=tmp_path, env=env, stdout=said, stderr=said, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, (tmp_path / "said.txt").read_text()
    time.sleep(0.2)  # the kill is delivered; a server still importing would live for seconds
    assert _processes_marked(marker) == []


_WHAT_A_SERVER_GIVES = """
import sys
from orchestrator.run.pool.trial_start import start_process, trial_process_context

def heard(conn):
    conn.send({name: name in sys.modules for name in ("torch", "alembic.command", "sqlalchemy.orm")})

def ask(uses_torch):
    context = trial_process_context(uses_torch)
    ours, theirs = context.Pipe()
    process = start_process(context, heard, theirs)
    theirs.close()
    answer = ours.recv() if ours.poll(120) else {}
    process.join(30)
    return answer

if __name__ == "__main__":
    print(ask(False))  # the first study's adapter uses no torch
    print(ask(True))  # a later one in the same process does: the server is restarted with it
    print(ask(False))  # and serves the next one without a restart
"""


def test_the_fork_server_leaves_torch_out_for_an_adapter_that_uses_none_and_adds_it_later(
    tmp_path, monkeypatch
):
    """In a process of its own: a fork server is one per process, and this one's has started."""
    import ast
    import subprocess

    monkeypatch.delenv(START_ENV, raising=False)
    script = tmp_path / "server.py"
    script.write_text(_WHAT_A_SERVER_GIVES)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    first, second, third = (ast.literal_eval(line) for line in done.stdout.splitlines())
    assert first == {"torch": False, "alembic.command": True, "sqlalchemy.orm": True}
    assert second["torch"] is True, "a study that trains with torch got a server without it"
    assert third["torch"] is True  # a server with torch serves an adapter that uses none too


_PROBE_ADAPTER = """
import os, sys
from adapters.synthetic import SyntheticAdapter

class Probe(SyntheticAdapter):
    name = "probe"
    uses_torch = {uses_torch}

    def train(self, params, *, epochs, device, options, report):
        with open(os.path.join({folder!r}, f"trial-{{os.getpid()}}.txt"), "a") as seen:
            seen.write(f"{{'torch' in sys.modules}} {{type(device).__name__}} {{device}}\\n")
        return super().train(params, epochs=epochs, device=device, options=options, report=report)

adapter = Probe()
"""


@pytest.mark.parametrize("uses_torch", [False, True])
def test_a_trial_of_an_adapter_that_uses_no_torch_runs_without_importing_it(tmp_path, uses_torch):
    import subprocess

    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "probe_adapter.py").write_text(
        _PROBE_ADAPTER.format(uses_torch=uses_torch, folder=str(seen))
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop(START_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--adapter-path", "probe_adapter:adapter",
         "--trials", "3", "--gpus", "sim:4000", "--storage", f"sqlite:///{tmp_path / 's.db'}",
         "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for path in seen.iterdir() for line in path.read_text().splitlines()]
    assert len(lines) == 3
    expected = "True device cpu" if uses_torch else "False str cpu"
    assert set(lines) == {expected}

    # A `worker` reads the adapter from the study before its fork server starts: the same.
    import dataclasses

    import optuna

    from orchestrator.record.study.spec import load_spec, save_spec

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.load_study(study_name="probe", storage=url)
    save_spec(study, dataclasses.replace(load_spec(study), trials=5))  # two more to run
    for path in seen.iterdir():
        path.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "worker", "--study", "probe", "--gpus", "sim:4000",
         "--storage", url, "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for path in seen.iterdir() for line in path.read_text().splitlines()]
    assert len(lines) == 2
    assert set(lines) == {expected}
