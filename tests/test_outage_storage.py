"""Storage calls ride out a real PostgreSQL restart and a stop of several seconds.

While a cluster of the test's own is restarted and then stopped for longer than a heartbeat
interval, three loops go on in one process, as a worker's do: our records (a row per trial), the
budget lock around Optuna's ask followed by a tell, and the heartbeat of a trial that is
training all along. Afterwards nothing is lost or doubled, no trial is left RUNNING, no lock is
left held, and the outage took one line to go and one to come back.
"""

from __future__ import annotations

import logging
import threading
import time

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.record.outages import riding as outage
from orchestrator.record.outages import state as outage_state
from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.locks import under_budget_lock
from orchestrator.record.store.migrate import open_storage
from tests.pg_cluster import PgCluster
from tests.waiting import wait_for

optuna.logging.set_verbosity(optuna.logging.WARNING)

STOPPED_S = 6.0  # longer than the heartbeat interval below, and than a few backoff steps
HEARTBEAT_S = 1.0


@pytest.fixture
def cluster():
    with PgCluster.create() as made:
        yield made


@pytest.fixture
def state(monkeypatch):
    """A fresh per-process outage state, so that the lines counted are this test's."""
    fresh = outage_state.Outages(log=logging.getLogger("test.outage.storage"))
    monkeypatch.setattr(outage_state, "OUTAGES", fresh)
    monkeypatch.setenv(outage.RETRY_ENV, "60")
    return fresh


class Loop(threading.Thread):
    """Runs `step` until told to stop; counts the steps that returned, keeps the first error."""

    def __init__(self, step) -> None:
        super().__init__(daemon=True)
        self.step, self.done, self.error = step, 0, None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.step(self.done)
                self.done += 1
                time.sleep(0.02)
        except BaseException as error:  # the test reports it
            self.error = error

    def finish(self) -> None:
        self.stopping.set()
        self.join(90)
        assert not self.is_alive(), "a loop is stuck"
        if self.error is not None:
            raise self.error


def _heartbeat_age_s(engine: sa.Engine, trial_id: int) -> float:
    from optuna.storages._rdb import models

    beats = models.TrialHeartbeatModel.__table__
    with engine.connect() as conn:
        query = sa.select(sa.func.extract("epoch", sa.func.now() - beats.c.heartbeat)).where(
            beats.c.trial_id == trial_id
        )
        return float(conn.execute(query).scalar())


def test_records_locks_and_optuna_ride_out_a_restart_and_a_stop(cluster, state, caplog):
    url = cluster.create_database("ride")
    storage = open_storage(StorageLocation.parse(url), heartbeat=True)
    study = optuna.create_study(storage=storage, study_name="ride")
    engine = storage.engine

    def record(number: int) -> None:
        records.record_trial_vram(
            engine,
            study_name="ride",
            trial_number=number,
            host="test",
            gpu_index=None,
            gpu_name="cpu",
            vram_peak_mb=float(number),
            oom=False,
            state="COMPLETE",
        )

    def ask_and_tell(number: int) -> None:
        trial = under_budget_lock(
            StorageLocation.parse(url), "ride", study.ask, what="ask for a trial"
        )
        x = trial.suggest_float("x", 0.0, 1.0)
        trial.set_user_attr("loop", number)
        study.tell(trial, x)

    training = study.ask()
    training.suggest_float("x", 0.0, 1.0)

    loops = [Loop(record), Loop(ask_and_tell)]
    with caplog.at_level(logging.INFO, logger="test.outage.storage"):
        with outage.Heartbeat(storage, training._trial_id, HEARTBEAT_S, outages=state):
            for loop in loops:
                loop.start()
            time.sleep(1.5)
            cluster.restart()
            time.sleep(1.5)
            cluster.stop()
            stopped_at = time.monotonic()
            time.sleep(STOPPED_S)
            during = [loop.done for loop in loops]
            cluster.start()
            time.sleep(2 * HEARTBEAT_S + 1)
            for loop in loops:
                loop.finish()
            beat_age = _heartbeat_age_s(engine, training._trial_id)
        study.tell(training, 0.5)
    assert beat_age < 2 * HEARTBEAT_S + 1, "the heartbeat did not come back after the outage"
    assert time.monotonic() - stopped_at > STOPPED_S

    written, asked = (loop.done for loop in loops)
    assert all(
        done > during_stop for done, during_stop in zip([written, asked], during, strict=True)
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(records.trial_vram.c.trial_number).where(
                records.trial_vram.c.study_name == "ride"
            )
        ).all()
        advisory = conn.execute(
            sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        ).scalar()
    numbers = sorted(row[0] for row in rows)
    assert numbers == list(range(written)), "a record was lost or written twice"
    trials = optuna.load_study(study_name="ride", storage=url).trials
    states = [t.state for t in trials]
    # Every ask made one trial, even one whose commit lost its connection: none is left RUNNING.
    assert states.count(TrialState.COMPLETE) == asked + 1 == len(trials), (asked, states)
    assert sorted(t.user_attrs["loop"] for t in trials if "loop" in t.user_attrs) == list(
        range(asked)
    )
    assert advisory == 0, "a budget lock outlived its section"

    # The outage's own lines, from the logger this test gave it: not Optuna's or anyone else's
    # (another test may have left Optuna at INFO, and its "A new study created" would count).
    lines = [r.getMessage() for r in caplog.records if r.name == "test.outage.storage"]
    gone = [line for line in lines if "went away" in line]
    back = [line for line in lines if "is back" in line]
    # The stop is always seen; the restart (a fraction of a second) may pass unnoticed.
    assert 1 <= len(gone) <= 2 and len(back) == len(gone), lines
    assert len(lines) == len(gone) + len(back), lines
    assert float(back[-1].split("after ")[1].split(" s")[0]) >= STOPPED_S - 1


def test_a_training_trial_keeps_training_and_its_reports_arrive_later(cluster, state):
    """Reports made while the database is away wait in the reporter; training goes on."""
    from adapters.base import reporter

    url = cluster.create_database("train")
    study = optuna.create_study(
        storage=open_storage(StorageLocation.parse(url)), study_name="train"
    )
    trial = study.ask()
    report = reporter(trial)
    cluster_stopped, restarting = threading.Event(), threading.Event()

    def stop_for_a_while() -> None:
        cluster.stop()
        cluster_stopped.set()
        time.sleep(3)
        restarting.set()
        cluster.start()

    stopper = threading.Timer(0.5, stop_for_a_while)
    stopper.start()
    epochs, during_outage = 0, 0
    # At least 30 epochs of 0.2 s, and on until the restart began (a slow stop must not let the
    # loop end before the outage).
    while epochs < 30 or not restarting.is_set():
        if cluster_stopped.is_set() and not restarting.is_set():
            during_outage += 1
        report(epochs, float(epochs))
        time.sleep(0.2)
        epochs += 1
    stopper.join()
    report.flush()
    study.tell(trial, 1.0)
    # Training went on while the database was away: a report that waited for it would leave one
    # epoch in the outage's 3 s; going on, about 15 (at least 4 on a loaded machine). Counted,
    # not timed, so that the machine's load cannot fail it.
    assert during_outage >= 4, during_outage
    told = optuna.load_study(study_name="train", storage=url).trials[0]
    assert told.intermediate_values == {epoch: float(epoch) for epoch in range(epochs)}


def test_a_process_the_study_starts_waits_for_the_database_to_open(cluster, state):
    """A trial process started during an outage waits for the storage; a command does not."""
    from orchestrator.errors import UserError
    from orchestrator.record.store.storage import create_storage

    url = cluster.create_database("opening")
    cluster.stop()
    started = time.monotonic()
    with pytest.raises(UserError, match="cannot reach the storage"):
        create_storage(StorageLocation.parse(url))
    assert time.monotonic() - started < 5
    threading.Timer(3, cluster.start).start()
    storage = create_storage(StorageLocation.parse(url), wait=True)
    assert time.monotonic() - started >= 3
    assert storage.get_all_studies() == []
    assert state.outages == 1 and state.began_at is None


def test_a_fused_group_beats_every_member_in_one_thread(tmp_path):
    """`Heartbeat.add`: a group's later members join its first one's thread; each member's
    heartbeat row moves on at every beat."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'beat.db'}", heartbeat_interval=60)
    study = optuna.create_study(storage=storage)
    first, second = study.ask(), study.ask()

    def beats() -> dict[int, str]:
        with storage.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT trial_id, heartbeat FROM trial_heartbeats"))
            return {trial_id: at for trial_id, at in rows}

    both = {first._trial_id, second._trial_id}
    before = threading.active_count()
    with outage.Heartbeat(storage, first._trial_id, 0.05) as beat:
        beat.add(second._trial_id)
        # Waited for, not slept: beside the suite the thread's first beat may come late.
        then = wait_for(lambda: (rows := beats()).keys() == both and rows, "both members' beats")
        assert threading.active_count() == before + 1
        # SQLite keeps the heartbeat to the second: each row moves on within a few beats.
        wait_for(lambda: all(beats()[t] > then[t] for t in both), "both rows to move on")
