"""Simulated trials on a virtual clock: the real pool loop, without processes or a database.

`SimulatedTrials` is a `TrialBackend` whose trials are drawn from a list of (true memory,
duration) and whose GPUs are memory ledgers; `SimulatedStudy` counts the budget as the database
would. `orchestrator.run.pool.loop.Pool` runs on them unchanged, with the backend's clock, so
`benchmarks/bench_pool.py` measures the very loop `run` uses, in seconds for hours of trials.
A trial takes its memory a few seconds after it starts and, if it does not fit, runs out of
memory then; the time until then is lost.

Trials on one GPU share its compute (`busy_fraction`). A trial alone keeps its GPU busy only part
of the time (data loading, the Python between kernels, small kernels, host-device copies): call
that part u. Processes on one GPU without MPS take turns on it, so trials beside one another cost
nothing while their parts add up to at most the whole GPU, and beyond that they divide it: with n
on the GPU each goes at min(1, 1 / (n u)) of its speed alone (processor sharing, the model of a
time-sliced server). It is the simplest model with the two facts that decide placement: a lightly
loaded GPU runs another trial for free, and a full one is no faster for more. Every GPU has the
same compute whatever its memory (as an A100 of 40 GB and of 80 GB); `None` turns sharing off.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.record.study.spec import BudgetCount
from orchestrator.run.backend import Asked, Event, Finished, Sized, VramPeak
from orchestrator.run.messages import Go, TrialJob, TrialOutcome

if TYPE_CHECKING:
    from orchestrator.gpu.base import Device
    from orchestrator.planning.footprint import Footprint
    from orchestrator.record.store import records
    from orchestrator.run.pool.stored_study import Best


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
    footprints: dict[str, Footprint] = field(default_factory=dict)
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

    def front_size(self, counted: int) -> int | None:
        return None

    def batch_limit(self, gpu_name: str) -> int | None:
        return None

    def save_footprint(self, gpu_name: str, footprint: Footprint) -> None:
        self.footprints[gpu_name] = footprint

    def record_change(self, event: records.ConcurrencyEvent) -> None:
        self.events.append(event)

    def register_worker(self, *, host: str, gpu_index: int | None, gpu_name: str, pid: int) -> int:
        return 1

    def touch_worker(self, worker_id: int, *, stopped: bool = False) -> None:
        pass


@dataclass
class _Running:
    handle: int
    gpu: int
    index: int
    retries: int
    work_s: float = 0.0  # how far it got, in seconds of training alone on its GPU
    allocated: bool = False
    held_mb: float = 0.0
    oom: bool = False


EPSILON_S = 1e-9  # a step this close counts as reached (the clock adds up floats)


def speed(trials_on_gpu: int, busy_fraction: float | None) -> float:
    """A trial's speed against alone, beside `trials_on_gpu - 1` others (see the module's doc)."""
    if busy_fraction is None or trials_on_gpu <= 1:
        return 1.0
    return min(1.0, 1.0 / (trials_on_gpu * busy_fraction))


class SimulatedTrials:
    """A TrialBackend of simulated trials on simulated GPUs, with a virtual clock.

    A trial takes its memory `allocate_after_s` (of training alone) after it is admitted (the model
    and the first batch, as on a real GPU: free memory does not show a trial that has just
    started), and runs out of memory then if it does not fit. With `busy_fraction`, trials on one
    GPU slow each other down as the module's doc says."""

    def __init__(
        self,
        study: SimulatedStudy,
        trials: list[SimTrial],
        devices: list[Device],
        *,
        allocate_after_s: float = 5.0,
        busy_fraction: float | None = None,
    ) -> None:
        self.study = study
        self.trials = trials
        self.devices = devices
        self.allocate_after_s = allocate_after_s
        self.busy_fraction = busy_fraction
        self.now = 0.0
        self.used_mb = [0.0 for _ in devices]
        self.oomed: list[int] = []  # the list index of every trial that ran out of memory
        self.admitted_on = [0 for _ in devices]  # trials admitted on each GPU
        self._running: dict[int, _Running] = {}  # admitted, not finished, by handle
        self._pending: list[Event] = []
        self._handles = itertools.count(1)
        self._asked: dict[int, tuple[int, int, int]] = {}  # sized, not yet admitted

    @property
    def ooms(self) -> int:
        return len(self.oomed)

    def clock(self) -> float:
        return self.now

    def free_mb(self, device: Device) -> float:
        """The probe's answer: what the simulated GPU's ledger leaves free."""
        return device.total_mb - self.used_mb[device.index]

    def start(self, gpu: int, job: TrialJob) -> int:
        """Ask for the next trial: it is sized at once (its batch size is in the list)."""
        handle = next(self._handles)
        if self.study.next_new >= len(self.trials) and not self.study.waiting:
            self._pending.append(Finished(handle, TrialOutcome(None, "NONE")))
            return handle
        index, retries = self.study.ask()
        self._asked[handle] = (gpu, index, retries)
        self._pending.append(Asked(handle, index))
        self._pending.append(Sized(handle, self.trials[index].batch_size))
        return handle

    def admit(self, handle: int, go: Go) -> None:
        """It trains: a little later it takes its true memory, or runs out of it."""
        gpu, index, retries = self._asked.pop(handle)
        self._running[handle] = _Running(handle, gpu, index, retries)
        self.admitted_on[gpu] += 1

    def share(self, handle: int) -> None:
        pass

    def events(self) -> list[Event]:
        events, self._pending = self._pending, []
        return events

    def interrupt(self, handle: int) -> None:
        """Only a trial still waiting to be admitted is stopped: it goes back to the queue."""
        if handle in self._asked:
            _, index, retries = self._asked.pop(handle)
            self.study.running -= 1
            self.study.waiting.insert(0, (index, retries))
            self._pending.append(
                Finished(handle, TrialOutcome(index, "FAIL", interrupted=True, requeued=True))
            )

    def _goal_s(self, trial: _Running) -> float:
        """The work at which its next step happens: it takes its memory, or it ends."""
        if not trial.allocated or trial.oom:
            return self.allocate_after_s
        return max(self.trials[trial.index].seconds, self.allocate_after_s)

    def _speeds(self) -> dict[int, float]:
        on_gpu = [0 for _ in self.devices]
        for trial in self._running.values():
            on_gpu[trial.gpu] += 1
        return {
            handle: speed(on_gpu[trial.gpu], self.busy_fraction)
            for handle, trial in self._running.items()
        }

    def wait(self, timeout: float) -> None:
        """Move the clock to the next step of a trial (or by `timeout`) and take what is due.
        Speeds change only when a trial is admitted or ends, which happens between waits."""
        if self._pending:
            return
        speeds = self._speeds()
        step = timeout
        for handle, trial in self._running.items():
            step = min(step, max(0.0, self._goal_s(trial) - trial.work_s) / speeds[handle])
        self.now += step
        for handle, trial in self._running.items():
            trial.work_s += step * speeds[handle]
        for handle in sorted(self._running):
            trial = self._running[handle]
            if trial.work_s < self._goal_s(trial) - EPSILON_S:
                continue
            if trial.allocated:
                self._finish(self._running.pop(handle))
            else:
                self._allocate(trial)

    def _allocate(self, trial: _Running) -> None:
        true_mb = self.trials[trial.index].true_mb
        trial.allocated = True
        if self.used_mb[trial.gpu] + true_mb > self.devices[trial.gpu].total_mb:
            trial.oom = True  # ends now: the time until here is lost
            self._finish(self._running.pop(trial.handle))
        else:
            trial.held_mb = true_mb
            self.used_mb[trial.gpu] += true_mb
            self._pending.append(VramPeak(trial.handle, true_mb))
            if self._goal_s(trial) - trial.work_s < EPSILON_S:
                self._finish(self._running.pop(trial.handle))

    def _finish(self, trial: _Running) -> None:
        self.used_mb[trial.gpu] -= trial.held_mb
        if trial.oom:
            self.oomed.append(trial.index)
        requeued = self.study.tell(trial.index, trial.retries, oom=trial.oom)
        outcome = TrialOutcome(
            trial.index,
            "FAIL" if trial.oom else "COMPLETE",
            oom=trial.oom,
            batch_size=self.trials[trial.index].batch_size,
            requeued=requeued,
            vram_peak_mb=None if trial.oom else trial.held_mb,
        )
        self._pending.append(Finished(trial.handle, outcome))

    def keep_idle(self, gpu: int, count: int) -> None:
        pass

    def close(self) -> list[Event]:
        return self.events()
