"""Objectives that misbehave, run as a user runs them (real trial processes, --adapter-path and
the Python API): NaN, sys.exit, inf, a trial that hangs past --trial-timeout, a trial process
frozen past its heartbeat's grace. Each ends in one line, nothing left RUNNING, no traceback."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import optuna
from optuna.trial import TrialState

import orchestrator
from orchestrator.record.trials.best import best_of_study, pick_best
from tests.cli_helpers import cli_env, freeze, run_cli, start_cli
from tests.waiting import stored_study, wait_for

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = "tests.misbehaving_adapter:adapter"


def _flags(storage: str, marker: Path, *options: str, trials: int = 2) -> list[str]:
    flags = ["run", "--adapter-path", ADAPTER, "--study", "odd", "--trials", str(trials)]
    flags += ["--epochs", "1", "--pruner", "none", "--concurrency", "1", "--gpus", "none"]
    flags += ["--storage", storage, "--option", f"marker={marker}"]
    for option in options:
        flags += ["--option", option]
    return flags


def _env() -> dict[str, str]:
    return cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _run(storage: str, marker: Path, *options: str, extra: tuple[str, ...] = (), trials: int = 2):
    flags = _flags(storage, marker, *options, trials=trials)
    done = run_cli(*flags, *extra, env=_env(), timeout=400)
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="odd", storage=storage)
    return sorted(study.trials, key=lambda t: t.number), done.stderr


def test_nan_and_sys_exit_fail_in_one_line_inf_completes_with_one_warning(sqlite_url, tmp_path):
    trials, stderr = _run(sqlite_url, tmp_path / "marker", "behave=nan,exit,-inf", trials=4)
    nan, exited, minus_inf, plain = trials
    assert [t.state for t in trials] == [TrialState.FAIL] * 2 + [TrialState.COMPLETE] * 2
    assert nan.user_attrs["fail_reason"] == "nan" and exited.user_attrs["fail_reason"] == "exit"
    assert not any("retry_of" in t.user_attrs for t in trials)  # neither failure is re-run
    assert len({t.user_attrs["pid"] for t in trials}) == 1  # one warm process carried on
    assert "Traceback" not in stderr
    said = {n: [line for line in stderr.splitlines() if f"trial {n} " in line] for n in range(4)}
    assert len(said[0]) == 1 and "trial 0 failed: the objective returned nan" in said[0][0]
    assert len(said[1]) == 1 and "trial 1 failed: the objective called sys.exit(3)" in said[1][0]
    # inf and -inf: COMPLETE, as Optuna stores them, one warning, and never the best trial
    assert minus_inf.value == float("-inf")
    assert len(said[2]) == 1 and "trial 2 returned -inf: stored as COMPLETE" in said[2][0]
    assert said[3] == []
    study = optuna.load_study(study_name="odd", storage=sqlite_url)
    assert best_of_study(study).number == 3  # the -inf (the storage's "best") is passed over
    assert pick_best(trials, ["maximize"]).number == 3
    assert pick_best([minus_inf], ["minimize"]) is None


def test_a_trial_past_trial_timeout_fails_as_timeout_and_its_retry_counts(sqlite_url, tmp_path):
    trials, stderr = _run(
        sqlite_url,
        tmp_path / "marker",
        "behave=hang",
        extra=("--trial-timeout", "2", "--max-retries", "1"),
        trials=2,
    )
    timed_out, rerun, third = trials
    assert timed_out.state == TrialState.FAIL
    assert timed_out.user_attrs["fail_reason"] == "timeout"
    assert "--trial-timeout 2 s" in timed_out.user_attrs["error"]
    assert rerun.user_attrs["retry_of"] == 0 and rerun.user_attrs["retry_reason"] == "timeout"
    assert rerun.state == third.state == TrialState.COMPLETE
    assert rerun.user_attrs["pid"] != timed_out.user_attrs["pid"]  # its process was recycled
    assert "Traceback" not in stderr and "trial timed out" in stderr


def test_the_api_takes_trial_timeout_and_max_retries_zero_means_no_rerun(sqlite_url):
    from tests.misbehaving_adapter import objective_that_hangs_first

    study = orchestrator.optimize(
        objective_that_hangs_first,
        n_trials=2,
        storage=sqlite_url,
        gpus="none",
        pruner="none",
        max_retries=0,
        trial_timeout=2,
    )
    first, second = sorted(study.trials, key=lambda t: t.number)
    assert first.state == TrialState.FAIL and first.user_attrs["fail_reason"] == "timeout"
    assert second.state == TrialState.COMPLETE and "retry_of" not in second.user_attrs


def _trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return stored_study(storage, "odd").trials
    except KeyError:  # not created yet
        return []


def test_a_frozen_trial_process_is_re_run_and_its_late_write_is_one_line(sqlite_url, tmp_path):
    marker, release = tmp_path / "marker", tmp_path / "release"
    flags = _flags(sqlite_url, marker, "behave=wait", f"release={release}")
    cli = start_cli(*flags, env=_env())
    try:

        def training() -> int | None:  # trial 0's process, once it trains (its marker is made)
            if not Path(f"{marker}.0").exists():
                return None
            zero = [t for t in _trials(sqlite_url) if t.number == 0]
            return zero[0].user_attrs.get("pid") if zero else None

        pid = wait_for(training, "the trial to train", timeout=240.0, every=0.3)
        freeze(pid)
        rerun = lambda: any(t.user_attrs.get("retry_of") == 0 for t in _trials(sqlite_url))  # noqa: E731
        wait_for(rerun, "trial 0's re-run", timeout=240.0, every=0.3)
        release.touch()
        os.kill(pid, signal.SIGCONT)
        _, stderr = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    assert cli.returncode == 0, stderr
    trials = sorted(_trials(sqlite_url), key=lambda t: t.number)
    assert trials[0].state == TrialState.FAIL
    assert all(t.state == TrialState.COMPLETE for t in trials[1:])
    assert "Traceback" not in stderr and "UpdateFinishedTrialError" not in stderr
    about_zero = [line for line in stderr.splitlines() if "trial 0" in line]
    assert len(about_zero) == 1 and "late result is dropped" in about_zero[0], stderr
