"""A stopped trial's re-run goes on from its last checkpoint, with real processes: a trial process
killed with SIGKILL, an out-of-memory re-queue with a smaller batch, and a PostgreSQL outage past
`--storage-retry-seconds` (exit 75) then a resume. Each re-run records `resumed_from_epoch`, its log
says so, and its curve is the one the stopped trial began, epochs carried over.

(Slurm's `scancel` and a node set DOWN are in tests/test_slurm_cluster.py, on its cluster.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tests.cli_helpers import cli_env, freeze, run_cli, start_cli
from tests.waiting import stored_study, wait_for

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 6


def _study(url: str, name: str = "synthetic") -> optuna.Study:
    return stored_study(url, name)


def _wait_for(what: str, check):
    # The study or its trial is not there yet, or the file is busy: not yet.
    tolerate = (KeyError, IndexError, optuna.exceptions.StorageInternalError)
    return wait_for(check, what, timeout=240.0, tolerate=tolerate)


def _rerun_of(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    reruns = [t for t in study.trials if t.user_attrs.get("retry_of") == number]
    assert len(reruns) == 1, [t.user_attrs for t in study.trials]
    return reruns[0]


def assert_resumed(stopped: optuna.trial.FrozenTrial, rerun: optuna.trial.FrozenTrial) -> int:
    """The re-run went on from the stopped trial's last checkpoint, with one continuous curve."""
    saved = stopped.user_attrs["checkpoint"]["epoch"]
    assert rerun.state == TrialState.COMPLETE, rerun
    assert rerun.user_attrs["checkpoint_from"] == stopped.number
    assert rerun.user_attrs["resumed_from_epoch"] == saved
    assert sorted(rerun.intermediate_values) == list(range(EPOCHS))
    for epoch in range(saved + 1):
        assert rerun.intermediate_values[epoch] == stopped.intermediate_values[epoch]
    log = Path(rerun.user_attrs["log_file"]).read_text()
    assert f"resumed from the checkpoint of trial {stopped.number} at epoch {saved}" in log, log
    return saved


def test_a_trial_process_killed_mid_trial_is_re_run_from_its_checkpoint(sqlite_url):
    runner = start_cli(
        "run", "synthetic", "--trials", "1", "--epochs", str(EPOCHS), "--option",
        "trial_seconds=6", "--concurrency", "1", "--pruner", "none", "--sampler", "random",
        "--gpus", "sim:24576", "--storage", sqlite_url,
    )  # fmt: skip

    def saved_twice():
        trial = _study(sqlite_url).trials[0]
        return trial if trial.user_attrs.get("checkpoint", {}).get("epoch", -1) >= 1 else None

    victim = _wait_for("a trial with two checkpoints", saved_twice)
    os.kill(victim.user_attrs["pid"], signal.SIGKILL)  # the trial process only, mid-training
    _, stderr = runner.communicate(timeout=300)
    assert runner.returncode == 0, stderr
    study = _study(sqlite_url)
    stopped = study.trials[victim.number]
    assert stopped.state == TrialState.FAIL
    saved = assert_resumed(stopped, _rerun_of(study, victim.number))
    assert saved >= 1


def test_an_oom_re_queue_with_half_the_batch_goes_on_from_the_checkpoint(sqlite_url, tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text("x: 1.0\ny: -2.0\nlearning_rate: 0.001\nbatch_size: 2048\nactivation: gelu\n")
    env = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = run_cli(
        "run", "--adapter-path", "tests.checkpoint_adapter:adapter", "--study", "oom",
        "--trials", "1", "--epochs", str(EPOCHS), "--enqueue", str(first),
        "--option", "trial_seconds=0.6", "--option", "oom_epoch=3",
        "--option", "oom_batch_above=1024", "--concurrency", "1", "--pruner", "none",
        "--gpus", "sim:24576", "--storage", sqlite_url, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = _study(sqlite_url, "oom")
    oomed = study.trials[0]
    # (Its attributes say why it ended otherwise: under heavy load, a lost heartbeat.)
    assert oomed.state == TrialState.FAIL and oomed.user_attrs.get("oom") is True, oomed.user_attrs
    rerun = _rerun_of(study, 0)
    # Alone on the GPU: half the batch, or less where the GPU's new bounds say so.
    assert rerun.params["batch_size"] <= 1024
    assert assert_resumed(oomed, rerun) == 2  # epochs 0-2 were trained once


def test_an_outage_past_the_bound_then_a_resume_goes_on_from_the_checkpoints(tmp_path):
    from tests.pg_cluster import PgCluster

    with PgCluster.create() as cluster:
        url = cluster.create_database("bound")
        run = (
            "run", "synthetic", "--trials", "2", "--epochs", str(EPOCHS), "--option",
            "trial_seconds=12", "--concurrency", "2", "--pruner", "none", "--sampler", "random",
            "--gpus", "sim:24576", "--storage", url, "--artifacts", str(tmp_path / "ckpt"),
        )  # fmt: skip
        runner = start_cli(*run, "--storage-retry-seconds", "4")

        def both_saved():
            trials = _study(url).trials
            epochs = [t.user_attrs.get("checkpoint", {}).get("epoch", -1) for t in trials]
            return len(trials) == 2 and min(epochs) >= 1

        _wait_for("two trials with two checkpoints each", both_saved)
        cluster.stop()
        _, stderr = runner.communicate(timeout=300)
        assert runner.returncode == 75, stderr
        cluster.start()
        again = run_cli(*run, timeout=300)
        assert again.returncode == 0, again.stderr
        study = _study(url)
        assert [t.state for t in study.trials].count(TrialState.COMPLETE) == 2
        stopped = [t for t in study.trials if t.state == TrialState.FAIL]
        assert stopped, [t.state for t in study.trials]  # in flight when the bound passed
        for trial in stopped:
            assert assert_resumed(trial, _rerun_of(study, trial.number)) >= 1


def test_a_frozen_trial_stopped_as_it_wakes_is_re_run_once(sqlite_url):
    """Failed as lost while frozen, its re-run queued then; stopped by a preemption as it wakes,
    it must not queue a second re-run of itself."""
    runner = start_cli(
        "run", "synthetic", "--trials", "1", "--epochs", str(EPOCHS), "--option",
        "trial_seconds=30", "--concurrency", "1", "--pruner", "none", "--sampler", "random",
        "--gpus", "sim:24576", "--grace", "1", "--storage", sqlite_url,
    )  # fmt: skip

    def training():
        trial = _study(sqlite_url).trials[0]
        return trial.user_attrs["pid"] if trial.intermediate_values else None

    pid = _wait_for("trial 0 training", training)
    freeze(pid)
    _wait_for("its re-run", lambda: len(_study(sqlite_url).trials) > 1)
    runner.send_signal(signal.SIGTERM)  # the worker: its trials in flight are stopped
    time.sleep(3)  # past --grace: the frozen process has its stop waiting when it wakes
    os.kill(pid, signal.SIGCONT)
    _, stderr = runner.communicate(timeout=300)
    study = _study(sqlite_url)
    assert len([t for t in study.trials if t.user_attrs.get("retry_of") == 0]) == 1, stderr
