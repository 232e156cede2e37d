"""`optimize` keeps Optuna's failure contract, through real trial processes: the objective's
first error is raised in the caller unless `catch` names it; a one-argument objective runs; a
wrong argument is refused in the API's own words before anything is stored."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import orchestrator
from orchestrator.record.store.location import StorageLocation
from tests import api_failing

FAST = {"gpus": "sim:24576", "pruner": "none", "concurrency": 1}


def _stored(url: str) -> list[str]:
    try:
        return [s.study_name for s in optuna.get_all_study_summaries(url)]
    except Exception:  # no database: nothing stored either
        return []


def test_a_one_argument_objective_runs_as_in_optuna(sqlite_url):
    study = orchestrator.optimize(api_failing.one_argument, n_trials=3, storage=sqlite_url, **FAST)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    # optuna-dashboard shows each setting as a user attribute of its own, not one JSON string.
    assert study.user_attrs["setting: trials"] == 3
    assert study.user_attrs["setting: pruner"] == "none"
    assert study.user_attrs["option: overhead_mb"] == 0.0


def test_the_first_error_is_raised_with_its_own_type_and_the_run_stops(storage_url):
    with pytest.raises(api_failing.NotConverging, match="loss went to nan at step 0") as raised:
        orchestrator.optimize(api_failing.always_raises, n_trials=6, storage=storage_url, **FAST)
    assert any("trial 0 raised this" in note for note in raised.value.__notes__)
    study = optuna.load_study(
        study_name="tests.api_failing:always_raises", storage=StorageLocation.parse(storage_url).url
    )
    assert len([t for t in study.trials if t.state == TrialState.FAIL]) < 6  # it stopped


def test_catch_lets_the_study_go_on_past_the_errors_it_names(sqlite_url):
    study = orchestrator.optimize(
        api_failing.raises_value_error_on_even,
        n_trials=4,
        storage=sqlite_url,
        catch=(ValueError,),
        **FAST,
    )
    states = [t.state for t in sorted(study.trials, key=lambda t: t.number)]
    assert states == [TrialState.FAIL, TrialState.COMPLETE] * 2


def test_two_objectives_calling_report_fail_at_the_first_trial(sqlite_url):
    with pytest.raises(NotImplementedError, match="report"):
        orchestrator.optimize(
            api_failing.two_objectives_reporting,
            n_trials=5,
            directions=["minimize", "maximize"],
            storage=sqlite_url,
            **FAST,
        )


def test_a_batch_size_mismatch_stops_at_the_first_trial(sqlite_url):
    with pytest.raises(ValueError, match=r"suggest_int\('batch_size', 64, 1024, log=True\)"):
        orchestrator.optimize(
            api_failing.wrong_batch_range,
            n_trials=5,
            batch_sizes=(64, 1024),
            memory_model=(10.0, 0.01),
            storage=sqlite_url,
            **FAST,
        )


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"n_trials": 0}, ValueError, "n_trials=0 must be at least 1"),
        ({"epochs": 0}, ValueError, "epochs=0 must be at least 1"),
        ({"n_trials": "10"}, TypeError, "n_trials='10': give a whole number"),
        ({"max_retries": -1}, ValueError, "max_retries=-1 must be at least 0"),
        ({"seed": -1}, ValueError, "seed=-1 must be at least 0"),
        ({"study_name": ""}, ValueError, "study_name='' is empty"),
        ({"study_name": "x" * 600}, ValueError, "is 600 characters long"),
        ({"memory_model": (0.0, float("nan"))}, ValueError, "memory_model="),
        ({"batch_sizes": (128, 64)}, ValueError, "1 <= low <= high"),
        ({"memory_model": (0, 1e308), "batch_sizes": (64, 128)}, ValueError, "more than any GPU"),
        ({"catch": "ValueError"}, TypeError, "catch='ValueError': give exception classes"),
        ({"concurrency": 0}, ValueError, "concurrency=0 must be at least 1"),
        ({"grace": -1.0}, ValueError, "grace=-1.0 must be 0 or more seconds"),
        ({"timeout": "soon"}, TypeError, "timeout='soon': give int or float or None"),
        ({"gpus": "sim:abc"}, ValueError, "gpus="),
        ({"bogus": 1}, TypeError, "optimize() got an unexpected keyword argument 'bogus'"),
        ({"pruner": "nope"}, ValueError, "nope"),
        ({"fuse": "lots"}, ValueError, "fuse='lots' must be 'auto' or a whole number from 1"),
        ({"fuse": 0}, ValueError, "fuse=0 must be auto or a whole number from 1"),
    ],
)
def test_a_wrong_argument_is_refused_in_the_api_s_words_before_anything_is_stored(
    arguments, error, says, sqlite_url
):
    call = {"n_trials": 2, "storage": sqlite_url, **FAST, **arguments}
    with pytest.raises(error) as raised:
        orchestrator.optimize(api_failing.one_argument, **call)
    message = str(raised.value)
    assert says in message, message
    assert "--" not in message and "HostOptions" not in message, message
    assert _stored(sqlite_url) == []
