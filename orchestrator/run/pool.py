"""The pool loop: fills every GPU of a host with trials of one study, admitted by their bytes.

The loop decides and the parts around it act: each GPU's supervisor (`orchestrator.run.supervisor`,
with the pure rules of `orchestrator.run.admission` and `orchestrator.planning.footprint`) says which trial
may train now and learns from each one, the stop conditions (`orchestrator.run.stopping`) say when to
start nothing new and when to end, a backend (`orchestrator.run.processes`) runs the trials, and the
study (`orchestrator.run.stored_study`) counts the budget and keeps the records. Every one of them
is given to `Pool`, with the clock, so the same loop runs real processes on real or simulated
GPUs and, in the benchmark, simulated trials on a virtual clock.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.record import records
from orchestrator.run.admission import Change
from orchestrator.run.snapshot import GpuSnapshot, PoolSnapshot
from orchestrator.run.stopping import Step, Stop, next_step
from orchestrator.run.supervisor import RunningTrial, Supervisor

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import Engine

    from orchestrator.gpu.base import Probe
    from orchestrator.planning.planner import GpuPlan
    from orchestrator.record.study import BudgetCount, StudySpec
    from orchestrator.run.processes import Event, TrialBackend
    from orchestrator.run.stored_study import StoredStudy
    from orchestrator.run.trial_context import Recycling
    from orchestrator.run.trial_messages import TrialOutcome

logger = logging.getLogger(__name__)

STALE_CHECK_S = 5.0  # how often this worker looks for trials whose process went silent
TOUCH_S = 10.0  # how often it says it is alive in orch_workers
WAIT_S = 0.5  # the longest the loop sleeps when nothing happens


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
        learn: bool = True,
    ) -> None:
        self.study = study
        self.probe = probe
        self.backend = backend
        self.metric = metric
        self.on_update = on_update
        self.clock = clock
        self.host = host or socket.gethostname()
        self.supervisors = [
            Supervisor.for_plan(index, plan, learn=learn) for index, plan in enumerate(plans)
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
        log_dir: str | None = None,
        spare: list[Any] | None = None,
        adapter_name: str | None = None,
        **options: Any,
    ) -> Pool:
        """The real pool: the study in its database, trials in warm processes on this host
        (`spare`: processes from `orchestrator.run.processes.prestarted`, taken first)."""
        from orchestrator.planning.planner import threads_per_trial
        from orchestrator.run.processes import WarmProcesses
        from orchestrator.run.stored_study import StoredStudy
        from orchestrator.run.trial_context import Recycling, WorkerConfig

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
                log_dir=log_dir,
            )
            for index, plan in enumerate(plans)
        }
        return cls(
            study=StoredStudy(
                storage_url=storage_url,
                engine=engine,
                study=study,
                spec=spec,
                adapter_name=adapter_name,
            ),
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
                self._close()
        return PoolResult(
            self.trials_run, sum(s.ooms for s in self.supervisors), self.stop.interrupted
        )

    def _close(self) -> None:
        """Stop what still runs and say so in the records, without waiting for a database that
        is away (the run is ending, perhaps because of it: each write is tried once)."""
        from orchestrator.record.outage import is_outage, single_attempt

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
            running=self._running(),
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
            if self.signals > 1:
                # Two not yet taken: the loop is stuck (riding out a database outage, say) and
                # the user asked twice. Stop now, as a second signal always means.
                raise KeyboardInterrupt("stopped by a second signal")

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
        not_asked = sum(1 for s in self.supervisors for t in s.running.values() if t.number is None)
        room = self.study.budget - count.counted - count.running - not_asked
        for supervisor in self.supervisors:
            while room > 0 and supervisor.wants_another():
                self._start(supervisor)
                room -= 1

    def _start(self, supervisor: Supervisor) -> None:
        from orchestrator.run.trial_messages import TrialJob

        job = TrialJob(batch_bounds=self.batch_bounds(supervisor))
        handle = self.backend.start(supervisor.index, job)
        supervisor.running[handle] = RunningTrial(handle)
        self.trials_run += 1

    def _admit_waiting(self) -> None:
        """Admit, on each GPU, every waiting trial that fits, in turn."""
        from orchestrator.run.trial_messages import Go

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
        from orchestrator.run.processes import Asked, Sized, Using

        for event in events:
            for supervisor in self.supervisors:
                trial = supervisor.running.get(event.handle)
                if trial is None:
                    continue
                if isinstance(event, Asked):
                    trial.number = event.number
                elif isinstance(event, Sized):
                    trial.sized, trial.batch_size = True, event.batch_size
                elif isinstance(event, Using):
                    trial.using_mb = event.mb
                else:
                    del supervisor.running[event.handle]
                    self._finished(supervisor, trial, event.outcome)
                break

    def _finished(self, supervisor: Supervisor, trial: RunningTrial, outcome: TrialOutcome) -> None:
        if outcome.state == "NONE":
            self.trials_run -= 1
            return
        number = outcome.trial_number if outcome.trial_number is not None else trial.number
        if outcome.unreachable:  # the database, not the set-up: this pool meets it too
            logger.warning("%s: a trial process gave up: %s", supervisor.label, outcome.error)
            return
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
        learnt_before = supervisor.footprint
        self._record(supervisor, supervisor.finished(trial, outcome))
        if supervisor.footprint != learnt_before:
            self.study.save_footprint(supervisor.gpu_name, supervisor.footprint)
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
                "%s: trial %s failed: %s%s",
                supervisor.label,
                outcome.trial_number,
                outcome.error,
                _tail(outcome.log_file),
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

    def _record(self, supervisor: Supervisor, change: Change | None) -> None:
        if change is None:
            return
        device = supervisor.device
        before = supervisor.trials_that_fit(change.from_mb) if change.from_mb > 0 else 0
        after = supervisor.trials_that_fit(change.to_mb)
        logger.info(
            "%s: memory for trials %s -> %s (about %d -> %d at once; %s: %s)",
            supervisor.label,
            mb_words(change.from_mb),
            mb_words(change.to_mb),
            before,
            after,
            change.reason,
            change.detail,
        )
        self.study.record_change(
            records.ConcurrencyEvent(
                at=records.now(),
                host=self.host,
                gpu_index=device.index if device else None,
                gpu_name=supervisor.gpu_name,
                from_slots=before,
                to_slots=after,
                reason=change.reason,
                detail=change.detail,
                from_mb=_finite(change.from_mb),
                to_mb=_finite(change.to_mb),
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
        plan, budget = supervisor.plan, supervisor.budget
        detail = f"at most {plan.slots} at once (limited by {plan.limited_by})"
        if budget.allowance_mb < budget.usable_mb:
            detail += "; starting at half"
        self._record(supervisor, Change(0.0, budget.allowance_mb, "start", detail))

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
                    slots=supervisor.trials_that_fit(supervisor.budget.allowance_mb),
                    max_slots=supervisor.budget.max_trials,
                    running=len(supervisor.admitted()),
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


def mb_words(mb: float) -> str:
    """'9,830 MB', or 'no limit' for the CPU's allowance."""
    return f"{mb:,.0f} MB" if math.isfinite(mb) else "no limit"


def _finite(mb: float) -> float | None:
    return mb if math.isfinite(mb) else None


def _tail(log_file: str | None) -> str:
    """A failed trial's last lines, indented under the log line that says it failed."""
    from orchestrator.record.trial_logs import last_lines

    if log_file is None:
        return ""
    lines = last_lines(log_file)
    if not lines:
        return f" (log: {log_file})"
    return f"; the end of {log_file}:\n" + "\n".join(f"    {line}" for line in lines)
