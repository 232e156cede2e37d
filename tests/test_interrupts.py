"""Ctrl-C and SIGTERM while `run` starts up: one line, no traceback, exit 130 or 143, and
nothing stored; SIGTERM while trials run: they are re-queued and the run exits 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.cli_helpers import cli_env, start_cli
from tests.waiting import patient, stored_study, wait_for

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("sig", "status", "line"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated"),
])  # fmt: skip
def test_a_stop_while_the_adapter_imports_is_one_line(tmp_path, sig, status, line):
    marker = tmp_path / "marker"
    env = cli_env(
        SLOW_IMPORT_MARKER=str(marker),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    process = _start_as_typed_at_a_terminal(
        "run", "--adapter-path", "tests.slow_import_adapter:adapter", "--trials", "2",
        "--gpus", "sim:24576", cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        wait_for(marker.exists, "the adapter's import", every=0.05)
        os.killpg(process.pid, sig)  # as a terminal's Ctrl-C reaches the whole group
        out, err = process.communicate(timeout=patient(120))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == status, err
    assert err == f"{line}\n"
    assert out == ""
    assert not (tmp_path / "orchestrator.db").exists() or not optuna.get_all_study_summaries(
        f"sqlite:///{tmp_path / 'orchestrator.db'}"
    )


def _start_as_typed_at_a_terminal(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """The command with Ctrl-C at its default, as a shell starts a command typed at a terminal.

    A shell without job control starts a background job (`pytest ... &` in a script, beside
    other work) with SIGINT ignored, and every process below inherits that: Python then never
    raises KeyboardInterrupt, and the command slept on in the adapter's import for its 120 s
    (seen as TimeoutExpired only when the suite ran in the background)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,  # the test stops the whole group, as a terminal's Ctrl-C does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_sigterm_while_trials_run_re_queues_them_and_exits_143(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    process = start_cli(
        "run", "synthetic", "--trials", "4", "--gpus", "sim:24576", "--storage", url,
        "--option", "trial_seconds=30", "--grace", "0", cwd=tmp_path,
    )  # fmt: skip
    try:

        def running() -> bool:
            try:
                study = stored_study(url, "synthetic")
            except KeyError:  # not created yet
                return False
            return any(t.state == optuna.trial.TrialState.RUNNING for t in study.trials)

        wait_for(running, "the trial to run", every=0.05)
        process.send_signal(signal.SIGTERM)  # the run alone, as a service manager stops it
        out, err = process.communicate(timeout=patient(120))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143, err
    assert "Traceback" not in err
    study = optuna.load_study(study_name="synthetic", storage=url)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
