"""The pool's loop itself, on simulated trials and a virtual clock: no processes, no database,
no sleeping. The same `Pool` that `run` drives; `orchestrator.run.simulated` plays the rest."""

from __future__ import annotations

import pytest

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planning.planner import plan_node
from orchestrator.run.backend import Finished, Requeuing
from orchestrator.run.messages import TrialOutcome
from orchestrator.run.pool.loop import Pool
from orchestrator.run.pool.stopping import Step, Stop, next_step
from orchestrator.run.simulated import SimTrial, SimulatedStudy, SimulatedTrials

GPU = Device(0, "Simulated GPU", "sim-0", 10_000.0, kind="sim")


def _pool(trials: list[SimTrial], *, budget: int | None = None, **options):
    model = MemoryModel(1000.0, 0.0)
    (plan,) = plan_node([GPU], model, cpu_bound=False, cpu_cores=8, swarm_size=20).gpus
    study = SimulatedStudy(budget=budget or len(trials))
    backend = SimulatedTrials(study, trials, [GPU])
    pool = Pool(
        study=study, plans=[plan], probe=backend, backend=backend, clock=backend.clock, **options
    )
    return pool, study, backend


def test_every_trial_of_the_budget_runs_and_no_more():
    pool, study, backend = _pool([SimTrial(64, 1000.0, 60.0)] * 30, budget=12)
    result = pool.run()
    assert study.complete == 12 and study.running == 0
    assert result.trials_run == 12 and result.ooms == 0
    # 8 GB usable at 1 GB a trial: half of it at first (4 trials), all once the first wave is done.
    reasons = [(e.reason, e.from_slots, e.to_slots, e.from_mb, e.to_mb) for e in study.events]
    assert reasons[:2] == [("start", 0, 4, 0.0, 4000.0), ("rampup", 4, 8, 4000.0, 8000.0)]


def test_trials_that_need_three_times_the_estimate_cut_the_memory_and_are_re_run():
    pool, study, backend = _pool([SimTrial(64, 3000.0, 60.0)] * 10)
    result = pool.run()
    assert study.complete == 10 and study.failed == 0  # every OOM'd trial was re-run
    assert result.ooms == backend.ooms > 0
    cuts = [e for e in study.events if e.reason in ("oom", "degrade")]
    assert cuts and all(e.to_mb <= e.from_mb / 2 + 1e-9 or e.reason == "degrade" for e in cuts)
    # It learnt: 3x the estimate costs one or two OOMs, not one per ramp-up.
    assert backend.ooms <= 2
    (footprint,) = study.footprints.values()
    assert footprint.planned_mb(64) >= 3000.0


class GroupsThatRequeue(SimulatedTrials):
    """Simulated trials, one of which plays a fused group's process ending after an OOM: it
    says it is re-queuing, then its members are queued again one at a time, then it ends."""

    def requeuing(self, handle: int) -> None:
        self._pending.append(Requeuing(handle))

    def queue_again(self, index: int) -> None:
        self.study.running -= 1
        self.study.retried += 1
        self.study.waiting.append((index, 1))

    def ended(self, handle: int, index: int) -> None:
        self._asked.pop(handle, None)
        outcome = TrialOutcome(index, "FAIL", oom=True, requeued=True)
        self._pending.append(Finished(handle, outcome))


def test_a_group_re_queuing_its_members_holds_their_room_until_it_ends():
    model = MemoryModel(1000.0, 0.0)
    (plan,) = plan_node([GPU], model, cpu_bound=False, cpu_cores=8, swarm_size=20).gpus
    study = SimulatedStudy(budget=3)
    backend = GroupsThatRequeue(study, [SimTrial(64, 1000.0, 60.0)] * 6, [GPU])
    pool = Pool(study=study, plans=[plan], probe=backend, backend=backend, clock=backend.clock)
    pool._fill(study.count())
    pool._handle(backend.events())
    (supervisor,) = pool.supervisors
    assert len(supervisor.running) == 3  # the budget, all asked
    group = min(supervisor.running)
    # Its process says it re-queues, then the first member is queued again: a pass of the loop
    # in between starts nothing, though the count shows room for one.
    backend.requeuing(group)
    backend.queue_again(0)
    assert study.count().may_ask(study.budget)
    pool._fill(study.count())
    assert len(supervisor.running) == 3 and supervisor.running[group].requeuing
    # Once the process has ended, its member starts again.
    backend.ended(group, 0)
    pool._handle(backend.events())
    pool._fill(study.count())
    assert len(supervisor.running) == 3 and group not in supervisor.running
    assert not study.waiting  # the re-queued member was asked by the process started for it


def test_the_timeout_starts_nothing_new_and_running_trials_finish():
    pool, study, backend = _pool([SimTrial(64, 1000.0, 100.0)] * 20, timeout_s=150.0)
    result = pool.run()
    assert not result.interrupted
    # 4 started at 0 s, 8 more at 100 s (ramped up); at 150 s nothing new, the 8 finish at 200 s.
    assert study.complete == 12 and study.running == 0
    assert backend.now == pytest.approx(200.0)


def test_a_signal_drains_then_stops_after_the_grace_period():
    pool, study, backend = _pool([SimTrial(64, 1000.0, 100.0)] * 20, grace_s=30.0)
    pool.signals.waiting = 1  # as if Ctrl-C came before the first pass
    result = pool.run()
    assert result.interrupted and result.trials_run == 0 and study.running == 0


@pytest.mark.parametrize(
    ("stop", "now", "running", "finished", "step"),
    [
        (Stop(0.0), 10.0, 3, False, Step.START),
        (Stop(0.0), 10.0, 0, True, Step.DONE),
        (Stop(0.0), 10.0, 2, True, Step.START),  # ours still run: a lost one may come back
        (Stop(0.0, timeout_s=5.0), 10.0, 2, False, Step.DRAIN),
        (Stop(0.0, timeout_s=5.0), 10.0, 0, False, Step.DONE),
        (Stop(0.0, grace_s=30.0, signalled_at=5.0), 10.0, 2, False, Step.DRAIN),
        (Stop(0.0, grace_s=30.0, signalled_at=5.0), 40.0, 2, False, Step.STOP_RUNNING),
        (Stop(0.0, grace_s=30.0, signalled_at=5.0), 10.0, 0, False, Step.DONE),
    ],
)
def test_next_step(stop, now, running, finished, step):
    assert next_step(stop, now=now, running=running, budget_finished=finished)[1] is step


def test_a_second_signal_ends_the_grace_period():
    stop = Stop(0.0, grace_s=30.0).signalled(5.0)
    assert stop.signalled_at == 5.0 and stop.grace_s == 30.0
    again = stop.signalled(6.0)
    assert again.signalled_at == 5.0 and again.grace_s == 0.0
    assert next_step(again, now=6.0, running=1, budget_finished=False)[1] is Step.STOP_RUNNING


def test_a_second_signal_not_yet_taken_stops_at_once():
    from orchestrator.run.pool.signals import StopSignals

    signals = StopSignals()
    signals.received(2, None)
    with pytest.raises(KeyboardInterrupt, match="second signal"):
        signals.received(2, None)
    assert signals.take() and signals.take() and not signals.take()


@pytest.mark.parametrize(
    ("outcome", "asked", "end", "number"),
    [
        (dict(trial_number=None, state="NONE"), None, "NOTHING_RUN", None),
        (dict(trial_number=None, state="FAIL", unreachable=True), 3, "UNREACHABLE", 3),
        (dict(trial_number=4, state="FAIL", interrupted=True), 4, "STOPPED", 4),
        (dict(trial_number=None, state="FAIL"), 5, "LOST", 5),
        (dict(trial_number=None, state="FAIL", setup_failed=True), None, "NEVER_STARTED", None),
        (dict(trial_number=6, state="COMPLETE"), 6, "FINISHED", 6),
    ],
)
def test_a_trial_process_end_is_read_as_one_value(outcome, asked, end, number):
    from orchestrator.run.messages import TrialOutcome
    from orchestrator.run.pool.trial_endings import End, ending_of

    ending = ending_of(TrialOutcome(**outcome), asked)
    assert (ending.end, ending.number) == (End[end], number)


def test_failed_starts_in_a_row_stop_the_worker_and_an_ask_resets_them():
    from orchestrator.run.messages import TrialOutcome
    from orchestrator.run.pool.trial_endings import (
        MAX_FAILED_STARTS,
        End,
        Ending,
        FailedStarts,
        TrialsCannotStart,
        check_starts,
    )

    failed, never = FailedStarts(), Ending(End.NEVER_STARTED, None)
    outcome = TrialOutcome(None, "FAIL", error="unknown adapter")
    for _ in range(MAX_FAILED_STARTS - 1):
        failed = failed.after(never, draining=False)
        check_starts(failed, outcome)
    assert failed.after(never, draining=True) == FailedStarts()
    assert failed.after(Ending(End.FINISHED, 1), draining=False) == FailedStarts()
    with pytest.raises(TrialsCannotStart, match="unknown adapter"):
        check_starts(failed.after(never, draining=False), outcome)


def _most_starting_at_once(pool, backend) -> int:
    """Run the pool; the most trials it had started that had not asked yet, at any moment."""
    from orchestrator.run.backend import Asked

    starting, most = [0], [0]
    start, events = backend.start, backend.events

    def counted_start(gpu, job):
        starting[0] += 1
        most[0] = max(most[0], starting[0])
        return start(gpu, job)

    def counted_events():
        heard = events()
        starting[0] -= sum(isinstance(event, Asked) for event in heard)
        return heard

    backend.start, backend.events = counted_start, counted_events
    pool.run()
    return most[0]


@pytest.mark.parametrize("limit", [1, 2, None])
def test_trial_processes_start_at_most_a_core_s_worth_at_once(limit):
    """Processes that start together share the cores: the pool starts no more than the limit
    before they have asked (a real host's: its cores), and the budget still runs whole."""
    pool, study, backend = _pool([SimTrial(64, 1000.0, 60.0)] * 12, starting_limit=limit)
    most = _most_starting_at_once(pool, backend)
    assert most == limit if limit else most > 2  # unlimited: as many as it wants (7 here)
    assert study.complete == 12 and study.running == 0
