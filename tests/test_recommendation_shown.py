"""The recommended trial beside the best observed one, wherever "the best" is read.

A noisy study of one parameter: the objective is (x - 0.3)^2 on a grid of x, plus one lucky run
far from 0.3 that holds the best observed value. `best`, `status`, the report, the end of `run`
and the study's dashboard note name the trial the model expects best, show both values and
why they differ; `best --format yaml` writes the recommended parameters. Real processes (the
command line) on an SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import json
import random

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.study.note import read_study_note
from orchestrator.record.study.spec import StudySpec, load_spec, save_spec
from orchestrator.result import outcome_lines, outcome_of
from tests.cli_helpers import run_cli

LUCKY_X = 0.95


def noisy_study(url: str, *, lucky: bool = True, grid: int = 24) -> optuna.Study:
    """`grid` configurations, the true best at x = 0.3, and (with `lucky`) one run at x = 0.95
    that drew a value better than any."""
    storage = open_storage(StorageLocation.parse(url))
    study = optuna.create_study(study_name="noisy", storage=storage, direction="minimize")
    save_spec(study, StudySpec(adapter="synthetic", trials=40, epochs=1, direction="minimize"))
    rng = random.Random(0)
    space = {"x": FloatDistribution(0.0, 1.0)}
    for i in range(grid):
        x = i / (grid - 1)
        value = 4 * (x - 0.3) ** 2 + rng.gauss(0.0, 0.05)
        study.add_trial(create_trial(params={"x": x}, distributions=space, value=value))
    if lucky:
        study.add_trial(create_trial(params={"x": LUCKY_X}, distributions=space, value=-0.5))
    return study


@pytest.fixture
def noisy(storage_url):
    study = noisy_study(storage_url)
    return {"url": storage_url, "study": study, "lucky": study.trials[-1].number}


def test_best_writes_the_recommended_parameters_and_keeps_the_observed_one(noisy):
    url, lucky = noisy["url"], noisy["lucky"]
    done = run_cli("best", "--storage", url, "--study", "noisy")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["best_observed"]["trial"] == lucky
    assert record["best_observed"]["value"] == -0.5
    assert record["best_observed"]["params"] == {"x": LUCKY_X}
    assert record["trial"] != lucky  # the top of the JSON is the trial to deploy
    assert abs(record["params"]["x"] - 0.3) < 0.1
    rec = record["recommended"]
    assert rec["trial"] == record["trial"] and rec["same_as_best_observed"] is False
    assert rec["expected"] > -0.5  # the model does not believe the lucky draw
    assert "observed -0.5 once" in rec["reason"]
    assert f"best observed: trial #{lucky}, -0.5" in done.stderr

    as_yaml = run_cli("best", "--storage", url, "--study", "noisy", "--format", "yaml")
    assert yaml.safe_load(as_yaml.stdout) == record["params"]

    text = run_cli("best", "--storage", url, "--study", "noisy", "--format", "text").stdout
    assert f"recommended: trial #{record['trial']}, value expected" in text
    assert f"best observed: trial #{lucky}, value -0.5" in text
    assert "why they differ: " in text


def test_status_shows_both_and_why(noisy):
    url, lucky = noisy["url"], noisy["lucky"]
    done = run_cli("status", "--storage", url, "--study", "noisy")
    assert done.returncode == 0, done.stderr
    assert f"Best observed: trial #{lucky}, value -0.5" in done.stdout
    assert "Recommended: trial #" in done.stdout and "Why they differ: " in done.stdout
    as_json = json.loads(run_cli("status", "--storage", url, "--study", "noisy", "--json").stdout)
    assert as_json["best"]["number"] == lucky
    assert as_json["recommended"]["best_observed"] == lucky
    assert as_json["recommended"]["trial"] != lucky


def test_the_report_heads_with_the_recommended_trial(noisy, tmp_path):
    url = noisy["url"]
    done = run_cli("report", "--storage", url, "--study", "noisy", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r" / "index.html").read_text()
    record = json.loads(run_cli("best", "--storage", url, "--study", "noisy").stdout)
    # Named by the adapter's metric, as the report names every value.
    assert f"<h2>Recommended trial #{record['trial']}: loss expected" in page
    assert f"best observed: trial #{noisy['lucky']}, loss -0.5" in page


def test_run_s_last_lines_and_the_dashboard_note(noisy):
    study, lucky = noisy["study"], noisy["lucky"]
    outcome = outcome_of(study, load_spec(study), interrupted=False)
    lines = outcome_lines(outcome, metric="loss", as_json=False)
    rec = outcome.recommended
    assert rec is not None and rec.best_observed == lucky and outcome.best_trial == lucky
    assert lines[1].startswith(f"recommended: trial #{rec.trial}, loss expected")
    assert any(line.startswith(f"best observed: trial #{lucky}, loss -0.5") for line in lines)
    as_json = json.loads(outcome_lines(outcome, metric="loss", as_json=True)[0])
    assert as_json["best_trial"] == lucky and as_json["recommended"]["trial"] == rec.trial
    note = read_study_note(study)
    assert note.startswith(f"### Recommended: trial {rec.trial}") and "why they differ" in note


def test_one_line_when_the_best_observed_is_the_recommended_one(sqlite_url):
    study = noisy_study(sqlite_url, lucky=False, grid=6)  # too few for a model: the best stands
    outcome = outcome_of(study, load_spec(study), interrupted=False)
    assert outcome.recommended is not None and outcome.recommended.same
    lines = outcome_lines(outcome, metric="loss", as_json=False)
    assert lines[1] == f"best trial #{outcome.best_trial}: loss = {outcome.best_value:.6g}"
    assert [line for line in lines if "recommended" in line] == [
        f"recommended: the same trial ({outcome.recommended.reason})"
    ]
    text = run_cli("best", "--storage", sqlite_url, "--format", "text").stdout
    recommended = [line for line in text.splitlines() if "recommended" in line]
    assert len(recommended) == 1 and "the best observed too" in recommended[0]
