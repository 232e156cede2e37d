"""A study's budget count straight from the database: two aggregate queries, whatever its size.

`orchestrator.study.count_trials` counts trials already in memory; this asks the database for
the same numbers without reading a single trial, so the step that must hold the budget lock
(count, then create) costs the same with 10 trials in the study as with 10,000.
A failed trial counts as re-queued when another trial names it in its `retry_of` user
attribute, which `orchestrator.retry.requeue` writes with every re-run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.study import BudgetCount

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def stored_count(engine: Engine, study_id: int) -> BudgetCount:
    import sqlalchemy as sa
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    trials = models.TrialModel.__table__
    attrs = models.TrialUserAttributeModel.__table__
    by_state = (
        sa.select(trials.c.state, sa.func.count())
        .where(trials.c.study_id == study_id)
        .group_by(trials.c.state)
    )
    retried = (
        sa.select(sa.func.count(sa.distinct(attrs.c.value_json)))
        .select_from(attrs.join(trials, attrs.c.trial_id == trials.c.trial_id))
        .where(trials.c.study_id == study_id, attrs.c.key == "retry_of")
    )
    with engine.connect() as connection:
        states = {state: int(n) for state, n in connection.execute(by_state)}
        requeued = int(connection.execute(retried).scalar() or 0)
    failed = states.get(TrialState.FAIL, 0)
    return BudgetCount(
        complete=states.get(TrialState.COMPLETE, 0),
        pruned=states.get(TrialState.PRUNED, 0),
        failed=failed - min(failed, requeued),
        retried=min(failed, requeued),
        running=states.get(TrialState.RUNNING, 0),
        waiting=states.get(TrialState.WAITING, 0),
    )
