"""A trial process's ask on PostgreSQL: the lock, the count and the claim in one round trip."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState, create_trial

from orchestrator.record.budget import claim as budget_claim
from orchestrator.record.budget import section as budget_section
from orchestrator.record.budget.claim import ask_within_budget, claim_trial
from orchestrator.record.budget.counts import stored_count
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.locks import lock_key
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.store.storage import create_storage


def _query(url: str, sql: str, **params: object) -> list[tuple]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(sql), params).all()]
    finally:
        engine.dispose()


def _advisory_locks(url: str) -> int:
    # This database's only: the server is shared with other tests.
    return _query(
        url,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
    )[0][0]


def _trial_process_study(url: str, name: str) -> optuna.Study:
    storage = create_storage(
        StorageLocation.parse(url), heartbeat=True, wait=True
    )  # as a trial process opens it
    return optuna.load_study(study_name=name, storage=storage)


def test_under_the_lock_there_is_one_round_trip_and_the_trial_comes_back_whole(postgres_url):
    optuna.create_study(study_name="one", storage=open_storage(StorageLocation.parse(postgres_url)))
    study = _trial_process_study(postgres_url, "one")
    storage = study._storage._backend
    sent: list[str] = []
    sa.event.listen(storage.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    claim = claim_trial(storage, study._study_id, "one", budget=5)
    assert claim is not None and claim.trial_id is not None
    # The lock, the count, the insert, the mark, the heartbeat and the commit: one string.
    assert len(sent) == 1, sent
    assert "pg_advisory_xact_lock" in sent[0] and "INSERT INTO trial_heartbeats" in sent[0]
    assert _advisory_locks(postgres_url) == 0, "the lock went with the claim's commit"
    state, beats, marks = _query(
        postgres_url,
        "SELECT t.state, (SELECT count(*) FROM trial_heartbeats h WHERE h.trial_id = t.trial_id),"
        " (SELECT count(*) FROM trial_system_attributes a WHERE a.trial_id = t.trial_id"
        "  AND a.key = 'orchestrator:ask') FROM trials t WHERE t.trial_id = :id",
        id=claim.trial_id,
    )[0]
    assert (str(state), beats, marks) == ("RUNNING", 1, 1)
    assert 0 <= claim.done_at - claim.locked_at < 5, "the server's own clock, granted to done"

    sent.clear()
    trial = ask_within_budget(study, StorageLocation.parse(postgres_url), 5)
    assert trial is not None and trial.number == 1
    assert sum("pg_advisory_xact_lock" in s for s in sent) == 1
    lock_at = next(i for i, s in enumerate(sent) if "pg_advisory_xact_lock" in s)
    assert lock_at == 0, "nothing is sent before the claim: no read of the study first"
    times = budget_section.last_times()
    assert times is not None and times.granted_at is not None and times.held_ms >= 0
    trial.suggest_float("x", 0, 1)  # Optuna's cache knows the trial
    study.tell(trial, 1.0)
    assert study.trials[1].state == TrialState.COMPLETE


def test_waiting_trials_are_claimed_first_with_their_fixed_params(postgres_url):
    study = optuna.create_study(
        study_name="queued", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    study.enqueue_trial({"x": 0.25})
    study.enqueue_trial({"x": 0.75})
    mine = _trial_process_study(postgres_url, "queued")
    seen = []
    while (trial := ask_within_budget(mine, StorageLocation.parse(postgres_url), 3)) is not None:
        seen.append((trial.number, trial.suggest_float("x", 0, 1)))
        mine.tell(trial, 0.0)
    assert seen[:2] == [(0, 0.25), (1, 0.75)], "queued first, in order, with their params"
    assert [n for n, _ in seen] == [0, 1, 2], "the waiting trials were inside the budget"
    claims = _query(
        postgres_url,
        "SELECT count(*) FROM trial_system_attributes WHERE key = 'orchestrator:claim'",
    )
    assert claims == [(2,)]


def _fill(url: str) -> optuna.Study:
    """A study with a trial in every state, one failure re-queued and one final."""
    study = optuna.create_study(
        study_name="mixed", storage=open_storage(StorageLocation.parse(url))
    )
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    study.add_trial(create_trial(state=TrialState.PRUNED))
    study.add_trial(create_trial(state=TrialState.FAIL))  # 2: re-queued as 5
    study.add_trial(create_trial(state=TrialState.FAIL))  # 3: final
    running = study.ask()  # 4
    study.add_trial(
        create_trial(state=TrialState.WAITING, system_attrs={"retry_history": [2]})
    )  # 5
    assert running.number == 4
    return study


def test_the_claim_counts_the_budget_as_the_study_counts_it(postgres_url):
    study = _fill(postgres_url)
    count = stored_count(study._storage._backend.engine, study._study_id)
    used = count.counted + count.running  # 1 complete, 1 pruned, 1 final failure, 1 running
    assert (used, count.waiting) == (4, 1)
    mine = _trial_process_study(postgres_url, "mixed")
    trial = ask_within_budget(mine, StorageLocation.parse(postgres_url), used)
    assert trial is not None and trial.number == 5, "a waiting re-run is handed out at the limit"
    mine.tell(trial, 1.0)
    assert ask_within_budget(mine, StorageLocation.parse(postgres_url), used + 1) is None, (
        "the re-run took the last"
    )
    trial = ask_within_budget(mine, StorageLocation.parse(postgres_url), used + 2)
    assert trial is not None and trial.number == 6
    assert ask_within_budget(mine, StorageLocation.parse(postgres_url), used + 2) is None


def test_a_retried_claim_finds_what_its_lost_answer_claimed(postgres_url):
    study = optuna.create_study(
        study_name="lost", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    storage = create_storage(StorageLocation.parse(postgres_url), heartbeat=True, wait=True)
    params = {
        "key": lock_key("budget:lost"),
        "study": study._study_id,
        "budget": 10,
        "mark": json.dumps("a-mark"),
        "retry": False,
        "start": None,
    }
    with storage.engine.connect() as conn:
        first = budget_claim._run_once(conn, params)
    with storage.engine.connect() as conn:  # the same ask again, its answer lost
        again = budget_claim._run_once(conn, {**params, "retry": True})
    assert first is not None and again is not None
    assert again.trial_id == first.trial_id
    assert _query(postgres_url, "SELECT count(*) FROM trials") == [(1,)]


def test_a_claim_waits_out_a_lock_held_longer_than_its_wait_slice(postgres_url):
    study = optuna.create_study(
        study_name="held", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    mine = _trial_process_study(postgres_url, "held")
    holder = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    taken, hold_s = threading.Event(), 8 * budget_section.LOCK_WAIT_SLICE_MS / 1000
    release_at: list[float] = []

    def hold() -> None:
        with holder.connect() as conn:
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key("budget:held")}
            )
            taken.set()
            time.sleep(hold_s)
            release_at.append(time.monotonic())
            conn.rollback()

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait(10)
    trial = ask_within_budget(mine, StorageLocation.parse(postgres_url), 1)
    got_at = time.monotonic()
    thread.join()
    holder.dispose()
    assert trial is not None and got_at >= release_at[0], "it waited for the holder"
    assert study.trials[0].state == TrialState.RUNNING


BUDGET = 60


def _asker(url: str) -> int:
    study = _trial_process_study(url, "crowd")
    ran = 0
    while (trial := ask_within_budget(study, StorageLocation.parse(url), BUDGET)) is not None:
        study.tell(trial, trial.suggest_float("x", 0, 1))
        ran += 1
    return ran


def test_many_trial_processes_share_an_exact_budget(postgres_url):
    study = optuna.create_study(
        study_name="crowd", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    for x in (0.1, 0.2, 0.3):
        study.enqueue_trial({"x": x})
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        ran = pool.map(_asker, [postgres_url] * 8)
    assert sum(ran) == BUDGET
    trials = optuna.load_study(study_name="crowd", storage=postgres_url).trials
    assert [t.number for t in trials] == list(range(BUDGET))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(t.params["x"] for t in trials[:3]) == [0.1, 0.2, 0.3]
    beats = _query(postgres_url, "SELECT count(*) FROM trial_heartbeats")
    assert beats == [(BUDGET,)], "every claimed trial got its heartbeat row with the claim"
    assert _advisory_locks(postgres_url) == 0


@pytest.mark.parametrize("heartbeat", [True, False])
def test_on_sqlite_the_ask_is_the_locked_section(sqlite_url, heartbeat):
    optuna.create_study(study_name="file", storage=open_storage(StorageLocation.parse(sqlite_url)))
    study = optuna.load_study(
        study_name="file",
        storage=create_storage(StorageLocation.parse(sqlite_url), heartbeat=heartbeat, wait=True),
    )
    study.enqueue_trial({"x": 0.5})
    numbers = []
    while (trial := ask_within_budget(study, StorageLocation.parse(sqlite_url), 3)) is not None:
        numbers.append(trial.number)
        study.tell(trial, trial.suggest_float("x", 0, 1))
    assert numbers == [0, 1, 2]
    assert study.trials[0].params == {"x": 0.5}
    times = budget_section.last_times()
    assert times is not None and times.granted_at is None


def test_the_count_sees_a_trial_made_by_the_lock_holder_it_waited_for(postgres_url):
    # The holder's trial and the lock's release land in one commit, while the claim waits in
    # its slice: under REPEATABLE READ one snapshot, taken before the grant, would miss it.
    name = sa.engine.make_url(postgres_url).database
    admin = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.execute(
            sa.text(
                f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
            )
        )
    study = optuna.create_study(
        study_name="late", storage=open_storage(StorageLocation.parse(postgres_url))
    )
    mine = _trial_process_study(postgres_url, "late")
    asked: list[optuna.Trial | None] = []
    waiter = threading.Thread(
        target=lambda: asked.append(ask_within_budget(mine, StorageLocation.parse(postgres_url), 1))
    )
    with admin.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key("budget:late")})
        waiter.start()
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        deadline = time.monotonic() + 30
        while not _query(postgres_url, waiting)[0][0] and time.monotonic() < deadline:
            time.sleep(0.005)
        conn.execute(
            sa.text(
                "INSERT INTO trials (number, study_id, state, datetime_start) "
                "VALUES (0, :s, 'RUNNING', now())"
            ),
            {"s": study._study_id},
        )
        conn.commit()  # the trial and the lock's release, at once
    waiter.join(30)
    admin.dispose()
    assert asked == [None], "the budget of 1 was used by the holder's trial"
    assert _query(postgres_url, "SELECT count(*) FROM trials") == [(1,)]


def test_an_ask_the_sampler_holds_back_waits_outside_the_budget_lock(storage_url):
    """Population-based training with every member training: the ask claims nothing and waits
    with the budget lock free (on SQLite the pool's look for lost trials takes it, and a pool
    waiting on it would admit no trial, not even the one holding the member the ask waits for).
    With `wait=False` it answers None at once; a member freed, the waiting ask gets it."""
    from orchestrator.record.checkpoints import lineage as names
    from orchestrator.record.store.locks import under_budget_lock
    from samplers import PBTSampler

    location = StorageLocation.parse(storage_url)
    optuna.create_study(study_name="pbt", storage=open_storage(location))
    storage = create_storage(location, heartbeat=True, wait=True)  # as a trial process opens it
    sampler = PBTSampler(population=2, interval=1, epochs=4, seed=5, wait_seconds=0.05)
    study = optuna.load_study(study_name="pbt", storage=storage, sampler=sampler)
    first, second = study.ask(), study.ask()  # both members train
    assert ask_within_budget(study, location, 10, wait=False) is None
    assert len(study.trials) == 2  # nothing claimed for it

    asked: list[optuna.Trial | None] = []
    waiting = threading.Thread(target=lambda: asked.append(ask_within_budget(study, location, 10)))
    waiting.start()
    time.sleep(0.5)
    assert waiting.is_alive() and len(study.trials) == 2
    took = threading.Thread(
        target=lambda: under_budget_lock(location, "pbt", lambda: None, what="look")
    )
    took.start()
    took.join(timeout=10)
    assert not took.is_alive(), "the waiting ask held the budget lock"
    study.tell(first, 0.5)
    waiting.join(timeout=30)
    assert not waiting.is_alive() and asked[0] is not None
    member = study.trials[asked[0].number].user_attrs[names.PBT_MEMBER]
    assert member == first.user_attrs[names.PBT_MEMBER] != second.user_attrs[names.PBT_MEMBER]
