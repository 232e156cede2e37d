"""The budget section of a trial process: one connection, a transaction-scoped lock let go at the claim."""

from __future__ import annotations

import multiprocessing

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.record.budget.counts import stored_count
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.locks import under_budget_lock
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.store.storage import create_storage

BUDGET = 24


def _advisory_locks(url: str) -> int:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            # This database's only: the server is shared with other tests.
            query = (
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return int(conn.execute(sa.text(query)).scalar())
    finally:
        engine.dispose()


def _trial_process(url: str) -> int:
    """Ask and tell as a trial process does, until the budget is used; the trials it ran."""
    storage = create_storage(StorageLocation.parse(url), heartbeat=True, wait=True)
    study = optuna.load_study(study_name="section", storage=storage)

    def count_and_create() -> optuna.Trial | None:
        if not stored_count(storage.engine, study._study_id).may_ask(BUDGET):
            return None
        return study.ask()

    ran = 0
    while (
        trial := under_budget_lock(
            StorageLocation.parse(url), "section", count_and_create, what="ask"
        )
    ) is not None:
        study.tell(trial, float(trial.number))
        ran += 1
    return ran


def test_trial_processes_share_an_exact_budget_on_one_connection_each(postgres_url):
    study = optuna.create_study(
        study_name="section", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    study.enqueue_trial({})  # one waiting trial: popped under the lock, not created
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        ran = pool.map(_trial_process, [postgres_url] * 4)
    assert sum(ran) == BUDGET
    trials = optuna.load_study(study_name="section", storage=postgres_url).trials
    assert len(trials) == BUDGET
    assert all(t.state == TrialState.COMPLETE for t in trials)
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        beats = conn.execute(sa.text("SELECT count(*) FROM trial_heartbeats")).scalar()
    engine.dispose()
    assert beats == BUDGET, "every claimed trial got its heartbeat row with the claim"
    assert _advisory_locks(postgres_url) == 0


def test_the_lock_goes_at_the_claim_and_the_process_holds_one_connection(postgres_url):
    optuna.create_study(
        study_name="claim", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    storage = create_storage(StorageLocation.parse(postgres_url), heartbeat=True, wait=True)
    assert type(storage.engine.pool).__name__ == "OneAtATimePool"
    study = optuna.load_study(study_name="claim", storage=storage)
    seen: dict[str, int] = {}

    def section() -> optuna.Trial:
        stored_count(storage.engine, study._study_id)  # on the section's connection: no wait
        seen["before"] = _advisory_locks(postgres_url)
        trial = study.ask()
        seen["after"] = _advisory_locks(postgres_url)
        storage.record_heartbeat(trial._trial_id)  # the one connection, after the claim
        return trial

    trial = under_budget_lock(StorageLocation.parse(postgres_url), "claim", section, what="ask")
    assert seen == {"before": 1, "after": 0}
    assert storage.engine.pool.checkedout() == 0, "no connection held between calls"
    study.tell(trial, 1.0)
    assert study.trials[0].state == TrialState.COMPLETE
