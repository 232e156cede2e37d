"""Optuna's contract through `orchestrator.optimize` and `run`: sampler and pruner objects,
callbacks, several objectives (GPU cost among them), adopting a plain Optuna study, and a
refused call that stores nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from test_status import run_cli

import orchestrator
from orchestrator.errors import UserError
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.objectives import plan_objectives, told
from orchestrator.record.study.spec import PICKLES_ATTR, SPEC_ATTR, load_spec
from tests.optuna_objectives import draws_its_own_batch, quadratic, two_values

QUICK = {"gpus": "none", "quiet": True}


def test_sampler_and_pruner_objects_and_callbacks_reach_every_trial(sqlite_url):
    finished: list[tuple[int, str]] = []
    grid = [-4.0, -2.0, 0.0, 2.0]
    sampler = optuna.samplers.GridSampler({"x": grid}, seed=3)
    study = orchestrator.optimize(
        quadratic,
        n_trials=4,
        storage=sqlite_url,
        metric="loss",
        sampler=sampler,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=50),
        callbacks=[lambda s, t: finished.append((t.number, t.state.name))],
        **QUICK,
    )
    assert study.study_name == "tests.optuna_objectives:quadratic"  # module:function
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    # Called in this process, once per finished trial, with the frozen trial, as study.optimize.
    assert finished == [(n, "COMPLETE") for n in range(4)]
    spec = load_spec(study)
    assert (spec.sampler, spec.pruner) == ("GridSampler", "MedianPruner")
    assert "sampler_pickle" not in study.user_attrs[SPEC_ATTR]  # the dashboard shows no pickle
    assert PICKLES_ATTR in study._storage.get_study_system_attrs(study._study_id)
    # The sampler object ran in the trial processes: each grid point once.
    assert sorted(t.params["x"] for t in study.trials) == grid
    assert study.metric_names == ["loss"]  # what optuna-dashboard labels the value


def _sampler_of_a_notebook_cell() -> optuna.samplers.BaseSampler:
    class Mine(optuna.samplers.RandomSampler):  # defined inside a function: pickle cannot find it
        pass

    return Mine()


@pytest.mark.parametrize(
    ("call", "says"),
    [
        ({"sampler": "cmaes", "directions": ["minimize", "minimize"]}, "optimises one objective"),
        (
            {"sampler": _sampler_of_a_notebook_cell()},
            "cannot be pickled",
        ),
        ({"pruner": "sometimes"}, "give an Optuna pruner or one of median"),
        ({"directions": ["minimize", "upward"]}, "minimize or maximize"),
        ({"objectives": "value,vram_peak_mb,watts"}, "'watts' is neither"),
    ],
)
def test_a_refused_call_stores_nothing(sqlite_url, call, says):
    with pytest.raises((ValueError, UserError), match=says):
        orchestrator.optimize(two_values, n_trials=2, storage=sqlite_url, **QUICK, **call)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_two_objectives_give_a_pareto_front_in_best(sqlite_url, capsys):
    study = orchestrator.optimize(
        two_values,
        n_trials=6,
        storage=sqlite_url,
        directions=["minimize", "minimize"],
        objectives="near_zero,near_two",
        sampler="random",
        seed=5,
        **QUICK,
    )
    assert len(study.directions) == 2 and study.metric_names == ["near_zero", "near_two"]
    assert all(t.state == TrialState.COMPLETE and len(t.values) == 2 for t in study.trials)
    expected = sorted(t.number for t in study.best_trials)

    code, out, err = run_cli(capsys, "best", "--storage", sqlite_url)
    assert code == 0 and "Pareto front" in err
    front = json.loads(out)
    assert sorted(row["trial"] for row in front) == expected
    by_number = {t.number: t for t in study.trials}
    for row in front:
        trial = by_number[row["trial"]]
        assert row["values"] == {"near_zero": trial.values[0], "near_two": trial.values[1]}
        assert row["params"] == trial.params
    code, out, _ = run_cli(capsys, "best", "--storage", sqlite_url, "--format", "yaml")
    assert code == 0 and yaml.safe_load(out) == front
    code, out, _ = run_cli(capsys, "best", "--storage", sqlite_url, "--format", "text")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["trial", "near_zero", "near_two", "x"]
    assert [line.split()[0] for line in lines[1:-1]] == [f"#{n}" for n in expected]
    assert lines[-1].startswith("front of expected values: ")  # the model's front, said after


def test_gpu_cost_as_objectives_and_an_oom_is_infeasible(sqlite_url, tmp_path, capsys):
    # Twice the declared memory is held on a 2 GB simulated GPU (400 MB + 2 MB a sample): the
    # first queued trial's batch does not fit, the second's does.
    queued = tmp_path / "first.yaml"
    point = {"x": 0.5, "y": 0.5, "learning_rate": 0.01, "activation": "relu"}
    queued.write_text(yaml.safe_dump([{**point, "batch_size": 1300}, {**point, "batch_size": 64}]))
    code, _, err = run_cli(
        capsys, "run", "synthetic", "--objectives", "loss,vram_peak_mb,seconds",
        "--trials", "3", "--storage", sqlite_url, "--gpus", "sim:2000", "--enqueue", str(queued),
        "--sim-memory-scale", "2", "--option", "overhead_mb=200", "--option", "per_sample_mb=1",
        "--option", "trial_seconds=0.2", "--pruner", "none", "--max-retries", "0", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    study = optuna.load_study(study_name="synthetic", storage=sqlite_url)
    assert study.metric_names == ["loss", "vram_peak_mb", "seconds"]
    assert [d.name for d in study.directions] == ["MINIMIZE"] * 3
    ooms = [t for t in study.trials if t.user_attrs.get("oom")]
    fitted = [t for t in study.trials if t.state == TrialState.COMPLETE and t not in ooms]
    assert 0 in {t.number for t in ooms} and 1 in {t.number for t in fitted}
    for trial in ooms:  # told, not missing: infeasible for constrained samplers and the front
        assert trial.state == TrialState.COMPLETE and trial.values[0] == math.inf
        assert trial.constraints == {"fits_gpu_memory": 1.0}
    for trial in fitted:
        loss, vram, seconds = trial.values
        assert vram == pytest.approx(trial.user_attrs["vram_peak_mb"], abs=0.1)
        assert 0.2 <= seconds < 120 and trial.constraints == {"fits_gpu_memory": 0.0}
    code, out, _ = run_cli(capsys, "best", "--storage", sqlite_url)
    on_front = {row["trial"] for row in json.loads(out)}
    assert on_front and on_front <= {t.number for t in fitted}


def test_a_plain_optuna_study_is_adopted_or_refused_with_what_differs(sqlite_url):
    name = "mlp"
    plain = optuna.create_study(study_name=name, storage=sqlite_url)
    plain.optimize(lambda t: quadratic(t, "cpu"), n_trials=3)
    adopted = orchestrator.optimize(
        quadratic, n_trials=5, storage=sqlite_url, study_name=name, **QUICK
    )
    assert len(adopted.trials) == 5 and load_spec(adopted).trials == 5

    other = optuna.create_study(study_name="up", storage=sqlite_url, direction="maximize")
    other.optimize(lambda t: quadratic(t, "cpu"), n_trials=1)
    with pytest.raises(UserError, match="created with directions maximize"):
        orchestrator.optimize(quadratic, n_trials=3, storage=sqlite_url, study_name="up", **QUICK)
    refused = optuna.load_study(study_name="up", storage=sqlite_url)
    assert len(refused.trials) == 1 and SPEC_ATTR not in refused.user_attrs


def test_objectives_are_planned_and_told_by_one_rule():
    assert plan_objectives(None, None, metric="loss", direction="minimize") == (
        ["loss"],
        ["minimize"],
    )
    assert plan_objectives(
        ["sharpe", "vram_peak_mb", "seconds"], None, metric="sharpe", direction="maximize"
    ) == (["sharpe", "vram_peak_mb", "seconds"], ["maximize", "minimize", "minimize"])
    with pytest.raises(ValueError, match="start with sharpe"):
        plan_objectives(["loss", "seconds"], None, metric="sharpe", direction="maximize")
    with pytest.raises(ValueError, match="'sharpe' is neither"):
        plan_objectives(["seconds", "sharpe"], None, metric="sharpe", direction="maximize")
    dirs = ["maximize", "minimize"]
    kept = told(objectives=["sharpe", "seconds"], directions=dirs, state="COMPLETE",
                value=1.5, oom=False, vram_peak_mb=900.0, seconds=12.0)  # fmt: skip
    assert (kept.state, kept.values, kept.violation) == ("COMPLETE", [1.5, 12.0], 0.0)
    oom = told(objectives=["sharpe", "seconds"], directions=dirs, state="FAIL",
               value=None, oom=True, vram_peak_mb=2000.0, seconds=3.0)  # fmt: skip
    assert (oom.state, oom.values, oom.violation) == ("COMPLETE", [-math.inf, 3.0], 1.0)
    plain_oom = told(objectives=None, directions=["minimize"], state="FAIL",
                     value=None, oom=True, vram_peak_mb=None, seconds=1.0)  # fmt: skip
    assert (plain_oom.state, plain_oom.values) == ("FAIL", None)  # re-run, as before


def test_logs_of_a_trial_that_printed_nothing_says_so(sqlite_url, tmp_path, capsys, monkeypatch):
    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.trials.notes import trial_note

    monkeypatch.chdir(tmp_path)
    Path("trial-0.log").write_text("")
    study = optuna.create_study(
        study_name="quiet", storage=open_storage(StorageLocation.parse(sqlite_url))
    )
    trial = study.ask()
    trial.set_user_attr("log_file", "trial-0.log")  # relative, as `--log-dir logs` gives
    study.tell(trial, 1.0)
    code, out, err = run_cli(capsys, "logs", "--study", "quiet", "--trial", "0",
                             "--storage", sqlite_url)  # fmt: skip
    assert code == 0 and out == ""
    assert err.strip() == "trial 0's log trial-0.log is empty: the trial printed nothing"
    # The dashboard note names the log by its absolute path: the dashboard runs elsewhere.
    note = trial_note(study.trials[0], metric="loss")
    assert f"`{tmp_path / 'trial-0.log'}`" in note


def test_a_batch_size_drawn_otherwise_says_what_the_objective_must_call(sqlite_url):
    # As study.optimize raises the objective's error, the first trial's mismatch is raised.
    with pytest.raises(ValueError, match=r"call trial.suggest_int\('batch_size', 32, 1024"):
        orchestrator.optimize(
            draws_its_own_batch, n_trials=3, storage=sqlite_url, batch_sizes=(32, 1024),
            max_retries=0, **QUICK,
        )  # fmt: skip
    study = optuna.load_study(study_name="tests.optuna_objectives:draws_its_own_batch",
                              storage=sqlite_url)  # fmt: skip
    (trial,) = study.trials  # stopped at the first
    assert trial.state == TrialState.FAIL
    assert "call trial.suggest_int('batch_size', 32, 1024, log=True)" in trial.user_attrs["error"]


def test_sampler_grid_walks_the_config_file_s_grid_once(sqlite_url, tmp_path, capsys):
    config = tmp_path / "grid.toml"
    config.write_text(
        'adapter = "synthetic"\nsampler = "grid"\n'
        'grid = {x = [-1.0, 1.0], activation = ["relu", "tanh"]}\n'
    )
    code, _, err = run_cli(
        capsys, "run", "--config", str(config), "--storage", sqlite_url, "--gpus", "none",
        "--option", "trial_seconds=0", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    study = optuna.load_study(study_name="synthetic", storage=sqlite_url)
    points = sorted((t.params["x"], t.params["activation"]) for t in study.trials)
    # The budget is one walk of the grid; parameters not in it stay at the adapter's defaults.
    assert points == [(-1.0, "relu"), (-1.0, "tanh"), (1.0, "relu"), (1.0, "tanh")]
    assert {t.params["learning_rate"] for t in study.trials} == {0.01}
    assert not any(t.state == TrialState.FAIL for t in study.trials)
    code, _, err = run_cli(
        capsys, "run", "synthetic", "--study", "g2", "--grid", "x=1,2", "--storage", sqlite_url
    )
    assert code == 2 and "add --sampler grid" in err


def test_the_private_names_we_read_are_where_optuna_keeps_them(tmp_path):
    """orchestrator.record.store.optuna_private against the installed Optuna: each name still says
    what it did (an upgrade that moves one fails here, not in a trial process)."""
    import importlib

    from orchestrator.record.store import optuna_private as private

    url = f"sqlite:///{tmp_path / 'private.db'}"
    study = optuna.create_study(study_name="private", storage=url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    storage = private.storage_of(study)
    assert private.study_id_of(study) == storage.get_study_id_from_name("private")
    frozen = study.trials[1]
    assert private.trial_id_of(frozen) == storage.get_trial_id_from_study_id_trial_number(
        private.study_id_of(study), 1
    )
    backend = getattr(storage, "_backend", storage)
    models = private.rdb_models()
    with private.scoped_session(backend) as session:
        assert session.query(models.TrialModel).count() == 2
    rdb = importlib.import_module(private.RDB_STORAGE_LOGGER)  # the logger is its module's name
    assert rdb.__name__ == private.RDB_STORAGE_LOGGER and hasattr(rdb, "RDBStorage")


def test_the_private_reaches_still_do_what_they_did(tmp_path):
    """The rest of optuna_private against the installed Optuna: the cache under a loaded
    study, a trial's own copy, its fixed parameters, a distribution's range, the RDBStorage
    methods the riding storage overrides."""
    import importlib

    from optuna.distributions import FloatDistribution
    from optuna.storages import RDBStorage

    from orchestrator.record.store import optuna_private as private

    url = f"sqlite:///{tmp_path / 'private.db'}"
    optuna.create_study(study_name="private", storage=url)
    study = optuna.load_study(study_name="private", storage=url)
    assert isinstance(private.rdb_storage_of(private.storage_of(study)), RDBStorage)
    study.enqueue_trial({"x": 0.25})
    trial = study.ask()
    assert private.fixed_params_of(trial) == {"x": 0.25}
    assert private.cached_trial_of(trial).number == trial.number
    assert private.distribution_contains(FloatDistribution(0, 1), 0.5)
    assert not private.distribution_contains(FloatDistribution(0, 1), 2.0)
    private.forget_cached_trials(study)
    assert [t.number for t in private.study_trials(study, use_cache=False)] == [0]
    for name in (
        private.SET_TRIAL_PARAM,
        private.GET_BEST_TRIAL_ID,
        private.GET_STALE_TRIAL_IDS,
        private.CREATE_NEW_TRIAL,
        private.GET_TRIALS,
        "_get_prepared_new_trial",
        "_set_trial_attr_without_commit",
    ):
        assert callable(getattr(RDBStorage, name)), name
    assert hasattr(private.storage_of(study), "_add_trials_to_cache")
    assert importlib.import_module(private.RDB_MODELS_MODULE) is private.rdb_models()
