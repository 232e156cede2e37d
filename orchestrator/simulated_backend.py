"""Simulated trials on a virtual clock: the real pool loop, without processes or a database.

`SimulatedTrials` is a `TrialBackend` whose trials are drawn from a list of (true memory,
duration) and whose GPUs are memory ledgers; `SimulatedStudy` counts the budget as the database
would. `orchestrator.pool.Pool` runs on them unchanged, with the backend's clock, so
`benchmarks/bench_pool.py` measures the very loop `run` uses, in seconds for hours of trials.
A trial that does not fit runs out of memory `oom_after_s` after it starts; its time is lost.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.processes import Asked, Event, Finished
from orchestrator.study import BudgetCount
from orchestrator.trial_runner import TrialJob, TrialOutcome

if TYPE_CHECKING:
    from orchestrator import records
    from orchestrator.gpu.base import Device
    from orchestrator.stored_study import Best


@dataclass(frozen=True)
class SimTrial:
    batch_size: int
    true_mb: float  # what it really holds on the GPU
    seconds: float  # how long it trains when it fits


@dataclass
class SimulatedStudy:
    """The budget as the database would count it, and the records kept in lists."""

    budget: int
    name: str = "simulated"
    direction: str = "minimize"
    max_retries: int = 2
    complete: int = 0
    failed: int = 0  # final: out of retries
    retried: int = 0
    running: int = 0
    waiting: list[tuple[int, int]] = field(default_factory=list)  # (trial index, retries)
    events: list[records.ConcurrencyEvent] = field(default_factory=list)
    next_new: int = 0  # the next trial of the list that was never asked

    def count(self) -> BudgetCount:
        return BudgetCount(
            complete=self.complete,
            failed=self.failed,
            retried=self.retried,
            running=self.running,
            waiting=len(self.waiting),
        )

    def ask(self) -> tuple[int, int]:
        """The next trial to run: a queued re-run first, else a new one."""
        self.running += 1
        if self.waiting:
            return self.waiting.pop(0)
        self.next_new += 1
        return self.next_new - 1, 0

    def tell(self, index: int, retries: int, *, oom: bool) -> bool:
        """Count a finished trial; True when an OOM'd one was queued for a re-run."""
        self.running -= 1
        if not oom:
            self.complete += 1
            return False
        if retries < self.max_retries:
            self.retried += 1
            self.waiting.append((index, retries + 1))
            return True
        self.failed += 1
        return False

    def fail_stale(self) -> None:
        pass

    def best(self) -> Best | None:
        return None

    def batch_limit(self, gpu_name: str) -> int | None:
        return None

    def record_change(self, event: records.ConcurrencyEvent) -> None:
        self.events.append(event)

    def register_worker(self, *, host: str, gpu_index: int | None, gpu_name: str, pid: int) -> int:
        return 1

    def touch_worker(self, worker_id: int, *, stopped: bool = False) -> None:
        pass


@dataclass(order=True)
class _Running:
    ends_at: float
    handle: int
    gpu: int = field(compare=False)
    index: int = field(compare=False)
    retries: int = field(compare=False)
    held_mb: float = field(compare=False)  # 0 for a trial that is going to run out of memory
    oom: bool = field(compare=False)


class SimulatedTrials:
    """A TrialBackend of simulated trials on simulated GPUs, with a virtual clock."""

    def __init__(
        self,
        study: SimulatedStudy,
        trials: list[SimTrial],
        devices: list[Device],
        *,
        oom_after_s: float = 5.0,
    ) -> None:
        self.study = study
        self.trials = trials
        self.devices = devices
        self.oom_after_s = oom_after_s
        self.now = 0.0
        self.used_mb = [0.0 for _ in devices]
        self.ooms = 0
        self._queue: list[_Running] = []
        self._pending: list[Event] = []
        self._handles = itertools.count(1)

    def clock(self) -> float:
        return self.now

    def free_mb(self, device: Device) -> float:
        """The probe's answer: what the simulated GPU's ledger leaves free."""
        return device.total_mb - self.used_mb[device.index]

    def start(self, gpu: int, job: TrialJob) -> int:
        handle = next(self._handles)
        if self.study.next_new >= len(self.trials) and not self.study.waiting:
            self._pending.append(Finished(handle, TrialOutcome(None, "NONE")))
            return handle
        index, retries = self.study.ask()
        self._pending.append(Asked(handle, index))
        trial = self.trials[index]
        oom = self.used_mb[gpu] + trial.true_mb > self.devices[gpu].total_mb
        held = 0.0 if oom else trial.true_mb
        self.used_mb[gpu] += held
        ends = self.now + (self.oom_after_s if oom else trial.seconds)
        heapq.heappush(self._queue, _Running(ends, handle, gpu, index, retries, held, oom))
        return handle

    def share(self, handle: int) -> None:
        pass

    def events(self) -> list[Event]:
        events, self._pending = self._pending, []
        return events

    def interrupt(self, handle: int) -> None:
        pass  # simulated trials are never stopped early

    def wait(self, timeout: float) -> None:
        """Move the clock to the next trial's end (or by `timeout`) and finish what ended."""
        if self._pending:
            return
        until = self.now + timeout
        if self._queue and self._queue[0].ends_at <= until:
            until = self._queue[0].ends_at
        self.now = until
        while self._queue and self._queue[0].ends_at <= self.now:
            self._finish(heapq.heappop(self._queue))

    def _finish(self, trial: _Running) -> None:
        self.used_mb[trial.gpu] -= trial.held_mb
        self.ooms += trial.oom
        requeued = self.study.tell(trial.index, trial.retries, oom=trial.oom)
        outcome = TrialOutcome(
            trial.index,
            "FAIL" if trial.oom else "COMPLETE",
            oom=trial.oom,
            batch_size=self.trials[trial.index].batch_size,
            requeued=requeued,
        )
        self._pending.append(Finished(trial.handle, outcome))

    def keep_idle(self, gpu: int, count: int) -> None:
        pass

    def close(self) -> list[Event]:
        return self.events()
