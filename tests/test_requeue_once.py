"""One re-run per failed trial, whoever queues it: the budget counts each re-queued failure once.

A trial interrupted by its host is re-queued by that host; if its heartbeat then also goes stale,
the look for lost trials would queue a second re-run of the same trial. Both re-runs would run,
and the study would end one trial past its budget (seen as 301 trials for a budget of 300).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from orchestrator.intensify import queued_reruns
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials.retry import requeue, retry_history


def test_a_failure_is_re_queued_once_whoever_asks(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db")
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    study.tell(trial, state=TrialState.FAIL)
    failed = study.trials[0]
    assert requeue(study, failed, max_retries=2, reason="interrupted")
    assert requeue(study, failed, max_retries=2, reason="lost"), "queued already: not refused"
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert len(waiting) == 1
    assert retry_history(waiting[0]) == [0]
    assert waiting[0].user_attrs  # the first re-queue's reason and origin are kept
    count = count_trials(study.trials)
    assert (count.retried, count.waiting, count.failed) == (1, 1, 0)


def test_an_intensify_re_run_s_retry_keeps_its_seeds_and_counts_once(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db")
    study.enqueue_trial({"x": 0.5}, user_attrs={"intensify_of": 0, "seed_offset": 3})
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    study.tell(trial, state=TrialState.FAIL)
    assert requeue(study, study.trials[0], max_retries=2, reason="oom")
    (retry,) = [t for t in study.trials if t.state == TrialState.WAITING]
    assert retry.user_attrs["seed_offset"] == 3  # the seeds of the re-run it replaces
    assert "intensify_of" not in retry.user_attrs  # the same re-run: --intensify counts it once
    assert queued_reruns(study.trials) == 1
