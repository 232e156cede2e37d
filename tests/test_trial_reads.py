"""The database-side reads the pool and the views use instead of reading every trial through
Optuna: the budget count and the lean trial reader agree with Optuna's own answers."""

from __future__ import annotations

import math

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.record.budget.counts import stored_count
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials.reader import read_trials
from orchestrator.record.trials.retry import requeue

DISTS = {
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "batch_size": IntDistribution(64, 4096, log=True),
    "act": CategoricalDistribution(["relu", "gelu", None]),
}


def _study(url: str) -> optuna.Study:
    storage = open_storage(StorageLocation.parse(url))
    study = optuna.create_study(study_name="reads", storage=storage)
    for i, state in enumerate(
        [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL]
    ):
        study.add_trial(
            create_trial(
                state=state,
                params={
                    "lr": 10 ** -(i + 1),
                    "batch_size": 64 * 2**i,
                    "act": ["relu", "gelu", None, "relu"][i],
                },
                distributions=DISTS,
                value=float(i) if state == TrialState.COMPLETE else None,
                intermediate_values={0: 1.0, 1: math.inf, 2: -math.inf} if i == 1 else {},
                user_attrs={"gpu": "sim", "oom": i == 2, "nested": {"a": [1, 2]}},
            )
        )
    failed = study.trials[2]
    requeue(study, failed, max_retries=2, reason="oom")  # a WAITING re-run of trial 2
    study.add_trial(create_trial(state=TrialState.RUNNING, params={}, distributions={}))
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            params={"lr": 0.5e-2},
            distributions={"lr": DISTS["lr"]},
            value=math.inf,
        )
    )
    return study


def test_the_stored_count_is_the_count_of_the_trials(storage_url):
    study = _study(storage_url)
    stored = stored_count(study._storage._backend.engine, study._study_id)
    assert stored == count_trials(study.trials)
    assert (stored.complete, stored.pruned, stored.failed, stored.retried) == (2, 1, 1, 1)
    assert (stored.running, stored.waiting) == (1, 1)


def test_the_lean_reader_returns_the_trials_optuna_returns(storage_url):
    study = _study(storage_url)
    ours = read_trials(study._storage._backend.engine, study._study_id, intermediate_values=True)
    theirs = study.trials
    assert [t.number for t in ours] == [t.number for t in theirs]
    for mine, optunas in zip(ours, theirs, strict=True):
        assert mine.state == optunas.state
        assert mine.values == optunas.values
        assert mine.params == optunas.params
        assert mine.distributions == optunas.distributions
        assert mine.user_attrs == optunas.user_attrs
        assert mine.intermediate_values == optunas.intermediate_values
        assert mine.datetime_start == optunas.datetime_start
        assert mine.datetime_complete == optunas.datetime_complete
        assert mine._trial_id == optunas._trial_id
        expected_system = {
            k: v for k, v in optunas.system_attrs.items() if k in ("retry_history", "fixed_params")
        }
        assert mine.system_attrs == expected_system
    without = read_trials(study._storage._backend.engine, study._study_id)
    assert all(t.intermediate_values == {} for t in without)


def test_user_attributes_written_at_once_read_back_as_optuna_s(storage_url):
    from orchestrator.record.trials.attrs import set_user_attrs

    study = optuna.create_study(
        study_name="attrs", storage=open_storage(StorageLocation.parse(storage_url))
    )
    trial = study.ask()
    trial.set_user_attr("gpu", "before")
    set_user_attrs(trial, {"gpu": "sim:0", "batch_bounds": [64, 4096], "gpu_index": None})
    assert trial.user_attrs == {"gpu": "sim:0", "batch_bounds": [64, 4096], "gpu_index": None}
    study.tell(trial, 1.0)
    (stored,) = optuna.load_study(study_name="attrs", storage=storage_url).trials
    assert stored.user_attrs == {"gpu": "sim:0", "batch_bounds": [64, 4096], "gpu_index": None}
