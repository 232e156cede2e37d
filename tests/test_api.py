"""The Python API: a plain objective through the pools, as `run` would run it."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

import orchestrator
from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import load_spec
from tests.api_objective import objective


def test_a_plain_objective_runs_on_two_simulated_gpus_with_every_record(sqlite_url, tmp_path):
    study = orchestrator.optimize(
        objective,
        n_trials=6,
        storage=sqlite_url,
        gpus="sim:12288,sim:24576",
        memory_model=(200.0, 0.5),
        batch_sizes=(64, 4096),
        epochs=2,
        pruner="none",
        log_dir=str(tmp_path / "logs"),
    )
    assert study.study_name == "tests.api_objective:objective"  # module:function
    trials = study.trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert load_spec(study).trials == 6
    gpus = {t.user_attrs["gpu"] for t in trials}
    assert gpus <= {"Simulated GPU 12 GB", "Simulated GPU 24 GB"}
    rows = records.list_trial_vram(
        sa.create_engine(StorageLocation.parse(sqlite_url).url), study.study_name
    )
    assert sorted(r["trial_number"] for r in rows) == [t.number for t in trials]
    for trial in trials:
        batch = trial.params["batch_size"]
        assert trial.user_attrs["vram_planned_mb"] == pytest.approx(200.0 + 0.5 * batch, abs=0.1)
        assert trial.user_attrs["vram_peak_mb"] == pytest.approx(200.0 + 0.5 * batch, abs=0.1)
        assert trial.intermediate_values == pytest.approx({0: trial.value + 1.0, 1: trial.value})
        log = Path(trial.user_attrs["log_file"]).read_text()
        assert f"objective: x={trial.params['x']:.3f} batch={batch} on cpu" in log

    # Run again with more: the same study resumes to its new total, as `run --trials` does.
    again = orchestrator.optimize(
        objective, n_trials=8, storage=sqlite_url, gpus="sim:24576",
        memory_model=(200.0, 0.5), batch_sizes=(64, 4096), epochs=2, pruner="none",
    )  # fmt: skip
    assert len(again.trials) == 8


def _local_objective():
    def inner(trial, device):
        return 0.0

    return inner


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (lambda trial, device: 0.0, "is defined inside a function or is a lambda"),
        (_local_objective(), "is defined inside a function or is a lambda"),
        (42, "is not a function"),
    ],
)
def test_an_objective_trial_processes_cannot_import_is_refused_at_once(bad, says, sqlite_url):
    with pytest.raises(ValueError, match=says):
        orchestrator.optimize(bad, n_trials=1, storage=sqlite_url, gpus="none")
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing stored


def test_plan_says_what_this_host_would_run():
    plan = orchestrator.plan(gpus="sim:24576", memory_model=(1500.0, 1.0), n_trials=4)
    (gpu,) = plan.gpus
    assert gpu.slots == 4 and gpu.limited_by == "budget"
    assert gpu.batch_bounds == (64, 4096)
