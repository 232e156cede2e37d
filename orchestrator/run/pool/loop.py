"""The pool loop: fills every GPU of a host with trials of one study, admitted by their bytes.

The loop decides and the parts around it act: each GPU's supervisor (`orchestrator.run.pool.supervisor`,
with the pure rules of `orchestrator.run.pool.admission` and `orchestrator.planning.footprint`) says
which trial may train now and learns from each one, the stop conditions (`orchestrator.run.pool.stopping`)
say when to start nothing new and when to end, a backend (`orchestrator.run.pool.processes`) runs the
trials, and the study (`orchestrator.run.pool.stored_study`) counts the budget and keeps the records.
Every one of them is given to `Pool`, with the clock, so the same loop runs real processes on real
or simulated GPUs and, in the benchmark, simulated trials on a virtual clock.

What the loop reads and says is in values made elsewhere: a trial process's end
(`orchestrator.run.pool.trial_endings`), a change of a GPU's allowance (`orchestrator.run.pool.allowance_changes`),
the progress display's snapshot (`orchestrator.run.pool.snapshot`) and the stop signals
(`orchestrator.run.pool.signals`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.base import uses_torch
from orchestrator.record.outages.errors import is_outage
from orchestrator.record.outages.riding import single_attempt
from orchestrator.record.outages.state import note_connections
from orchestrator.run.messages import Go, TrialJob
from orchestrator.run.pool.allowance_changes import (
    change_event,
    log_change,
    slots_either_side,
    start_change,
)
from orchestrator.run.pool.placement import Policy, group_size, load_of, place
from orchestrator.run.pool.processes import WarmProcesses
from orchestrator.run.pool.signals import StopSignals
from orchestrator.run.pool.snapshot import PoolSnapshot, gpu_snapshot, pool_snapshot
from orchestrator.run.pool.stopping import Step, Stop, next_step
from orchestrator.run.pool.stored_study import StoredStudy
from orchestrator.run.pool.supervisor import RunningTrial, Supervisor
from orchestrator.run.pool.trial_endings import (
    End,
    FailedStarts,
    check_starts,
    ending_of,
    log_ending,
    log_group_split,
)

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import Engine

    from orchestrator.gpu.base import Probe
    from orchestrator.planning.planner import GpuPlan
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import BudgetCount, StudySpec
    from orchestrator.run.backend import Event, TrialBackend
    from orchestrator.run.messages import TrialOutcome, TrialSettings
    from orchestrator.run.pool.admission import Change

logger = logging.getLogger(__name__)

STALE_CHECK_S = 5.0  # how often this worker looks for trials whose process went silent
TOUCH_S = 10.0  # how often it says it is alive in orch_workers
WAIT_S = 0.5  # the longest the loop sleeps when nothing happens


@dataclass(frozen=True)
class PoolResult:
    trials_run: int
    ooms: int
    interrupted: bool  # stopped by a signal (Ctrl-C, SIGTERM), not by the budget or --timeout


class Pool:
    """Fills every GPU of this host with trials of one study until the study's budget is used."""

    def __init__(
        self,
        *,
        study: StoredStudy,
        plans: list[GpuPlan],
        probe: Probe,
        backend: TrialBackend,
        timeout_s: float | None = None,
        grace_s: float = Stop.grace_s,
        metric: str = "value",  # as adapters.metric_name says when an adapter names none
        on_update: Callable[[PoolSnapshot], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        host: str | None = None,
        learn: bool = True,
        placement: Policy = Policy.SPREAD,
        starting_limit: int | None = None,
        fuse: int = 1,
        auto_fuse: bool = False,
    ) -> None:
        self.study = study
        # The most trials one process claims at once (--fuse, docs/fused.md): a process that has
        # not asked yet may take that many of the budget.
        self.fuse = max(1, fuse)
        # At most this many trials whose process has not asked yet (None: no limit). Processes
        # that start together share the host's cores: beyond one a core they only slow each
        # other, and the first trial waits for them all.
        self.starting_limit = starting_limit
        self.probe = probe
        self.backend = backend
        self.metric = metric
        self.on_update = on_update
        self.clock = clock
        self.host = host or socket.gethostname()
        self.placement = placement  # which GPU a new trial starts on (run.pool.placement)
        self.supervisors = [
            Supervisor.for_plan(index, plan, learn=learn, auto_fuse=auto_fuse)
            for index, plan in enumerate(plans)
        ]
        self.stop = Stop(started_at=clock(), timeout_s=timeout_s, grace_s=grace_s)
        self.signals = StopSignals()  # received by a handler, acted on at the top of the loop
        self.failed_starts = FailedStarts()
        self.trials_run = 0
        self._last = {"touch": float("-inf"), "stale": float("-inf"), "publish": float("-inf")}
        self._counted_at_start = study.count().counted

    @classmethod
    def on_storage(
        cls,
        *,
        storage_location: StorageLocation,
        engine: Engine,
        study: optuna.Study,
        spec: StudySpec,
        plans: list[GpuPlan],
        probe: Probe,
        cpu_cores: int,
        cpu_bound: bool = False,
        settings: TrialSettings | None = None,  # None: the defaults
        spare: list[Any] | None = None,
        adapter: Any = None,
        **options: Any,
    ) -> Pool:
        """The real pool: the study in its database, trials in warm processes on this host
        (`settings`: what every trial process is told of this host's options; `spare`: processes
        from `orchestrator.run.pool.processes.prestart`, taken first; `adapter`:
        the study's, which names its memory models and says whether its trials import torch)."""

        host = socket.gethostname()
        backend = WarmProcesses.for_plans(
            plans,
            storage_location=storage_location,
            study_name=study.study_name,
            host=host,
            cpu_cores=cpu_cores,
            cpu_bound=cpu_bound,
            settings=settings,
            spare=spare,
            uses_torch=uses_torch(adapter),  # True for no adapter, as for one that does not say
        )
        stored = StoredStudy(
            storage_location=storage_location,
            engine=engine,
            study=study,
            spec=spec,
            adapter_name=None if adapter is None else adapter.name,
        )
        options.setdefault("starting_limit", max(1, cpu_cores))
        # What a server that runs out of connections is told about this host: a connection per
        # trial process at most, and one for the pool itself.
        note_connections(host_connections=1 + sum(plan.slots for plan in plans))
        return cls(study=stored, plans=plans, probe=probe, backend=backend, host=host, **options)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> PoolResult:
        with self.signals.handled():
            try:
                for supervisor in self.supervisors:
                    self._register(supervisor)
                while self._turn():
                    self.backend.wait(WAIT_S)
                    self._publish()
            finally:
                self._close()
        return PoolResult(
            self.trials_run, sum(s.ooms for s in self.supervisors), self.stop.interrupted
        )

    def _close(self) -> None:
        """Stop what still runs and say so in the records, without waiting for a database that
        is away (the run is ending, perhaps because of it: each write is tried once)."""

        events = self.backend.close()
        try:
            with single_attempt():
                self._handle(events)
                for supervisor in self.supervisors:
                    if supervisor.worker_id is not None:
                        self.study.touch_worker(supervisor.worker_id, stopped=True)
        except Exception as error:
            if not is_outage(error):
                raise

    def _turn(self) -> bool:
        """One pass: take what happened, decide, act. False when the loop is over."""
        self._take_signals()
        self._handle(self.backend.events())
        self._every("stale", STALE_CHECK_S, self.study.fail_stale)
        self._every("touch", TOUCH_S, self._touch_workers)
        count = self.study.count()
        was_draining = self.stop.draining
        self.stop, step = next_step(
            self.stop,
            now=self.clock(),
            running=sum(len(s.running) for s in self.supervisors),
            budget_finished=count.finished(self.study.budget),
        )
        if self.stop.timed_out and not was_draining:
            logger.info("--timeout reached: no new trials; running ones finish")
            self._interrupt_not_admitted()
        if step in (Step.DONE, Step.STOP_RUNNING):
            return False  # leaving stops what still runs (the grace period is over)
        if step is Step.START:
            if count.may_ask(self.study.budget):
                self._fill(count)
            self._admit_waiting()
        for supervisor in self.supervisors:
            idle = supervisor.budget.max_trials - len(supervisor.running)
            self.backend.keep_idle(supervisor.index, idle)
        return True

    def _every(self, name: str, period: float, action: Callable[[], None]) -> None:
        now = self.clock()
        if now - self._last[name] >= period:
            self._last[name] = now
            action()

    # -- signals --------------------------------------------------------------------------

    def _take_signals(self) -> None:
        while self.signals.take():
            first = not self.stop.interrupted
            self.stop = self.stop.signalled(self.clock())
            if first:
                logger.warning(
                    "stopping: no new trials; running ones have %.0f s to finish, then are "
                    "stopped and re-queued (again to stop now)",
                    self.stop.grace_s,
                )
                self._interrupt_not_admitted()

    def _interrupt_not_admitted(self) -> None:
        """Trials still starting or waiting to be admitted: stop them before they train (one
        that has asked is failed and re-queued, one that has not asks for nothing)."""
        for supervisor in self.supervisors:
            for trial in supervisor.running.values():
                if not trial.admitted:
                    self.backend.interrupt(trial.handle)

    # -- starting and admitting trials ----------------------------------------------------

    def _fill(self, count: BudgetCount) -> None:
        # Each ask takes a waiting trial or a new one: the room is what is neither counted nor
        # running, less our trials that started but have not asked yet.
        not_asked = [t for s in self.supervisors for t in s.running.values() if t.number is None]
        self._handle(self.backend.events())  # what came while counting: a group re-queuing
        if any(t.requeuing for s in self.supervisors for t in s.running.values()):
            return  # its members' room is its own until it ends: they run again as groups
        room = self.study.budget - count.counted - count.running - sum(t.members for t in not_asked)
        if room <= 0:
            return
        members = group_size(self.fuse, self.supervisors, room)
        # Free memory is read once a pass; trials started in it count against it by estimate.
        free = {s.index: self._free_mb(s) for s in self.supervisors}
        starting = len(not_asked)
        while room > 0:
            if self.starting_limit is not None and starting >= self.starting_limit:
                return  # the rest start as these ask (the loop comes back at once)
            loads = [load_of(s, free[s.index]) for s in self.supervisors]
            placed = place(loads, self.placement)
            if placed.index is None:
                return
            size = self._start(self.supervisors[placed.index], min(members, room))
            room, starting = room - size, starting + 1

    def _free_mb(self, supervisor: Supervisor) -> float | None:
        if supervisor.device is None or len(self.supervisors) == 1:
            return None  # nothing to choose between: no probe call
        return self.probe.free_mb(supervisor.device)

    def _start(self, supervisor: Supervisor, members: int = 1) -> int:
        members = supervisor.group_of(members)  # auto's, an OOM's split, what fits the GPU
        job = TrialJob(batch_bounds=self.batch_bounds(supervisor), members=members)
        handle = self.backend.start(supervisor.index, job)
        supervisor.running[handle] = RunningTrial(handle, members=members)
        self.trials_run += 1
        return members

    def _admit_waiting(self) -> None:
        """Admit, on each GPU, every waiting trial that fits, in turn."""

        for supervisor in self.supervisors:
            while True:
                device = supervisor.device
                free = self.probe.free_mb(device) if device is not None else None
                trial, changes = supervisor.next_admission(free)
                for change in changes:
                    self._record(supervisor, change)
                if trial is None:
                    break
                admitted = supervisor.admitted()
                self.backend.admit(trial.handle, Go(trial.planned_mb, len(admitted)))
                if len(admitted) > 1:
                    for other in admitted:
                        self.backend.share(other.handle)

    def batch_bounds(self, supervisor: Supervisor) -> tuple[int, int]:
        return supervisor.batch_bounds(self.study.batch_limit(supervisor.gpu_name))

    # -- outcomes -------------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            supervisor = next((s for s in self.supervisors if event.handle in s.running), None)
            if supervisor is None:
                continue  # a trial this pool no longer follows
            finished = supervisor.heard(event)
            if finished is not None:
                self._finished(supervisor, *finished)

    def _finished(self, supervisor: Supervisor, trial: RunningTrial, outcome: TrialOutcome) -> None:
        for member in outcome.fused:  # a fused group's other trials: each ended as one does
            self.trials_run += 1
            log_ending(supervisor.label, ending_of(member, member.trial_number), member)
        ending = ending_of(outcome, trial.number)
        if ending.end is End.NOTHING_RUN:
            self.trials_run -= 1
            return
        if ending.end is not End.UNREACHABLE:  # the database's fault says nothing of the set-up
            self.failed_starts = self.failed_starts.after(ending, draining=self.stop.draining)
            check_starts(self.failed_starts, outcome)  # raises TrialsCannotStart after too many
        log_ending(supervisor.label, ending, outcome)
        if ending.end is not End.FINISHED:
            return
        learnt_before, cap_before = supervisor.footprint, supervisor.group_cap
        self._record(supervisor, supervisor.finished(trial, outcome))
        if supervisor.group_cap != cap_before:
            log_group_split(supervisor.label, trial.members, supervisor.group_cap)
        if supervisor.footprint != learnt_before:
            self.study.save_footprint(supervisor.gpu_name, supervisor.footprint)
        self._publish(force=True)

    def _record(self, supervisor: Supervisor, change: Change | None) -> None:
        """Log a change of a GPU's allowance and store it with the study."""
        if change is None:
            return
        slots = slots_either_side(supervisor, change)
        log_change(supervisor.label, change, slots)
        self.study.record_change(change_event(supervisor, change, slots, host=self.host))

    # -- bookkeeping ----------------------------------------------------------------------

    def _register(self, supervisor: Supervisor) -> None:
        device = supervisor.plan.device
        supervisor.worker_id = self.study.register_worker(
            host=self.host,
            gpu_index=device.index if device else None,
            gpu_name=supervisor.gpu_name,
            pid=os.getpid(),
        )
        plan = supervisor.plan
        self._record(supervisor, start_change(plan.slots, plan.limited_by, supervisor.budget))

    def _touch_workers(self) -> None:
        for supervisor in self.supervisors:
            if supervisor.worker_id is not None:
                self.study.touch_worker(supervisor.worker_id)

    # -- progress -------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        gpus = tuple(gpu_snapshot(s, self.probe, self.batch_bounds(s)) for s in self.supervisors)
        return pool_snapshot(
            self.study,
            gpus,
            metric=self.metric,
            elapsed_s=self.clock() - self.stop.started_at,
            counted_at_start=self._counted_at_start,
        )

    def _publish(self, force: bool = False) -> None:
        if self.on_update is None:
            return
        now = self.clock()
        if not force and now - self._last["publish"] < 1.0:
            return
        self._last["publish"] = now
        self.on_update(self.snapshot())
