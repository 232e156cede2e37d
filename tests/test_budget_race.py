"""The budget is exact on every interleaving of asks, tells, re-queues and looks for lost trials.

First, on a real PostgreSQL: trial processes and a host's look for lost trials run as threads
whose steps a seeded scheduler releases one at a time, in many orders (a step that blocks, on
the budget lock or a row, is left waiting and another goes on). Some trials finish, some fail for
good, some go silent (their heartbeat made old) and then tell late, and some are stopped and
re-queue themselves, as `run/trial/requeue` does, while the look may be failing them as lost
and re-queuing them in its own transaction. Whatever the order, the study ends on its budget,
every failure has at most one re-run, and nothing is left RUNNING. (A re-queue looked for and
added outside the budget lock gave a trial a re-run from its process and one from the look:
one trial past the budget, seen as 301 for 300.)

Then what a look for lost trials must not do: fail a trial whose heartbeat came in after it read
the heartbeats; and a heartbeat is one statement, stamped as it lands.

Last, the real commands: two hosts on a server of few connections, with a heartbeat of 1 s and a
grace of 3 s, two trial processes stopped past it (SIGSTOP) so that their trials are failed as
lost and re-run while the processes wake and tell late: exact, a few times.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from benchmarks.bench_connection_limit import run_scenario
from orchestrator.record.budget.claim import claim_trial
from orchestrator.record.outages import state as outage_state
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials import stale
from orchestrator.record.trials.retry import requeue, retry_history, stale_trial_callback
from tests.waiting import patient

BUDGET = 5
GRACE_S = 600.0  # a silent trial's heartbeat is made an hour old; a live one's is fresh
STEP_S = 0.3  # a step not done by then is left blocked, and another actor goes on


class Actor(threading.Thread):
    """A thread that runs its steps only when the scheduler lets it (`pause` between steps)."""

    def __init__(self, name: str, body: Callable[[Actor], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.body = body
        self.go = threading.Semaphore(0)
        self.done = threading.Semaphore(0)
        self.finished = False
        self.error: BaseException | None = None

    def pause(self) -> None:
        self.done.release()
        self.go.acquire()

    def run(self) -> None:
        _current.actor = self
        self.go.acquire()
        try:
            self.body(self)
        except BaseException as error:  # the test says it, with the order
            self.error = error
        finally:
            self.finished = True
            self.done.release()


_current = threading.local()


def _schedule(
    actors: list[Actor], rng: random.Random, script: list[str], deadline_s: float = 300
) -> None:
    """Release one step of an actor at a time until all have finished: the actors `script`
    names first (by the start of their names, while they can go on), then random ones."""
    for actor in actors:
        actor.start()
    pending, blocked = set(actors), set()

    def settled(actor: Actor, timeout: float) -> bool:
        if not actor.done.acquire(timeout=timeout):
            return False
        blocked.discard(actor)
        if actor.finished:
            pending.discard(actor)
        return True

    end = time.monotonic() + deadline_s
    while pending:
        assert time.monotonic() < end, f"no progress: {sorted(a.name for a in pending)}"
        runnable = sorted(pending - blocked, key=lambda a: a.name)
        if runnable:
            named = [a for a in runnable if script and a.name.startswith(script[0])]
            actor = named[0] if named else rng.choice(runnable)
            script = script[1:]
            actor.go.release()
            if not settled(actor, STEP_S):
                blocked.add(actor)  # it waits on a lock or a row (or is slow): others go on
        for actor in sorted(blocked, key=lambda a: a.name):
            settled(actor, 0.0 if runnable else 0.05)
    for actor in actors:
        actor.join(timeout=60)
        if actor.error is not None:
            raise actor.error


def _pausing_callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """The look's stale-trial callback, with a step on each side of its re-queue: the look's
    transaction stays open (the trial failed, its re-run added, neither committed) meanwhile."""
    actor = getattr(_current, "actor", None)
    if actor is not None:
        actor.pause()
    stale_trial_callback(study, trial)
    if actor is not None:
        actor.pause()


def _age_heartbeat(engine: sa.Engine, trial_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE trial_heartbeats SET heartbeat = heartbeat - interval '1 hour' "
                "WHERE trial_id = :id"
            ),
            {"id": trial_id},
        )


def _tell(storage, trial_id: int, state: TrialState, values=None) -> bool:
    """A trial process's tell; False when the trial was failed as lost first (a late result)."""
    try:
        storage.set_trial_state_values(trial_id, state, values)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def _one_order(
    url: str, storage, seed: int, script: list[str] = ()
) -> list[optuna.trial.FrozenTrial]:
    rng = random.Random(seed)
    name = f"race-{seed}"
    study = optuna.create_study(study_name=name, storage=storage)
    location = StorageLocation.parse(url)
    backend = storage  # the RDBStorage: claims and tells as a trial process sends them
    outages = outage_state.Outages()

    def own_study() -> optuna.Study:
        # Each actor is a process of its own: Optuna's trial cache in front of the storage
        # (which keeps what this process added, committed or not) is not shared.
        return optuna.load_study(study_name=name, storage=storage)

    def claim() -> int | None:
        got = claim_trial(backend, study._study_id, name, BUDGET)
        return None if got is None else got.trial_id

    def finishes(actor: Actor) -> None:
        if (trial_id := claim()) is not None:
            actor.pause()
            _tell(backend, trial_id, TrialState.COMPLETE, [1.0])

    def fails_for_good(actor: Actor) -> None:
        if (trial_id := claim()) is not None:
            actor.pause()
            _tell(backend, trial_id, TrialState.FAIL)

    def goes_silent_then_tells(actor: Actor) -> None:
        if (trial_id := claim()) is not None:
            actor.pause()
            _age_heartbeat(backend.engine, trial_id)
            actor.pause()
            _tell(backend, trial_id, TrialState.COMPLETE, [2.0])  # late, if failed meanwhile

    def is_stopped_silent(actor: Actor) -> None:
        """Stopped while its heartbeat was late: it re-queues itself as the look may fail it."""
        if (trial_id := claim()) is None:
            return
        actor.pause()
        _age_heartbeat(backend.engine, trial_id)
        actor.pause()
        frozen = backend.get_trial(trial_id)  # run/trial/requeue._still_running
        actor.pause()
        if frozen.state == TrialState.RUNNING:
            requeue(own_study(), frozen, max_retries=None, reason="interrupted")
            actor.pause()
            _tell(backend, trial_id, TrialState.FAIL)

    def looks_for_lost(actor: Actor) -> None:
        mine = own_study()
        for _ in range(3):
            stale.look_for_lost_trials(location, mine, GRACE_S, outages)
            actor.pause()

    bodies = [finishes, fails_for_good, goes_silent_then_tells, is_stopped_silent, looks_for_lost]
    actors = [Actor(f"{body.__name__}", body) for body in bodies]
    _schedule(actors, rng, list(script))
    # The rest of the budget, as other workers would use it: a last look, then ask until none.
    stale.look_for_lost_trials(location, study, GRACE_S, outages)
    while (trial_id := claim()) is not None:
        _tell(backend, trial_id, TrialState.COMPLETE, [0.0])
    return optuna.load_study(study_name=name, storage=storage).trials


# The order that gave a trial two re-runs: the look fails the stopped trial and queues its re-run
# (its transaction open), while the trial's process, which read it RUNNING, re-queues it too.
STOPPED_AS_FOUND_LOST = [
    "is_stopped",  # asks
    "is_stopped",  # goes silent
    "looks",  # finds it lost, fails it: the callback's first step
    "is_stopped",  # reads it RUNNING (the failure is not committed)
    "looks",  # queues its re-run
    "is_stopped",  # re-queues it (waits on the study's row, or the budget lock)
    "looks",  # commits
]


def test_the_budget_is_exact_on_every_order(postgres_url):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(
        StorageLocation.parse(postgres_url),
        heartbeat=True,
        heartbeat_stale_trial_callback=_pausing_callback,
    )
    reruns_seen = 0
    for seed in range(30):
        script = STOPPED_AS_FOUND_LOST if seed < 3 else []
        trials = _one_order(postgres_url, storage, seed, script)
        count = count_trials(trials)
        named = [retry_history(t)[-1] for t in trials if retry_history(t)]
        assert len(named) == len(set(named)), (seed, "a failure re-run twice", named)
        assert count.running == count.waiting == 0, (seed, count)
        assert count.counted == BUDGET, (seed, count, [(t.number, t.state.name) for t in trials])
        reruns_seen += len(named)
    assert reruns_seen > 0, "no order re-ran a trial: the orders tried nothing"


# -- the look for lost trials, and the heartbeat -----------------------------------------------


def test_a_heartbeat_that_lands_after_the_look_keeps_its_trial(postgres_url, monkeypatch):
    # A server started less than GRACE_S ago (a machine just booted) holds every look back:
    # that rule has tests of its own; this one is about the heartbeat after the look.
    monkeypatch.setattr(stale, "_server_restarted_within", lambda *args: False)
    storage = open_storage(
        StorageLocation.parse(postgres_url),
        heartbeat=True,
        heartbeat_stale_trial_callback=stale_trial_callback,
    )
    study = optuna.create_study(study_name="late-beat", storage=storage)
    got = claim_trial(storage, study._study_id, "late-beat", 5)
    assert got is not None and got.trial_id is not None
    _age_heartbeat(storage.engine, got.trial_id)
    assert stale._any_lost(storage.engine, study._study_id, GRACE_S), "it looks lost"
    storage.record_heartbeat(got.trial_id)  # its process was slow, not gone: it beats now
    outages = outage_state.Outages()
    assert stale.fail_stale_trials(study, GRACE_S, outages)  # as under the lock, after the look
    assert [t.state for t in study.trials] == [TrialState.RUNNING], "not failed as lost"
    _age_heartbeat(storage.engine, got.trial_id)
    assert stale.look_for_lost_trials(StorageLocation.parse(postgres_url), study, GRACE_S, outages)
    states = [t.state for t in optuna.load_study(study_name="late-beat", storage=storage).trials]
    assert states == [TrialState.FAIL, TrialState.WAITING], "silent now: failed, re-run once"


def test_a_heartbeat_is_one_statement_stamped_as_it_lands(postgres_url):
    storage = open_storage(StorageLocation.parse(postgres_url), heartbeat=True)
    study = optuna.create_study(study_name="beat", storage=storage)
    got = claim_trial(storage, study._study_id, "beat", 5)
    assert got is not None and got.trial_id is not None
    _age_heartbeat(storage.engine, got.trial_id)
    sent: list[str] = []
    sa.event.listen(storage.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    storage.record_heartbeat(got.trial_id)
    assert len(sent) == 1 and sent[0].startswith("INSERT INTO trial_heartbeats"), sent
    with storage.engine.connect() as conn:
        age = conn.execute(
            sa.text(
                "SELECT extract(epoch FROM LOCALTIMESTAMP - heartbeat) FROM trial_heartbeats "
                "WHERE trial_id = :id"
            ),
            {"id": got.trial_id},
        ).scalar()
    assert abs(age) < 60, "stamped now, on the server's clock"


def test_a_look_on_an_sqlite_file_re_queues_under_its_own_lock(sqlite_url, monkeypatch):
    # The look holds the file's lock while it re-queues, and the re-queue takes the budget lock:
    # the same thread takes it through, never waits on itself (a second flock of the file).
    monkeypatch.setenv("ORCHESTRATOR_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("ORCHESTRATOR_GRACE_PERIOD", "2")
    location = StorageLocation.parse(sqlite_url)
    storage = open_storage(
        location, heartbeat=True, heartbeat_stale_trial_callback=stale_trial_callback
    )
    study = optuna.create_study(study_name="file", storage=storage)
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    time.sleep(4)  # SQLite's clock counts whole seconds: past the grace of 2 s for sure
    look = threading.Thread(
        target=stale.look_for_lost_trials,
        args=(location, study, 2.0, outage_state.Outages()),
        daemon=True,
    )
    look.start()
    look.join(timeout=patient(60))
    assert not look.is_alive(), "the re-queue waited on the look's own lock"
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]


# -- the real commands ------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(3))
def test_two_hosts_with_trials_failed_as_lost_end_on_the_exact_budget(monkeypatch, attempt):
    # Two trial processes are stopped past a grace of 3 s while they train: each trial is failed
    # as lost and re-run, and its process wakes and tells late, while the other trials start,
    # finish and are looked at: the interleavings the budget must survive, with real processes.
    monkeypatch.setenv("ORCHESTRATOR_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("ORCHESTRATOR_GRACE_PERIOD", "3")
    outcome = run_scenario(
        hosts=2, slots=3, trials=18, trial_seconds=1.0, max_connections=8, timeout=400, freeze=2
    )
    assert outcome.exit_statuses == [0, 0], outcome.host_lines
    assert (outcome.finished, outcome.running_left) == (18, 0), outcome
    assert outcome.frozen == 2 and outcome.re_runs >= 2, outcome.failures
    named = [f["number"] for f in outcome.failures if f["re_run_as"] is not None]
    assert outcome.re_runs == len(named), ("a failure re-run twice", outcome.failures)
    assert outcome.trials_stored == 18 + outcome.re_runs, outcome.failures
