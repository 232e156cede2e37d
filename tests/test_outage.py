"""Riding out a database outage (orchestrator.record.outages.riding): which errors, how long, what is said.

The decisions are tested with an injected clock and sleep (no waiting); the errors are real ones,
from a PostgreSQL cluster of the tests' own that they stop and restart, and from SQLite files.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

import optuna
import pytest
import sqlalchemy as sa

from orchestrator.errors import UserError
from orchestrator.record.outages import riding as outage
from orchestrator.record.outages import state as outage_state
from orchestrator.record.outages.errors import CONNECTION, LOCKED, first_line, outage_kind
from orchestrator.record.store import storage_failures
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.trials import stale as stale_trials
from tests.pg_cluster import PgCluster

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def cluster():
    with PgCluster.create() as made:
        yield made


def _error_of(engine: sa.Engine, statement: str) -> BaseException:
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    except Exception as error:  # the real error, as a storage call would see it
        return error
    raise AssertionError(f"{statement!r} did not fail")


class FakeTime:
    """A clock that moves only when someone sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def fake():
    time = FakeTime()
    log = logging.getLogger("test.outage")
    state = outage_state.Outages(
        clock=time.clock,
        sleep=time.sleep,
        jitter=lambda: 1.0,
        log=log,
        where="PostgreSQL at db:5432",
    )
    state.resume = "python -m orchestrator run synthetic --study s"
    return time, state


def connection_lost() -> BaseException:
    import psycopg2

    return sa.exc.OperationalError(
        "SELECT 1", {}, psycopg2.OperationalError("server closed the connection unexpectedly")
    )


def failing(times: int, error_factory=connection_lost):
    calls = {"n": 0}

    def call():
        calls["n"] += 1
        if calls["n"] <= times:
            raise error_factory()
        return "done"

    return call, calls


# --- which errors are outages, on real errors ------------------------------------------


def test_a_stopped_server_is_an_outage_and_a_bad_statement_is_not(cluster):
    url = cluster.create_database("kinds")
    engine = sa.create_engine(url, pool_pre_ping=True)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (id int PRIMARY KEY, name varchar(4))"))
        conn.execute(sa.text("INSERT INTO t VALUES (1, 'a')"))
    integrity = _error_of(engine, "INSERT INTO t VALUES (1, 'b')")
    too_long = _error_of(engine, "INSERT INTO t VALUES (2, 'much too long')")
    syntax = _error_of(engine, "SELEC 1")
    assert isinstance(integrity, sa.exc.IntegrityError) and outage_kind(integrity) is None
    assert isinstance(too_long, sa.exc.DataError) and outage_kind(too_long) is None
    assert isinstance(syntax, sa.exc.ProgrammingError) and outage_kind(syntax) is None

    # An administrator's shutdown of our session (57P01), as a fast restart does to every one.
    with engine.connect() as victim:
        pid = victim.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        with engine.begin() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(sa.exc.DBAPIError) as terminated:
            victim.execute(sa.text("SELECT 1"))
    assert outage_kind(terminated.value) == CONNECTION

    cluster.stop()
    try:
        refused = _error_of(engine, "SELECT 1")
    finally:
        cluster.start()
    assert outage_kind(refused) == CONNECTION
    assert "refused" in first_line(refused)
    engine.dispose()


def test_a_database_that_does_not_exist_is_no_outage(cluster):
    engine = sa.create_engine(cluster.database_url("no_such_database"))
    error = _error_of(engine, "SELECT 1")
    assert outage_kind(error) is None  # waiting will not create it
    engine.dispose()


def test_optuna_s_wrapped_error_is_judged_by_its_cause(cluster):
    """Optuna turns any error at commit into "invalid data in the commit": the cause decides."""
    from optuna.exceptions import StorageInternalError

    engine = sa.create_engine(cluster.create_database("wrapped"))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (name varchar(2))"))
    for statement, expected in [("INSERT INTO t VALUES ('abc')", None)]:
        cause = _error_of(engine, statement)
        try:
            raise StorageInternalError("invalid data in the commit") from cause
        except StorageInternalError as wrapped:
            assert outage_kind(wrapped) is expected
    cluster.stop()
    try:
        cause = _error_of(engine, "SELECT 1")
    finally:
        cluster.start()
    try:
        raise StorageInternalError("invalid data in the commit") from cause
    except StorageInternalError as wrapped:
        assert outage_kind(wrapped) == CONNECTION
    engine.dispose()


def test_a_locked_sqlite_file_is_a_short_outage_and_a_read_only_one_is_not(tmp_path):
    path = tmp_path / "s.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.1})
    locked = _error_of(engine, "INSERT INTO t VALUES (1)")
    holder.execute("ROLLBACK")
    holder.close()
    assert outage_kind(locked) == LOCKED

    reader = sa.create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    read_only = _error_of(reader, "INSERT INTO t VALUES (1)")
    assert outage_kind(read_only) is None
    assert "read-only" in str(storage_failures.storage_failure(read_only))
    engine.dispose()
    reader.dispose()


# --- the retry, on an injected clock ----------------------------------------------------


def test_an_outage_is_ridden_out_with_one_line_when_it_goes_and_one_when_it_is_back(fake, caplog):
    time, state = fake
    call, calls = failing(6)
    with caplog.at_level(logging.INFO, logger="test.outage"):
        assert outage.ride_out(call, what="tell trial 3", bound=60, outages=state) == "done"
    assert calls["n"] == 7
    # Capped exponential backoff: 0.5, 1, 2, 4, 8, 8 seconds.
    assert time.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the database (PostgreSQL at db:5432) went away: server closed")
    assert lines[1] == "the database (PostgreSQL at db:5432) is back after 24 s"
    assert state.outages == 1 and state.began_at is None


def test_after_the_bound_one_line_says_how_long_and_how_to_resume(fake):
    time, state = fake
    call, calls = failing(10**6)
    with pytest.raises(storage_failures.StorageUnreachable) as stopped:
        outage.ride_out(call, what="tell trial 3", bound=30, outages=state)
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("the database (PostgreSQL at db:5432) has been unreachable for 30 s")
    assert "while trying to tell trial 3" in message
    assert "`python -m orchestrator run synthetic --study s`" in message
    assert isinstance(stopped.value, UserError) and stopped.value.exit_status == 75
    assert sum(time.sleeps) == pytest.approx(30)  # the last pause is cut to the bound


def test_a_data_error_is_never_retried(fake):
    _time, state = fake
    call, calls = failing(1, lambda: sa.exc.IntegrityError("INSERT", {}, Exception("duplicate")))
    with pytest.raises(sa.exc.IntegrityError):
        outage.ride_out(call, what="insert", bound=60, outages=state)
    assert calls["n"] == 1 and state.outages == 0


def test_only_the_outermost_call_retries(fake):
    """A section (take the lock, count, ask) is redone whole, never resumed half-way."""
    _time, state = fake
    inner, inner_calls = failing(2)
    sections = {"n": 0}

    def section():
        sections["n"] += 1
        return outage.ride_out(inner, what="ask", bound=60, outages=state)

    assert outage.ride_out(section, what="ask under the lock", bound=60, outages=state) == "done"
    assert sections["n"] == 3 and inner_calls["n"] == 3


def test_many_threads_in_one_outage_say_it_once(caplog):
    """The state is per process: eight threads waiting through one outage log two lines."""
    down = threading.Event()
    down.set()
    state = outage_state.Outages(log=logging.getLogger("test.outage.threads"), jitter=lambda: 0.1)

    def call():
        if down.is_set():
            raise connection_lost()
        return 1

    results = []
    with caplog.at_level(logging.INFO, logger="test.outage.threads"):
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    outage.ride_out(call, what="work", bound=30, outages=state)
                )
            )
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        threading.Timer(0.3, down.clear).start()
        for thread in threads:
            thread.join(10)
    assert results == [1] * 8
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "went away" in messages[0] and "is back" in messages[1]


def test_stale_trials_are_not_failed_right_after_an_outage(fake):
    time, state = fake
    call, _ = failing(3)
    outage.ride_out(call, what="x", bound=60, outages=state)
    assert not state.quiet_for(40)
    time.now += 40
    assert state.quiet_for(40)


@pytest.mark.postgres
def test_heartbeats_get_the_grace_period_from_when_a_restart_is_first_seen(postgres_url, fake):
    """Behind PgBouncer the first call to reach a restarted server may come long after its start
    (PgBouncer retries a server it could not reach every 15 s): the trials' heartbeats, held as
    long, get the grace period from that look, not from the server's start."""
    time, state = fake
    study = optuna.create_study(storage=postgres_url)
    assert not stale_trials._server_restarted_within(study, 3.0, state)  # started long ago
    state.server_started = "an earlier start"  # as if this process saw the server before it
    assert stale_trials._server_restarted_within(study, 3.0, state)  # seen restarted just now
    time.now += 2
    assert stale_trials._server_restarted_within(study, 3.0, state)
    time.now += 2
    assert not stale_trials._server_restarted_within(study, 3.0, state)


@pytest.mark.postgres
def test_a_restart_this_process_said_as_an_outage_is_not_said_again(postgres_url, fake, caplog):
    """A host whose calls saw the restart as an outage said it ("went away", "is back"); its
    next look sees the server's new start: grace for the heartbeats, and no second line. A
    restart it did not say (its last outage ended before the server started, or a call was only
    held back, as PgBouncer holds them, with no line) is said."""
    time, state = fake
    study = optuna.create_study(storage=postgres_url)
    assert not stale_trials._server_restarted_within(study, 3.0, state)
    caplog.set_level(logging.WARNING, logger="orchestrator.record.outages.riding")
    state.server_started, state.said_back_at = "an earlier start", time.now  # just back
    assert stale_trials._server_restarted_within(study, 3.0, state)
    assert not [r for r in caplog.records if "restarted" in r.getMessage()]
    time.now += 10
    state.server_started, state.said_back_at = "an earlier start", -1e12  # before its start
    assert stale_trials._server_restarted_within(study, 3.0, state)
    assert len([r for r in caplog.records if "restarted" in r.getMessage()]) == 1
    time.now += 10
    state.server_started, state.said_back_at = "an earlier start", None
    state.held_back()  # a call held as PgBouncer holds it: no line was said
    assert stale_trials._server_restarted_within(study, 3.0, state)
    assert len([r for r in caplog.records if "restarted" in r.getMessage()]) == 2


def test_the_bound_comes_from_the_flag_through_the_environment(monkeypatch):
    monkeypatch.delenv(outage.RETRY_ENV, raising=False)
    assert outage.retry_seconds() == outage.DEFAULT_RETRY_SECONDS
    outage.set_retry_seconds(12)
    assert outage.retry_seconds() == 12.0
    monkeypatch.setenv(outage.RETRY_ENV, "soon")
    with pytest.raises(UserError, match="must be a number of seconds"):
        outage.retry_seconds()


def test_a_trial_asked_for_but_never_started_is_failed_and_re_run(sqlite_url, monkeypatch):
    """A connection lost as `ask` committed leaves a RUNNING trial with no heartbeat: Optuna never
    finds it stale, so it would hold the budget for ever. It is failed and re-queued."""
    import time

    from orchestrator.record.store.migrate import open_storage
    from orchestrator.record.trials.retry import stale_trial_callback

    monkeypatch.setattr(outage_state, "OUTAGES", outage_state.Outages())
    storage = open_storage(
        StorageLocation.parse(sqlite_url),
        heartbeat=True,
        heartbeat_stale_trial_callback=stale_trial_callback,
    )
    study = optuna.create_study(storage=storage, study_name="orphans")
    orphan = study.ask()
    orphan.suggest_float("x", 0.0, 1.0)
    alive = study.ask()
    storage.record_heartbeat(alive._trial_id)
    assert stale_trials.fail_stale_trials(study, grace_s=30)  # too young: nothing failed
    assert [t.state.name for t in study.trials] == ["RUNNING", "RUNNING"]
    time.sleep(1.2)
    storage.record_heartbeat(alive._trial_id)
    assert stale_trials.fail_stale_trials(study, grace_s=1)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "WAITING"]
    assert trials[2].system_attrs["retry_history"] == [0]


def _lose_the_first_answer(monkeypatch, owner, name: str) -> dict:
    """Let `owner.name` do its work, then raise a lost connection once, as a commit whose
    answer never came back: the caller cannot know that it landed."""
    original = getattr(owner, name)
    seen = {"calls": 0}

    def call(*args, **kwargs):
        seen["calls"] += 1
        result = original(*args, **kwargs)
        if seen["calls"] == 1:
            raise connection_lost()
        return result

    monkeypatch.setattr(owner, name, call)
    return seen


def test_an_ask_whose_answer_was_lost_makes_one_trial(sqlite_url, monkeypatch):
    import orchestrator.record.outages.storage as riding_storage
    from orchestrator.record.store.migrate import open_storage

    state = outage_state.Outages(jitter=lambda: 0.01)
    monkeypatch.setattr(outage_state, "OUTAGES", state)
    study = optuna.create_study(
        storage=open_storage(StorageLocation.parse(sqlite_url)), study_name="once"
    )
    seen = _lose_the_first_answer(monkeypatch, riding_storage, "_create_once")
    trial = study.ask()
    assert seen["calls"] == 1  # the retry found the trial by its mark: no second insert
    assert [t.number for t in study.get_trials()] == [trial.number] == [0]
    assert state.outages == 1


def test_an_ask_under_the_budget_lock_whose_answer_was_lost_makes_one_trial(
    sqlite_url, monkeypatch
):
    """Under the lock the whole section is run again (a new call of the ask), and the new call
    still finds the trial the lost one made."""
    import orchestrator.record.outages.storage as riding_storage
    from orchestrator.record.store.locks import under_budget_lock
    from orchestrator.record.store.migrate import open_storage

    state = outage_state.Outages(jitter=lambda: 0.01)
    monkeypatch.setattr(outage_state, "OUTAGES", state)
    study = optuna.create_study(
        storage=open_storage(StorageLocation.parse(sqlite_url)), study_name="locked"
    )
    seen = _lose_the_first_answer(monkeypatch, riding_storage, "_create_once")
    sections = []

    def section() -> optuna.Trial:
        sections.append(1)
        return study.ask()

    trial = under_budget_lock(
        StorageLocation.parse(sqlite_url), "locked", section, what="ask for a trial"
    )
    assert len(sections) == 2  # the lost answer ran the section again
    assert seen["calls"] == 1  # ...whose ask found the trial by its mark: no second insert
    assert [t.number for t in study.get_trials()] == [trial.number] == [0]
    assert study.ask().number == 1  # the next ask is a new trial


def test_an_ask_under_the_budget_lock_lost_after_its_insert_makes_one_trial(
    sqlite_url, monkeypatch
):
    """The connection goes once the trial is made but before the section ends (Optuna's ask
    reads the study for its sampler): the section run again finds the same trial."""
    from orchestrator.record.store.locks import under_budget_lock
    from orchestrator.record.store.migrate import open_storage

    state = outage_state.Outages(jitter=lambda: 0.01)
    monkeypatch.setattr(outage_state, "OUTAGES", state)
    study = optuna.create_study(
        storage=open_storage(StorageLocation.parse(sqlite_url)), study_name="after"
    )
    asked = []

    def section() -> optuna.Trial:
        trial = study.ask()
        asked.append(trial.number)
        if len(asked) == 1:
            raise connection_lost()
        return trial

    trial = under_budget_lock(
        StorageLocation.parse(sqlite_url), "after", section, what="ask for a trial"
    )
    assert asked == [0, 0] and trial.number == 0
    assert len(study.get_trials()) == 1
    assert study.ask().number == 1  # a new section's ask is a new trial


def test_a_tell_whose_answer_was_lost_is_told_once(sqlite_url, monkeypatch):
    from optuna.storages import RDBStorage

    from orchestrator.record.store.migrate import open_storage

    monkeypatch.setattr(outage_state, "OUTAGES", outage_state.Outages(jitter=lambda: 0.01))
    study = optuna.create_study(
        storage=open_storage(StorageLocation.parse(sqlite_url)), study_name="told"
    )
    trial = study.ask()
    seen = _lose_the_first_answer(monkeypatch, RDBStorage, "set_trial_state_values")
    study.tell(trial, 2.5)
    assert seen["calls"] == 2  # the retry met a finished trial in the state it was to get
    (told,) = study.get_trials()
    assert told.state.name == "COMPLETE" and told.value == 2.5


def test_a_call_that_never_failed_does_not_end_the_outage(fake, caplog):
    """Beside a locked SQLite file reads go on while writes wait: a read is no sign it is over."""
    time, state = fake
    write, _ = failing(3)

    def sleep_while_another_thread_reads(seconds: float) -> None:
        time.sleep(seconds)
        reader = threading.Thread(
            target=outage.ride_out,
            args=(lambda: "read",),
            kwargs={"what": "read", "outages": state},
        )
        reader.start()
        reader.join()
        assert state.began_at is not None  # the read did not end the outage

    state.sleep = sleep_while_another_thread_reads
    with caplog.at_level(logging.INFO, logger="test.outage"):
        assert outage.ride_out(write, what="write", bound=60, outages=state) == "done"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "is back" in messages[1], messages
    assert state.began_at is None
