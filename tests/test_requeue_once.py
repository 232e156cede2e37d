"""One re-run per failed trial, whoever queues it: the budget counts each re-queued failure once.

A trial interrupted by its host is re-queued by that host; if its heartbeat then also goes stale,
the look for lost trials would queue a second re-run of the same trial. Both re-runs would run,
and the study would end one trial past its budget (seen as 301 trials for a budget of 300).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

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
