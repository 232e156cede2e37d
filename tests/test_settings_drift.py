"""A study resumed with settings that change what a trial means is refused, or updated on request.

The comparison is pure (record/study/drift.py); the command line and the Python API meet it
through one check where the settings are stored, before any trial runs.
"""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

import optuna
import pytest

import orchestrator
from orchestrator.errors import UserError
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.drift import UPDATES_ATTR, differences, drift_message
from orchestrator.record.study.spec import StudySpec, load_spec, save_spec
from tests.api_objective import objective
from tests.cli_helpers import run_cli

STORED = StudySpec(
    adapter="synthetic",
    trials=2,
    epochs=3,
    direction="minimize",
    options={"trial_seconds": 0.1, "overhead_mb": 500.0},
    seed=11,
)
FAST = ("--option", "trial_seconds=0.05", "--gpus", "sim:24576", "-q")


def _said(stored: StudySpec, wanted: StudySpec) -> list[str]:
    return [str(drift) for drift in differences(stored, wanted)]


def test_settings_that_change_what_a_trial_means_are_named():
    wanted = STORED.updated(epochs=6, sampler="random", seed=7, pruner="none")
    assert _said(STORED, wanted) == [
        "--epochs 6 (stored: 3)",
        "--sampler random (stored: pso)",
        "--seed 7 (stored: 11)",
        "--pruner none (stored: median)",
    ]
    options = STORED.updated(options={"trial_seconds": 0.5, "env": "CartPole-v1"})
    assert _said(STORED, options) == [
        "--option env CartPole-v1 (stored: (not set))",
        "--option trial_seconds 0.5 (stored: 0.1)",
    ]


def test_budget_retries_tracking_and_the_memory_model_may_change():
    wanted = STORED.updated(
        trials=40, max_retries=0, mlflow_uri="file:///tmp/mlruns",
        options={"trial_seconds": 0.1, "overhead_mb": 900.0, "per_sample_mb": 1.0},
    )  # fmt: skip
    assert differences(STORED, wanted) == []
    # A seed not given keeps the stored one; the swarm's size matters only to the swarm.
    assert differences(STORED, StudySpec(**{**STORED.to_attr(), "seed": None})) == []
    random = STORED.updated(sampler="random")
    assert differences(random, random.updated(swarm_size=5)) == []
    assert _said(STORED, STORED.updated(swarm_size=5)) == ["--swarm-size 5 (stored: 20)"]


def test_the_line_says_how_to_go_on():
    line = drift_message("dqn", differences(STORED, STORED.updated(epochs=6)))
    assert "\n" not in line
    assert line.startswith("study 'dqn' was run with other settings: --epochs 6 (stored: 3)")
    assert "--study NEW" in line and "--update-settings" in line


def test_storing_other_settings_is_refused_where_they_are_stored(sqlite_url):
    """A run that raced another to create the study meets the same check when it stores."""
    study = optuna.create_study(study_name="s", storage=StorageLocation.parse(sqlite_url).url)
    save_spec(study, STORED)
    with pytest.raises(UserError, match=r"--epochs 6 \(stored: 3\)"):
        save_spec(study, STORED.updated(epochs=6))
    assert load_spec(study) == STORED
    save_spec(study, STORED.updated(trials=5))  # the budget raised: allowed, nothing recorded
    assert load_spec(study).trials == 5 and UPDATES_ATTR not in study.user_attrs


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("drift")
    done = run_cli("run", "synthetic", "--trials", "2", "--epochs", "1", *FAST, cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


def test_a_resume_with_other_settings_is_one_line_and_changes_nothing(made, tmp_path):
    database = made / "orchestrator.db"
    before = _dump(database)
    done = run_cli(
        "run", "synthetic", "--trials", "3", "--epochs", "6", "--sampler", "random",
        "--seed", "7", "--pruner", "none", "--max-retries", "0", *FAST, cwd=made,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: study 'synthetic' was run with other settings: --epochs 6")
    for said in ("--sampler random (stored: pso)", "--seed 7", "--pruner none (stored: median)"):
        assert said in line
    assert "max-retries" not in line and "trials" not in line.partition(":")[2].split(";")[0]
    assert _dump(database) == before


def test_update_settings_is_recorded_and_shown_by_status(made, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(made, folder)
    done = run_cli(
        "run", "synthetic", "--trials", "3", "--epochs", "2", "--update-settings", *FAST,
        cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=f"sqlite:///{folder}/orchestrator.db")
    assert load_spec(study).epochs == 2 and len(study.trials) == 3
    (update,) = study.user_attrs[UPDATES_ATTR]
    assert update["host"] == socket.gethostname()
    assert update["changes"] == [{"setting": "--epochs", "from": 1, "to": 2}]
    shown = run_cli("status", "--study", "synthetic", cwd=folder)
    assert shown.returncode == 0, shown.stderr
    assert f"Settings updated {update['time']} on {update['host']}: --epochs 1 -> 2" in shown.stdout
    as_json = run_cli("status", "--study", "synthetic", "--json", cwd=folder)
    assert json.loads(as_json.stdout)["settings_updates"] == [update]


def test_the_python_api_gets_the_same_rule(sqlite_url, tmp_path):
    settings = dict(
        storage=sqlite_url, gpus="sim:24576", memory_model=(200.0, 0.5),
        batch_sizes=(64, 4096), pruner="none", log_dir=str(tmp_path / "logs"),
    )  # fmt: skip
    orchestrator.optimize(objective, n_trials=1, epochs=2, **settings)
    with pytest.raises(UserError, match=r"--epochs 3 \(stored: 2\)"):
        orchestrator.optimize(objective, n_trials=2, epochs=3, **settings)
    with pytest.raises(UserError, match=r"--option batch_size_max 512 \(stored: 4096\)"):
        orchestrator.optimize(
            objective, n_trials=2, epochs=2, **{**settings, "batch_sizes": (64, 512)}
        )
    storage = StorageLocation.parse(sqlite_url).url
    (name,) = optuna.get_all_study_names(storage)
    stored = load_spec(optuna.load_study(study_name=name, storage=storage))
    assert stored.epochs == 2 and stored.options["batch_size_max"] == 4096
