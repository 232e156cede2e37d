"""`best`: the best trial (JSON) or its parameters (YAML), to standard output or a file."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from test_status import build_study, run_cli


def test_best_json_and_yaml_give_the_best_parameters(storage_url, capsys):
    built = build_study(storage_url)

    code, out, err = run_cli(capsys, "best", "--study", "demo", "--storage", storage_url)
    assert code == 0
    best = json.loads(out)
    assert best["params"] == built["best_params"] and best["trial"] == built["best"]
    assert best["final_scores"] is None  # a test function has no test part or baselines
    assert f"trial #{built['best']}" in err

    code, out, _ = run_cli(
        capsys, "best", "--study", "demo", "--storage", storage_url, "--format", "yaml"
    )
    assert code == 0
    assert yaml.safe_load(out) == built["best_params"]
    assert list(yaml.safe_load(out)) == list(built["best_params"])  # declared order kept


def test_best_writes_a_file(sqlite_url, tmp_path, capsys):
    built = build_study(sqlite_url)
    target = tmp_path / "best.yaml"
    code, out, err = run_cli(
        capsys,
        "best",
        "--study",
        "demo",
        "--storage",
        sqlite_url,
        "--format",
        "yaml",
        "--out",
        str(target),
    )
    assert code == 0 and out == ""
    assert yaml.safe_load(target.read_text()) == built["best_params"]
    assert str(target) in err


@pytest.mark.parametrize("where", ["missing-dir/best.json", "."])
def test_best_to_an_unwritable_place_is_one_line(sqlite_url, tmp_path, capsys, where):
    build_study(sqlite_url, completed=2)
    code, _, err = run_cli(
        capsys, "best", "--study", "demo", "--storage", sqlite_url, "--out", str(tmp_path / where)
    )
    assert code == 2 and err.startswith("error: cannot write") and err.count("\n") == 1


def test_best_without_a_completed_trial_says_so(sqlite_url, capsys):
    build_study(sqlite_url, completed=0)
    code, _, err = run_cli(capsys, "best", "--study", "demo", "--storage", sqlite_url)
    assert code == 2 and "no completed trial" in err


def test_the_best_trial_follows_the_direction_and_skips_what_is_not_a_value():
    from optuna.trial import TrialState, create_trial

    from orchestrator.record.trials.best import pick_best

    trials = [create_trial(value=v) for v in (3.0, 1.0, 1.0, 7.0, 0.0)]
    trials[4].values = [float("nan")]  # create_trial refuses NaN; the rule skips one anyway
    trials.append(create_trial(state=TrialState.RUNNING))
    for number, trial in enumerate(trials):
        trial.number = number
    assert pick_best(trials, ["minimize"]).number == 1  # the lowest number wins a tie
    assert pick_best(trials, ["maximize"]).number == 3  # NaN is never best
    assert pick_best(trials[5:], ["minimize"]) is None  # nothing completed yet
    assert pick_best(trials, ["minimize", "maximize"]) is None  # several objectives: no one best


def test_a_study_s_best_trial_is_none_before_a_completed_one_and_with_several_objectives():
    import optuna

    from orchestrator.record.trials.best import best_of_study

    study = optuna.create_study(direction="maximize")
    assert best_of_study(study) is None
    for value in (2.0, 5.0, 3.0):
        study.add_trial(optuna.trial.create_trial(value=value))
    assert best_of_study(study).value == 5.0

    pareto = optuna.create_study(directions=["minimize", "maximize"])
    pareto.add_trial(optuna.trial.create_trial(values=[1.0, 2.0]))
    assert best_of_study(pareto) is None  # `study.best_trial` raises RuntimeError here


def test_a_current_confirmation_decides_what_best_hands_out_and_an_older_one_does_not(
    sqlite_url, capsys
):
    """`--confirm K` re-ranks the model's top K on more seeds: while no trial has completed since,
    `best` hands out its first (and says so before the model's view); once the study has grown,
    the confirmation no longer decides and its scores are said to be older than the study."""
    import optuna
    from optuna.trial import create_trial
    from test_status import distributions, trial_params

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.study.final_scores import Confirmed, FinalScores, save_final_scores

    build_study(sqlite_url)
    study = optuna.load_study(
        study_name="demo", storage=open_storage(StorageLocation.parse(sqlite_url))
    )
    _, out, _ = run_cli(capsys, "best", "--storage", sqlite_url)
    recommended = json.loads(out)["trial"]
    other = next(t for t in study.trials if t.value is not None and t.number != recommended)
    confirmed = [
        Confirmed(other.number, other.value, [0.1, 0.1], 0.1, 0.0),
        Confirmed(recommended, 1.0, [0.5, 0.7], 0.6, 0.1),
    ]
    scores = FinalScores(
        other.number, other.value, "value", seeds=2, confirmed=confirmed, complete_trials=10,
        selected_params=dict(other.params),
    )  # fmt: skip
    save_final_scores(study, scores)

    _, out, _ = run_cli(capsys, "best", "--storage", sqlite_url, "--format", "yaml")
    assert yaml.safe_load(out) == other.params
    _, text, _ = run_cli(capsys, "best", "--storage", sqlite_url, "--format", "text")
    first, *rest = text.splitlines()
    assert first == f"trial #{other.number}, selected by the confirmation; the model's view below"
    said = f"selected by the confirmation (ranked first on 2 seeds): trial #{other.number}, "
    assert any(line.startswith(said) for line in rest)
    assert not any("older than the study" in line for line in rest)

    study.add_trial(create_trial(params=trial_params(3), distributions=distributions(), value=99.0))
    _, out, err = run_cli(capsys, "best", "--storage", sqlite_url)
    assert json.loads(out)["trial"] == recommended
    assert f"a confirmation older than the study ranked #{other.number} first" in err
    _, text, _ = run_cli(capsys, "best", "--storage", sqlite_url, "--format", "text")
    assert "it has 11 now: these scores are older than the study" in text


def test_infinite_values_are_said_as_such_and_never_hide_the_finite_best(sqlite_url, capsys):
    """Trials that completed with inf are not "no completed trial yet"; a study that holds an
    infinite value beside finite ones lists its best finite one."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial
    from test_status import run_cli as run

    import orchestrator
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.migrate import open_storage

    storage = open_storage(StorageLocation.parse(sqlite_url))
    dists = {"x": FloatDistribution(-1, 1)}
    endless = optuna.create_study(study_name="endless", storage=storage)
    mixed = optuna.create_study(study_name="mixed", storage=storage)
    for i in range(3):
        endless.add_trial(create_trial(params={"x": i / 4}, distributions=dists, value=-math.inf))
        mixed.add_trial(create_trial(params={"x": i / 4}, distributions=dists, value=2.0 + i))
    mixed.add_trial(create_trial(params={"x": -0.5}, distributions=dists, value=-math.inf))

    code, out, err = run(capsys, "best", "--storage", sqlite_url, "--study", "endless")
    assert code == 2 and out == "" and "Traceback" not in err
    assert "has 3 trials completed, none with a finite value" in err and "wait" not in err
    code, out, _ = run(capsys, "status", "--storage", sqlite_url, "--study", "endless")
    assert code == 0 and "Best: 3 trials completed, none with a finite value" in out
    with pytest.raises(ValueError, match="No trial completed with a finite value"):
        orchestrator.recommend(endless)

    code, out, _ = run(capsys, "status", "--storage", sqlite_url, "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert (rows["mixed"]["best_trial"], rows["mixed"]["best_value"]) == (0, 2.0)
    assert rows["endless"]["best_trial"] is None


def test_the_objective_s_name_is_said_where_the_study_stores_one(sqlite_url, capsys):
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial
    from test_status import run_cli as run

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name="named", storage=open_storage(StorageLocation.parse(sqlite_url))
    )
    study.set_metric_names(["mse"])
    for i in range(3):
        study.add_trial(
            create_trial(
                params={"x": i / 4}, distributions={"x": FloatDistribution(0, 1)}, value=1.0 + i
            )
        )
    _, text, _ = run(capsys, "best", "--storage", sqlite_url, "--format", "text")
    assert "recommended: trial #0, the best observed too: mse observed 1 (once)" in text
    _, out, _ = run(capsys, "status", "--storage", sqlite_url, "--study", "named")
    assert "Best: trial #0, mse 1" in out
