"""Per-GPU supervisors: as many trials at once as the slot policy allows, protected from OOM.

The loop decides and the parts around it act: the slot policy (`orchestrator.slots`) says how
many trials each GPU runs and why, the stop conditions (`orchestrator.stopping`) say when to
start nothing new and when to end, a backend (`orchestrator.processes`) runs the trials, and the
study (`orchestrator.stored_study`) counts the budget and keeps the records. Every one of them
is given to `Pool`, with the clock, so the same loop runs real processes on real or simulated
GPUs and, in the benchmark, simulated trials on a virtual clock.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.slots import SlotChange, SlotPolicy, after_trial, before_spawn
from orchestrator.snapshot import GpuSnapshot, PoolSnapshot
from orchestrator.stopping import Step, Stop, next_step

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import Engine

    from orchestrator.gpu.base import Probe
    from orchestrator.planner import GpuPlan
    from orchestrator.processes import Event, TrialBackend
    from orchestrator.stored_study import StoredStudy
    from orchestrator.study import BudgetCount, StudySpec
    from orchestrator.trial_context import Recycling
    from orchestrator.trial_runner import TrialOutcome

logger = logging.getLogger(__name__)

STALE_CHECK_S = 5.0  # how often this worker looks for trials whose process went silent
TOUCH_S = 10.0  # how often it says it is alive in orch_workers
WAIT_S = 0.5  # the longest the loop sleeps when nothing happens


@dataclass
class RunningTrial:
    handle: int
    started_index: int
    slots_at_start: int
    number: int | None = None  # known once the trial process has asked


@dataclass
class Supervisor:
    """One GPU (or the CPU, when there is none): its plan, policy and running trials."""

    index: int
    plan: GpuPlan
    policy: SlotPolicy
    worker_id: int | None = None
    running: dict[int, RunningTrial] = field(default_factory=dict)
    ooms: int = 0

    @property
    def label(self) -> str:
        return self.plan.device.label if self.plan.device else "cpu"

    @property
    def gpu_name(self) -> str:
        return self.plan.device.name if self.plan.device else "cpu"


@dataclass(frozen=True)
class PoolResult:
    trials_run: int
    ooms: int
    interrupted: bool  # stopped by a signal (Ctrl-C, SIGTERM), not by the budget or --timeout


# Trial processes that die before they get a trial say something is wrong with the set-up (a
# storage the children cannot open, an adapter that cannot load): after this many in a row the
# worker stops with their error instead of starting more for ever.
MAX_FAILED_STARTS = 5


class TrialsCannotStart(Exception):
    """Several trial processes in a row failed before asking for a trial."""


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
        grace_s: float = 30.0,
        metric: str = "objective",
        on_update: Callable[[PoolSnapshot], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        host: str | None = None,
    ) -> None:
        self.study = study
        self.probe = probe
        self.backend = backend
        self.metric = metric
        self.on_update = on_update
        self.clock = clock
        self.host = host or socket.gethostname()
        self.supervisors = [
            Supervisor(index, plan, SlotPolicy.start(plan.slots))
            for index, plan in enumerate(plans)
        ]
        self.stop = Stop(started_at=clock(), timeout_s=timeout_s, grace_s=grace_s)
        self.signals = 0  # stop signals received, acted on at the top of the loop
        self.failed_starts = 0
        self.trials_run = 0
        self._last = {"touch": float("-inf"), "stale": float("-inf"), "publish": float("-inf")}
        self._counted_at_start = study.count().counted

    @classmethod
    def on_storage(
        cls,
        *,
        storage_url: str,
        engine: Engine,
        study: optuna.Study,
        spec: StudySpec,
        plans: list[GpuPlan],
        probe: Probe,
        cpu_cores: int,
        cpu_bound: bool = False,
        sim_memory_scale: float = 1.0,
        recycling: Recycling | None = None,
        spare: list[Any] | None = None,
        **options: Any,
    ) -> Pool:
        """The real pool: the study in its database, trials in warm processes on this host
        (`spare`: processes from `orchestrator.processes.prestarted`, taken first)."""
        from orchestrator.processes import WarmProcesses
        from orchestrator.slots import threads_per_trial
        from orchestrator.stored_study import StoredStudy
        from orchestrator.trial_context import Recycling, WorkerConfig

        host = socket.gethostname()
        threads = threads_per_trial(cpu_cores, sum(p.slots for p in plans), cpu_bound=cpu_bound)
        configs = {
            index: WorkerConfig(
                storage_url=storage_url,
                study_name=study.study_name,
                device=plan.device,
                host=host,
                threads=threads,
                sim_memory_scale=sim_memory_scale,
                recycling=recycling or Recycling(),
            )
            for index, plan in enumerate(plans)
        }
        return cls(
            study=StoredStudy(storage_url=storage_url, engine=engine, study=study, spec=spec),
            plans=plans,
            probe=probe,
            backend=WarmProcesses(configs, spare=spare if spare is not None else []),
            host=host,
            **options,
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> PoolResult:
        with self._signals():
            try:
                for supervisor in self.supervisors:
                    self._register(supervisor)
                while self._turn():
                    self.backend.wait(WAIT_S)
                    self._publish()
            finally:
                self._handle(self.backend.close())
                for supervisor in self.supervisors:
                    if supervisor.worker_id is not None:
                        self.study.touch_worker(supervisor.worker_id, stopped=True)
        return PoolResult(
            self.trials_run, sum(s.ooms for s in self.supervisors), self.stop.interrupted
        )

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
            running=self._running(),
            budget_finished=count.finished(self.study.budget),
        )
        if self.stop.timed_out and not was_draining:
            logger.info("--timeout reached: no new trials; running ones finish")
            self._interrupt_not_asked()
        if step in (Step.DONE, Step.STOP_RUNNING):
            return False  # leaving stops what still runs (the grace period is over)
        if step is Step.START and count.may_ask(self.study.budget):
            self._fill(count)
        for supervisor in self.supervisors:
            idle = supervisor.policy.slots - len(supervisor.running)
            self.backend.keep_idle(supervisor.index, idle)
        return True

    def _running(self) -> int:
        return sum(len(s.running) for s in self.supervisors)

    def _every(self, name: str, period: float, action: Callable[[], None]) -> None:
        now = self.clock()
        if now - self._last[name] >= period:
            self._last[name] = now
            action()

    # -- signals --------------------------------------------------------------------------

    @contextmanager
    def _signals(self) -> Iterator[None]:
        def count_signal(signum: int, frame: Any) -> None:
            self.signals += 1  # acted on in the loop: a handler never cuts bookkeeping in half

        previous = {
            sig: signal.signal(sig, count_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _take_signals(self) -> None:
        while self.signals > 0:
            self.signals -= 1
            first = not self.stop.interrupted
            self.stop = self.stop.signalled(self.clock())
            if first:
                logger.warning(
                    "stopping: no new trials; running ones have %.0f s to finish, then are "
                    "stopped and re-queued (again to stop now)",
                    self.stop.grace_s,
                )
                self._interrupt_not_asked()

    def _interrupt_not_asked(self) -> None:
        """Trials that have no number yet are still starting: stop them before they ask."""
        for supervisor in self.supervisors:
            for trial in supervisor.running.values():
                if trial.number is None:
                    self.backend.interrupt(trial.handle)

    # -- starting trials ------------------------------------------------------------------

    def _fill(self, count: BudgetCount) -> None:
        # Each ask takes a waiting trial or a new one: the room is what is neither counted nor
        # running, less our trials that started but have not asked yet.
        not_asked = sum(1 for s in self.supervisors for t in s.running.values() if t.number is None)
        room = self.study.budget - count.counted - count.running - not_asked
        for supervisor in self.supervisors:
            while len(supervisor.running) < supervisor.policy.slots and room > 0:
                device = supervisor.plan.device
                if device is not None:
                    supervisor.policy, change = before_spawn(
                        supervisor.policy,
                        free_mb=self.probe.free_mb(device),
                        total_mb=device.total_mb,
                    )
                    self._record(supervisor, change)
                    if len(supervisor.running) >= supervisor.policy.slots:
                        break
                self._start(supervisor)
                room -= 1

    def _start(self, supervisor: Supervisor) -> None:
        from orchestrator.trial_runner import TrialJob

        job = TrialJob(
            batch_bounds=self.batch_bounds(supervisor), concurrency=supervisor.policy.slots
        )
        handle = self.backend.start(supervisor.index, job)
        policy = supervisor.policy
        supervisor.running[handle] = RunningTrial(handle, policy.started, policy.slots)
        supervisor.policy = policy.trial_started()
        if len(supervisor.running) > 1:
            for other in supervisor.running:
                self.backend.share(other)
        self.trials_run += 1

    def batch_bounds(self, supervisor: Supervisor) -> tuple[int, int]:
        low, high = supervisor.plan.batch_bounds
        limit = self.study.batch_limit(supervisor.gpu_name)
        if limit is not None:
            high = max(low, min(high, limit))
        return low, high

    # -- outcomes -------------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        from orchestrator.processes import Asked

        for event in events:
            for supervisor in self.supervisors:
                trial = supervisor.running.get(event.handle)
                if trial is None:
                    continue
                if isinstance(event, Asked):
                    trial.number = event.number
                else:
                    del supervisor.running[event.handle]
                    self._finished(supervisor, trial, event.outcome)
                break

    def _finished(self, supervisor: Supervisor, trial: RunningTrial, outcome: TrialOutcome) -> None:
        if outcome.state == "NONE":
            self.trials_run -= 1
            return
        number = outcome.trial_number if outcome.trial_number is not None else trial.number
        self._count_failed_start(outcome, asked=number is not None)
        if outcome.recycle and outcome.recycle != "stopped":
            logger.info(
                "%s: a fresh trial process takes over (%s)", supervisor.label, outcome.recycle
            )
        if outcome.interrupted:
            logger.info("%s: trial %s stopped and re-queued", supervisor.label, number)
            return
        if outcome.trial_number is None:
            if number is not None:  # its process died mid-trial: the heartbeat will tell
                logger.warning(
                    "%s: trial %s lost its process (%s); it is re-run once its heartbeat is stale",
                    supervisor.label,
                    number,
                    outcome.error,
                )
            return
        self._log_outcome(supervisor, outcome)
        supervisor.policy, change = after_trial(
            supervisor.policy,
            oom=outcome.oom,
            started_index=trial.started_index,
            slots_at_start=trial.slots_at_start,
            detail=f"trial {outcome.trial_number} ran out of memory with batch size {outcome.batch_size}",
        )
        self._record(supervisor, change)
        self._publish(force=True)

    def _log_outcome(self, supervisor: Supervisor, outcome: TrialOutcome) -> None:
        if outcome.oom:
            supervisor.ooms += 1
            logger.warning(
                "%s: trial %s ran out of memory (batch %s%s)%s",
                supervisor.label,
                outcome.trial_number,
                outcome.batch_size,
                ", alone on the GPU: its batch size is now the limit" if outcome.alone else "",
                "; re-queued" if outcome.requeued else "",
            )
        elif outcome.error and outcome.state == "FAIL":
            logger.warning(
                "%s: trial %s failed: %s", supervisor.label, outcome.trial_number, outcome.error
            )

    def _count_failed_start(self, outcome: TrialOutcome, *, asked: bool) -> None:
        if asked or self.stop.draining:
            self.failed_starts = 0
            return
        self.failed_starts += 1
        logger.warning("a trial process failed before it had a trial: %s", outcome.error)
        if self.failed_starts >= MAX_FAILED_STARTS:
            raise TrialsCannotStart(
                f"{self.failed_starts} trial processes in a row failed before starting a trial; "
                f"the last said: {outcome.error}"
            )

    def _record(self, supervisor: Supervisor, change: SlotChange | None) -> None:
        if change is None:
            return
        device = supervisor.plan.device
        logger.info(
            "%s: slots %d -> %d (%s: %s)",
            supervisor.label,
            change.from_slots,
            change.to_slots,
            change.reason,
            change.detail,
        )
        self.study.record_change(
            records.ConcurrencyEvent(
                at=records.now(),
                host=self.host,
                gpu_index=device.index if device else None,
                gpu_name=supervisor.gpu_name,
                from_slots=change.from_slots,
                to_slots=change.to_slots,
                reason=change.reason,
                detail=change.detail,
            )
        )

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
        detail = f"plan allows {plan.slots} (limited by {plan.limited_by})"
        if supervisor.policy.slots < plan.slots:
            detail += "; starting at half"
        self._record(supervisor, SlotChange(0, supervisor.policy.slots, "start", detail))

    def _touch_workers(self) -> None:
        for supervisor in self.supervisors:
            if supervisor.worker_id is not None:
                self.study.touch_worker(supervisor.worker_id)

    # -- progress -------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        count = self.study.count()
        best = self.study.best()
        gpus = []
        for supervisor in self.supervisors:
            device = supervisor.plan.device
            used = total = None
            if device is not None:
                total = device.total_mb
                used = max(0.0, total - self.probe.free_mb(device))
            gpus.append(
                GpuSnapshot(
                    label=supervisor.label,
                    slots=supervisor.policy.slots,
                    max_slots=supervisor.policy.max_slots,
                    running=len(supervisor.running),
                    vram_used_mb=used,
                    vram_total_mb=total,
                    ooms=supervisor.ooms,
                    batch_bounds=self.batch_bounds(supervisor),
                )
            )
        return PoolSnapshot(
            study_name=self.study.name,
            budget=self.study.budget,
            counted=count.counted,
            running=count.running,
            waiting=count.waiting,
            best_value=best.value if best else None,
            best_trial=best.number if best else None,
            direction=self.study.direction,
            metric=self.metric,
            elapsed_s=self.clock() - self.stop.started_at,
            gpus=tuple(gpus),
            ooms=sum(s.ooms for s in self.supervisors),
            retries=count.retried,
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
