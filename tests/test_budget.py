"""Which trials count towards `--trials N`, and when a worker may ask for another."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState, create_trial

from orchestrator.record.study.spec import (
    BudgetCount,
    StudySpec,
    count_trials,
    load_spec,
    save_spec,
)


def _trial(number, state, **system_attrs):
    trial = create_trial(
        state=state, value=1.0 if state == TrialState.COMPLETE else None, system_attrs=system_attrs
    )
    trial.number = number
    return trial


def test_a_failure_that_was_re_queued_does_not_count():
    trials = [
        _trial(0, TrialState.COMPLETE),
        _trial(1, TrialState.FAIL),  # re-queued as trial 3
        _trial(2, TrialState.FAIL),  # final
        _trial(3, TrialState.WAITING, retry_history=[1], failed_trial=1),
        _trial(4, TrialState.PRUNED),
        _trial(5, TrialState.RUNNING),
    ]
    count = count_trials(trials)
    assert count == BudgetCount(complete=1, pruned=1, failed=1, retried=1, running=1, waiting=1)
    assert count.counted == 3


def test_asking_respects_the_budget():
    assert BudgetCount(complete=4, running=1).may_ask(6)
    assert not BudgetCount(complete=5, running=1).may_ask(6)
    # A waiting re-run is inside the budget already: it may always be handed over.
    assert BudgetCount(complete=5, running=0, waiting=1).may_ask(6)
    assert not BudgetCount(complete=6).may_ask(6)


def test_finished_only_when_counted_and_nothing_runs():
    assert BudgetCount(complete=6).finished(6)
    assert not BudgetCount(complete=5, failed=1, running=1).finished(6)
    assert not BudgetCount(complete=5, waiting=1).finished(6)


def test_spec_round_trips_through_the_study():
    study = optuna.create_study()
    spec = StudySpec(
        adapter="synthetic",
        trials=8,
        epochs=3,
        direction="minimize",
        options={"trial_seconds": 0.1},
    )
    save_spec(study, spec)
    assert load_spec(study) == spec
    assert load_spec(study).updated(trials=10, epochs=None).trials == 10


def test_the_result_says_the_trials_that_failed_and_were_re_run(tmp_path):
    from orchestrator.result import outcome_lines, outcome_of

    study = optuna.create_study(study_name="six", storage=f"sqlite:///{tmp_path / 'six.db'}")
    for value in range(5):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=float(value)))
    study.add_trial(create_trial(state=TrialState.FAIL))  # trial 5, re-run as trial 6
    study.add_trial(
        create_trial(state=TrialState.COMPLETE, value=9.0, system_attrs={"retry_history": [5]})
    )
    spec = StudySpec(adapter="synthetic", trials=6, epochs=1, direction="minimize")
    outcome = outcome_of(study, spec, interrupted=False)
    assert (outcome.counted, outcome.failed, outcome.retried) == (6, 0, 1)
    line = outcome_lines(outcome, metric="value", as_json=False)[0]
    assert line == (
        "study 'six': 6/6 trials done (6 complete, 0 pruned, 0 failed; 1 failed and re-run), "
        "0 out-of-memory"
    )
    assert '"retried": 1' in outcome_lines(outcome, metric="value", as_json=True)[0]
