"""MLflow tracking against a real MLflow store (SQLite, through MLflow's own client): the trials of
a real `run`, logged after the fact as the trial processes log them, read back with MlflowClient."""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow", reason='MLflow tracking needs the extra: pip install -e ".[mlflow]"')

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from orchestrator.errors import UserError
from orchestrator.record.study.spec import load_spec
from orchestrator.record.trials.tracking import (
    TrialTracker,
    tracker_for,
    tracking_uri_for,
    tracking_uri_to_store,
)
from tests.cli_helpers import cli_env, run_cli


@pytest.fixture
def mlflow_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_each_trial_of_a_run_becomes_an_mlflow_run(sqlite_url, mlflow_uri):
    done = run_cli(
        "run", "synthetic", "--trials", "8", "--epochs", "4", "--pruner", "median",
        "--option", "trial_seconds=0.05", "--gpus", "sim:12288,sim:24576", "--concurrency", "2",
        "--sampler", "random", "--seed", "5", "--mlflow-uri", mlflow_uri, "--storage", sqlite_url,
        "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=sqlite_url)
    spec = load_spec(study)
    assert spec.mlflow_uri == mlflow_uri  # stored, so workers on other nodes log there too

    # Every trial process logged its trials as they finished.
    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("synthetic")
    assert len(client.search_runs([experiment.experiment_id])) == 8

    # A tracker finds each trial's run again (logging twice adds nothing): their ids.
    tracker = tracker_for(spec, study.study_name, metric="loss")
    assert isinstance(tracker, TrialTracker)
    trials = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    run_ids = {t.number: tracker.log_trial(t) for t in trials}
    assert all(run_ids.values())
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert len(runs) == len(trials) == 8
    for trial in trials:
        run = runs[run_ids[trial.number]]
        assert run.info.run_name == f"trial {trial.number}"
        assert run.data.params == {k: str(v) for k, v in trial.params.items()}
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == sorted(
            trial.intermediate_values.items()
        )
        assert run.data.metrics["vram_peak_mb"] == trial.user_attrs["vram_peak_mb"]
        assert run.data.metrics["vram_planned_mb"] == trial.user_attrs["vram_planned_mb"]
        assert run.data.tags["gpu"] == trial.user_attrs["gpu"]
        assert run.data.tags["state"] == trial.state.name
        assert run.data.tags["oom"] == "False"
        if trial.state == TrialState.COMPLETE:
            assert run.data.metrics["final_loss"] == trial.value
            assert run.info.status == "FINISHED"
        else:
            assert "final_loss" not in run.data.metrics
            assert run.info.status == "KILLED"
        assert run.info.start_time == int(trial.datetime_start.timestamp() * 1000)
    assert {r.data.tags["gpu"] for r in runs.values()} <= {
        "Simulated GPU 12 GB",
        "Simulated GPU 24 GB",
    }

    # A trial is logged once: again, from a fresh process's tracker, it finds its run.
    again = TrialTracker(mlflow_uri, experiment="synthetic", metric="loss")
    assert again.log_trial(trials[0]) == run_ids[trials[0].number]
    assert len(client.search_runs([experiment.experiment_id])) == 8


def test_a_tracking_store_that_is_down_costs_a_warning_not_the_trial(tmp_path, caplog):
    trial = optuna.trial.create_trial(value=1.0)
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a file where the store's folder should be: it cannot be opened
    tracker = TrialTracker(f"sqlite:///{blocker / 'm.db'}", experiment="s")
    assert tracker.log_trial(trial) is None
    assert "not logged to MLflow" in caplog.text


def test_where_trials_are_logged(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri_to_store(None) is None  # nothing asked: what is stored stays
    assert tracking_uri_to_store("none") == ""  # switched off for a resumed study
    assert tracking_uri_to_store("http://mlflow:5000") == "http://mlflow:5000"
    with pytest.raises(UserError, match="must not hold a password"):
        tracking_uri_to_store("http://me:secret@mlflow:5000")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://from-env:5000")
    assert tracking_uri_to_store(None) == "http://from-env:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://me:secret@from-env:5000")
    assert tracking_uri_to_store(None) is None  # used where it is set, never stored

    env = {"MLFLOW_TRACKING_URI": "http://node:5000"}
    assert tracking_uri_for("http://stored:5000", env) == "http://node:5000"
    assert tracking_uri_for("http://stored:5000", {}) == "http://stored:5000"
    assert tracking_uri_for("", env) is None
    assert tracking_uri_for(None, {}) is None


def test_a_password_in_the_flag_is_one_line_and_never_shown(sqlite_url):
    done = run_cli(
        "run", "synthetic", "--mlflow-uri", "http://me:s3cret@mlflow:5000", "--storage", sqlite_url,
        env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert "must not hold a password" in done.stderr and "s3cret" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_without_the_extra_the_flag_says_what_to_install(monkeypatch, caplog):
    import orchestrator.record.trials.tracking as tracking
    from orchestrator.record.study.spec import StudySpec

    monkeypatch.setattr(tracking, "mlflow_installed", lambda: False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(
        UserError, match=r'--mlflow-uri needs MLflow: pip install -e "\.\[mlflow\]"'
    ):
        tracking_uri_to_store("sqlite:///mlflow.db")
    spec = StudySpec(adapter="synthetic", trials=1, epochs=1, direction="minimize", mlflow_uri="x")
    assert tracker_for(spec, "s", metric="loss") is None  # a worker without it: a warning, no crash
    assert "MLflow is not installed" in caplog.text
