"""Per-GPU supervisors: as many trial processes as the plan allows, protected from out-of-memory.

The policy (how many slots now, and why) is plain values and functions, driven by tests without
processes or sleeping: `SlotPolicy.start`, `after_trial`, `before_spawn` return a new policy and,
when the slots change, a `SlotChange` saying why. The five layers of seed 002:

1. conservative estimate: the plan sizes slots at the minimum batch with 20% of VRAM kept free;
2. ramp-up: start at ceil(max/2), go to max once the first wave finished without an OOM
   (and after a halving, two clean waves earn one slot back: additive increase);
3. per-trial catch: an OOM fails only that trial, which is re-queued; slots halve;
4. watchdog: before filling a slot, free VRAM under 10% of total halves the slots;
5. degradation: never below one slot; a trial that runs out of memory alone lowers the GPU's
   batch-size limit (the trial process records it; later bounds stay below it).

`Pool` is the process side: it spawns `trial_runner.run_trial` processes, collects outcomes,
applies the policy, and records every change of slots in orch_concurrency_events.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.snapshot import GpuSnapshot, PoolSnapshot

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    import optuna
    from sqlalchemy.engine import Engine

    from orchestrator.gpu.base import Probe
    from orchestrator.planner import GpuPlan
    from orchestrator.study import StudySpec
    from orchestrator.trial_runner import TrialOutcome

logger = logging.getLogger(__name__)

WATCHDOG_FREE_FRACTION = 0.10


# --- policy: decisions as values -----------------------------------------------------------


@dataclass(frozen=True)
class SlotChange:
    from_slots: int
    to_slots: int
    reason: str  # start | rampup | oom | watchdog | degrade
    detail: str


@dataclass(frozen=True)
class SlotPolicy:
    max_slots: int
    slots: int
    first_wave: int  # trials in the first wave, all started at the initial slots
    started: int = 0
    first_wave_done: int = 0
    ramped: bool = False  # ramp-up is over: done, or given up after an OOM
    clean: int = 0  # trials finished without an OOM since the slots last went down

    @classmethod
    def start(cls, max_slots: int) -> SlotPolicy:
        if max_slots < 1:
            raise ValueError(f"max_slots={max_slots} must be at least 1")
        initial = math.ceil(max_slots / 2)
        return cls(
            max_slots=max_slots, slots=initial, first_wave=initial, ramped=initial == max_slots
        )

    def trial_started(self) -> SlotPolicy:
        return replace(self, started=self.started + 1)

    def in_first_wave(self, started_index: int) -> bool:
        return started_index < self.first_wave


def _halved(policy: SlotPolicy, reason: str, detail: str) -> tuple[SlotPolicy, SlotChange | None]:
    new = max(1, policy.slots // 2)
    if new == policy.slots:
        return replace(policy, ramped=True), None
    if new == 1:
        detail = f"{detail}; one trial at a time from now on"
        reason = "degrade"
    return replace(policy, slots=new, ramped=True, clean=0), SlotChange(
        policy.slots, new, reason, detail
    )


def after_trial(
    policy: SlotPolicy,
    *,
    oom: bool,
    started_index: int,
    slots_at_start: int,
    detail: str = "",
) -> tuple[SlotPolicy, SlotChange | None]:
    """A trial finished. An OOM halves the slots, unless they were already cut below what the
    trial started under (several OOMs of one crowded moment halve once, not once each)."""
    if oom:
        if slots_at_start > policy.slots:
            return replace(policy, ramped=True), None
        return _halved(policy, "oom", detail or "a trial ran out of memory")
    if policy.ramped:
        return _recovered(policy)
    if not policy.in_first_wave(started_index):
        return policy, None
    done = policy.first_wave_done + 1
    policy = replace(policy, first_wave_done=done)
    if done < policy.first_wave:
        return policy, None
    change = SlotChange(
        policy.slots, policy.max_slots, "rampup", "first wave finished without an OOM"
    )
    return replace(policy, slots=policy.max_slots, ramped=True), change


RECOVERY_WAVES = 2


def _recovered(policy: SlotPolicy) -> tuple[SlotPolicy, SlotChange | None]:
    """Additive increase after a multiplicative decrease: two full waves without an OOM earn one
    slot back, up to the plan. A halving on one unlucky trial then costs minutes, not the study."""
    clean = policy.clean + 1
    if policy.slots >= policy.max_slots or clean < RECOVERY_WAVES * policy.slots:
        return replace(policy, clean=clean), None
    grown = policy.slots + 1
    detail = f"{clean} trials in a row without an OOM"
    return replace(policy, slots=grown, clean=0), SlotChange(policy.slots, grown, "rampup", detail)


def before_spawn(
    policy: SlotPolicy, *, free_mb: float | None, total_mb: float | None
) -> tuple[SlotPolicy, SlotChange | None]:
    """The watchdog: little free VRAM (someone else's, or our estimate was low) halves the slots."""
    if free_mb is None or not total_mb:
        return policy, None
    if free_mb >= WATCHDOG_FREE_FRACTION * total_mb:
        return policy, None
    detail = f"only {free_mb:.0f} of {total_mb:.0f} MB free before starting a trial"
    return _halved(policy, "watchdog", detail)


def threads_per_trial(cpu_cores: int, total_slots: int, *, cpu_bound: bool = False) -> int:
    """Torch threads for one trial. CPU-bound work (RL: small networks, environment steps) runs
    fastest on one thread each, the planner already keeping trials within the cores; other work
    shares the host's cores among the trials that run at once."""
    if cpu_bound:
        return 1
    return max(1, cpu_cores // max(1, total_slots))


# --- processes -----------------------------------------------------------------------------


@dataclass
class RunningTrial:
    process: BaseProcess
    conn: Connection
    had_company: Any  # multiprocessing Value: did another trial share the GPU while it ran?
    started_index: int
    slots_at_start: int
    trial_number: int | None = None  # known once the trial process has asked
    outcome: TrialOutcome | None = None

    def read_messages(self) -> None:
        """Take what the trial process sent: ("asked", number) first, its TrialOutcome last."""
        try:
            while self.outcome is None and self.conn.poll():
                message = self.conn.recv()
                if isinstance(message, tuple) and message[0] == "asked":
                    self.trial_number = message[1]
                else:
                    self.outcome = message
        except (EOFError, OSError):
            pass


def _unreported(running: list[RunningTrial]) -> int:
    """Trial processes that have not sent their outcome yet (one that has is only exiting)."""
    for trial in running:
        trial.read_messages()
    return sum(1 for trial in running if trial.outcome is None)


@dataclass
class Supervisor:
    """One GPU (or the CPU, when there is none): its plan, policy and trial processes."""

    plan: GpuPlan
    policy: SlotPolicy
    worker_id: int | None = None
    running: list[RunningTrial] = field(default_factory=list)
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
        storage_url: str,
        engine: Engine,
        study: optuna.Study,
        spec: StudySpec,
        plans: list[GpuPlan],
        probe: Probe,
        cpu_cores: int,
        cpu_bound: bool = False,
        sim_memory_scale: float = 1.0,
        timeout_s: float | None = None,
        grace_s: float = 30.0,
        metric: str = "objective",
        on_update: Callable[[PoolSnapshot], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage_url = storage_url
        self.study = study
        self.spec = spec
        self.probe = probe
        self.cpu_cores = cpu_cores
        self.cpu_bound = cpu_bound
        self.sim_memory_scale = sim_memory_scale
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.metric = metric
        self.on_update = on_update
        self.clock = clock
        self.host = socket.gethostname()
        self.engine = engine
        self.supervisors = [
            Supervisor(plan=plan, policy=SlotPolicy.start(plan.slots)) for plan in plans
        ]
        self.context = mp.get_context("spawn")
        self.started_at = clock()
        self.stop_requested_at: float | None = None  # a signal: running trials get the grace period
        self.timed_out = False  # --timeout: no new trials, running ones finish in their own time
        self.failed_starts = 0
        self.trials_run = 0
        self._last_touch = 0.0
        self._last_publish = 0.0
        self._last_stale_check = float("-inf")
        self._counted_at_start = self._count().counted

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> PoolResult:
        previous = {
            sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            for supervisor in self.supervisors:
                self._register(supervisor)
            while True:
                self._collect_finished()
                count = self._count()
                if self._should_stop(count):
                    break
                if not self._stopping and count.may_ask(self.spec.trials):
                    self._fill_slots(count)
                self._heartbeat_workers()
                self._wait(0.5)
            return PoolResult(
                self.trials_run,
                sum(s.ooms for s in self.supervisors),
                self.stop_requested_at is not None,
            )
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for supervisor in self.supervisors:
                if supervisor.worker_id is not None:
                    records.touch_worker(self.engine, supervisor.worker_id, stopped=True)

    @property
    def _stopping(self) -> bool:
        return self.stop_requested_at is not None or self.timed_out

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = self.clock()
            logger.warning(
                "stopping: no new trials; running ones have %.0f s to finish, then are stopped "
                "and re-queued (again to stop now)",
                self.grace_s,
            )
            self._stop_not_asked()
        else:
            self.grace_s = 0.0  # a second signal: stop now

    def _should_stop(self, count: Any) -> bool:
        running_here = sum(len(s.running) for s in self.supervisors)
        if self.stop_requested_at is not None:
            if running_here and self.clock() - self.stop_requested_at >= self.grace_s:
                self._stop_all()
                return True
            return running_here == 0
        timeout_reached = (
            self.timeout_s is not None and self.clock() - self.started_at >= self.timeout_s
        )
        if timeout_reached and not self.timed_out:
            logger.info("--timeout reached: no new trials; running ones finish")
            self.timed_out = True
            self._stop_not_asked()
        if self.timed_out:
            return running_here == 0
        # While trials of ours run, or trials elsewhere hold the rest of the budget, keep going:
        # one of theirs may die and be re-queued (we find it stale and pick it up).
        return running_here == 0 and count.finished(self.spec.trials)

    def _stop_not_asked(self) -> None:
        """Trial processes still starting up have no trial yet: stop them before they ask."""
        for supervisor in self.supervisors:
            for trial in supervisor.running:
                trial.read_messages()
                if trial.trial_number is None and trial.process.is_alive():
                    trial.process.terminate()

    def _count(self) -> Any:
        import optuna

        from orchestrator.study import count_trials

        if self.clock() - self._last_stale_check > 5:
            self._last_stale_check = self.clock()
            from orchestrator.locks import budget_lock

            with budget_lock(self.storage_url, self.study.study_name):
                optuna.storages.fail_stale_trials(self.study)
        return count_trials(self.study.get_trials(deepcopy=False))

    def _wait(self, timeout: float) -> None:
        from multiprocessing.connection import wait

        sentinels = [t.process.sentinel for s in self.supervisors for t in s.running]
        if sentinels:
            wait(sentinels, timeout=timeout)
        else:
            time.sleep(timeout)
        self._publish()

    # -- filling slots --------------------------------------------------------------------

    def _fill_slots(self, count: Any) -> None:
        # Each ask takes a waiting trial or a new one: the room is what is neither counted nor
        # running, less our processes that started but have not asked yet.
        not_asked = sum(1 for s in self.supervisors for t in s.running if t.trial_number is None)
        budget_room = self.spec.trials - count.counted - count.running - not_asked
        for supervisor in self.supervisors:
            while len(supervisor.running) < supervisor.policy.slots and budget_room > 0:
                device = supervisor.plan.device
                if device is not None:
                    free = self.probe.free_mb(device)
                    supervisor.policy, change = before_spawn(
                        supervisor.policy, free_mb=free, total_mb=device.total_mb
                    )
                    self._record(supervisor, change)
                    if len(supervisor.running) >= supervisor.policy.slots:
                        break
                self._spawn(supervisor)
                budget_room -= 1

    def _batch_bounds(self, supervisor: Supervisor) -> tuple[int, int]:
        low, high = supervisor.plan.batch_bounds
        limit = records.load_batch_limit(
            self.engine, study_name=self.study.study_name, gpu_name=supervisor.gpu_name
        )
        if limit is not None:
            high = max(low, min(high, limit))
        return low, high

    def _spawn(self, supervisor: Supervisor) -> None:
        from orchestrator.trial_runner import TrialJob, run_trial

        total_slots = sum(s.policy.slots for s in self.supervisors)
        job = TrialJob(
            storage_url=self.storage_url,
            study_name=self.study.study_name,
            device=supervisor.plan.device,
            batch_bounds=self._batch_bounds(supervisor),
            concurrency=supervisor.policy.slots,
            threads=threads_per_trial(self.cpu_cores, total_slots, cpu_bound=self.cpu_bound),
            host=self.host,
            sim_memory_scale=self.sim_memory_scale,
            seed_offset=self.trials_run
            + 1000 * (supervisor.plan.device.index if supervisor.plan.device else 0),
        )
        receiver, sender = self.context.Pipe(duplex=False)
        had_company = self.context.Value("b", 0)
        process = self.context.Process(
            target=run_trial, args=(job, sender, had_company), daemon=False
        )
        process.start()
        sender.close()
        supervisor.running.append(
            RunningTrial(
                process, receiver, had_company, supervisor.policy.started, supervisor.policy.slots
            )
        )
        supervisor.policy = supervisor.policy.trial_started()
        if len(supervisor.running) > 1:
            for trial in supervisor.running:
                trial.had_company.value = 1
        self.trials_run += 1

    # -- outcomes -------------------------------------------------------------------------

    def _collect_finished(self) -> None:
        for supervisor in self.supervisors:
            for trial in supervisor.running:
                trial.read_messages()
            for trial in [t for t in supervisor.running if not t.process.is_alive()]:
                supervisor.running.remove(trial)
                outcome = self._outcome(trial)
                trial.process.join()
                if outcome.state == "NONE":
                    self.trials_run -= 1
                    continue
                self._count_failed_start(outcome)
                if outcome.interrupted or outcome.trial_number is None:
                    # Stopped by us, or gone before it had a trial: nothing about memory.
                    if outcome.interrupted:
                        logger.info(
                            "%s: trial %s stopped and re-queued",
                            supervisor.label,
                            outcome.trial_number,
                        )
                    continue
                if outcome.oom:
                    supervisor.ooms += 1
                    logger.warning(
                        "%s: trial %s ran out of memory (batch %s%s)%s",
                        supervisor.label,
                        outcome.trial_number,
                        outcome.batch_size,
                        ", alone on the GPU: its batch size is now the limit"
                        if outcome.alone
                        else "",
                        "; re-queued" if outcome.requeued else "",
                    )
                elif outcome.error and outcome.state == "FAIL":
                    logger.warning(
                        "%s: trial %s failed: %s",
                        supervisor.label,
                        outcome.trial_number,
                        outcome.error,
                    )
                supervisor.policy, change = after_trial(
                    supervisor.policy,
                    oom=outcome.oom,
                    started_index=trial.started_index,
                    slots_at_start=trial.slots_at_start,
                    detail=f"trial {outcome.trial_number} ran out of memory with batch size {outcome.batch_size}",
                )
                self._record(supervisor, change)
                self._publish(force=True)

    def _count_failed_start(self, outcome: TrialOutcome) -> None:
        if outcome.trial_number is not None or self._stopping:
            self.failed_starts = 0
            return
        self.failed_starts += 1
        logger.warning("a trial process failed before it had a trial: %s", outcome.error)
        if self.failed_starts >= MAX_FAILED_STARTS:
            raise TrialsCannotStart(
                f"{self.failed_starts} trial processes in a row failed before starting a trial; "
                f"the last said: {outcome.error}"
            )

    def _outcome(self, trial: RunningTrial) -> TrialOutcome:
        from orchestrator.trial_runner import TrialOutcome

        trial.read_messages()
        trial.conn.close()
        if trial.outcome is not None:
            return trial.outcome
        # Killed before it could report: its trial stays RUNNING until its heartbeat goes stale,
        # then the next look for stale trials fails and re-queues it.
        code = trial.process.exitcode
        return TrialOutcome(
            trial.trial_number,
            "FAIL",
            error=f"trial process exited with code {code} before reporting",
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
        records.record_concurrency_event(
            self.engine,
            study_name=self.study.study_name,
            event=records.ConcurrencyEvent(
                at=records.now(),
                host=self.host,
                gpu_index=device.index if device else None,
                gpu_name=supervisor.gpu_name,
                from_slots=change.from_slots,
                to_slots=change.to_slots,
                reason=change.reason,
                detail=change.detail,
            ),
        )

    # -- bookkeeping ----------------------------------------------------------------------

    def _register(self, supervisor: Supervisor) -> None:
        import os

        device = supervisor.plan.device
        supervisor.worker_id = records.register_worker(
            self.engine,
            study_name=self.study.study_name,
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

    def _heartbeat_workers(self) -> None:
        now = self.clock()
        if now - self._last_touch < 10:
            return
        self._last_touch = now
        for supervisor in self.supervisors:
            if supervisor.worker_id is not None:
                records.touch_worker(self.engine, supervisor.worker_id)

    def _stop_all(self) -> None:
        """SIGTERM every trial process (they fail their trial and re-queue it), then wait."""
        for supervisor in self.supervisors:
            for trial in supervisor.running:
                if trial.process.is_alive():
                    trial.process.terminate()
        deadline = time.monotonic() + 30
        for supervisor in self.supervisors:
            for trial in supervisor.running:
                trial.process.join(max(0.1, deadline - time.monotonic()))
                if trial.process.is_alive():
                    trial.process.kill()
                    trial.process.join()
        self._collect_finished()

    # -- progress -------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        from optuna.trial import TrialState

        from orchestrator.study import count_trials

        trials = self.study.get_trials(deepcopy=False)
        count = count_trials(trials)
        complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        best = None
        if complete:
            pick = max if self.spec.direction == "maximize" else min
            best = pick(complete, key=lambda t: t.value)
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
                    running=_unreported(supervisor.running),
                    vram_used_mb=used,
                    vram_total_mb=total,
                    ooms=supervisor.ooms,
                    batch_bounds=self._batch_bounds(supervisor),
                )
            )
        return PoolSnapshot(
            study_name=self.study.study_name,
            budget=self.spec.trials,
            counted=count.counted,
            running=count.running,
            waiting=count.waiting,
            best_value=best.value if best else None,
            best_trial=best.number if best else None,
            direction=self.spec.direction,
            metric=self.metric,
            elapsed_s=self.clock() - self.started_at,
            gpus=tuple(gpus),
            ooms=sum(s.ooms for s in self.supervisors),
            retries=count.retried,
            counted_at_start=self._counted_at_start,
        )

    def _publish(self, force: bool = False) -> None:
        if self.on_update is None:
            return
        now = self.clock()
        if not force and now - self._last_publish < 1.0:
            return
        self._last_publish = now
        self.on_update(self.snapshot())
