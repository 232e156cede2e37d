"""A study's budget count straight from the database: one small query, whatever its size.

`orchestrator.record.study.spec.count_trials` counts trials already in memory; this asks the database for
the same numbers without reading the trials, so the step that must hold the budget lock (count,
then create) costs the same with 10 trials in the study as with 10,000. A failed trial counts
as re-queued when a re-run names it last in its `retry_history` (Optuna's format, which
`orchestrator.record.trials.retry.requeue` writes too): only re-runs have that attribute, so that part
of the query returns a row per re-run, not per trial.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.budget.section import connection_for, counted
from orchestrator.record.store.optuna_private import rdb_models
from orchestrator.record.study.spec import BudgetCount

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from sqlalchemy.engine import Engine
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")


def _state(value: Any) -> Any:
    # A union's first column comes back as the enum, or as its name where the driver says so.
    states = optuna.trial.TrialState
    return value if isinstance(value, states) else states[str(value)]


def stored_count(engine: Engine, study_id: int) -> BudgetCount:
    models = rdb_models()
    trials = models.TrialModel.__table__
    system = models.TrialSystemAttributeModel.__table__
    by_state = (
        sa.select(trials.c.state, sa.func.count(), sa.null().label("history"))
        .where(trials.c.study_id == study_id)
        .group_by(trials.c.state)
    )
    histories = (
        sa.select(sa.null(), sa.null(), system.c.value_json)
        .select_from(system.join(trials, system.c.trial_id == trials.c.trial_id))
        .where(trials.c.study_id == study_id, system.c.key == "retry_history")
    )
    # One round trip: under the budget lock every round trip is time the lock is held.
    states: dict[optuna.trial.TrialState, int] = {}
    requeued: set[int] = set()
    with connection_for(engine) as connection:  # inside the budget section: its own connection
        for state, n, history in connection.execute(sa.union_all(by_state, histories)):
            if history is not None:
                if history:
                    requeued.add(json.loads(history)[-1])
            elif state is not None:
                states[_state(state)] = int(n)
    failed = states.get(optuna.trial.TrialState.FAIL, 0)
    retried = min(failed, len(requeued))
    counted(engine, states.get(optuna.trial.TrialState.WAITING, 0))
    return BudgetCount(
        complete=states.get(optuna.trial.TrialState.COMPLETE, 0),
        pruned=states.get(optuna.trial.TrialState.PRUNED, 0),
        failed=failed - retried,
        retried=retried,
        running=states.get(optuna.trial.TrialState.RUNNING, 0),
        waiting=states.get(optuna.trial.TrialState.WAITING, 0),
    )
