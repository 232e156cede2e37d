"""Where trials run: the warm trial processes, the real backend the pool drives.

`WarmProcesses` runs each trial in a long-lived process of that GPU (`orchestrator.run.trial.worker`),
starting a fresh one when none is idle; the pool sees it through `orchestrator.run.backend`.

How a trial process starts, forked from a fork server or spawned, is
`orchestrator.run.pool.trial_start`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import util
from multiprocessing.connection import wait as wait_for_any
from typing import TYPE_CHECKING, Any

from orchestrator.planning.cpu_cores import threads_per_trial
from orchestrator.run.backend import Asked, Event, Finished, Requeuing, Sized, VramPeak
from orchestrator.run.messages import Go, TrialJob, TrialOutcome, TrialSettings, WorkerConfig
from orchestrator.run.pool.trial_start import (
    start_fork_server_now,
    start_process,
    trial_process_context,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from orchestrator.planning.planner import GpuPlan
    from orchestrator.record.store.location import StorageLocation

logger = logging.getLogger(__name__)


@dataclass
class _Process:
    gpu: int
    process: BaseProcess
    conn: Connection
    company: Any  # multiprocessing Value: did another trial share the GPU during this one?
    trial: int | None = None  # the handle of the trial it runs; None while idle
    ending: bool = False  # told to go, or said it will


def _spawn_blank(uses_torch: bool = True) -> _Process:
    """A trial process that imports what trials need, then waits to be told its GPU."""
    # The trial side's modules (with Optuna and SQLAlchemy) load here, when the pool starts its
    # first trial process, not as this module loads: `launch` imports it before the user's input
    # is checked, and that stays quick.
    from orchestrator.run.trial.worker import serve

    context = trial_process_context(uses_torch)
    ours, theirs = context.Pipe(duplex=True)
    company = context.Value("b", 0)
    process = start_process(context, serve, theirs, company, uses_torch)
    theirs.close()
    return _Process(-1, process, ours, company)


def prestart(count: int = 1, *, uses_torch: bool = True) -> list[_Process]:
    """Start the imports trial processes need now, before the study and its GPUs are known, so
    that they overlap the supervisor's own start (storage, migrations, plan) instead of
    following it. With the fork server that is the server itself, started without waiting for
    it (a fork waits until the server has imported everything; by the first trial it has), and
    no process is started yet: the list is empty. With spawn, `count` processes are started.

    `WarmProcesses(spare=...)` takes them from the list; any still in it when this process exits
    (an error came first) are told to go before multiprocessing waits for its children.
    `uses_torch`: whether the study's adapter trains with torch (the module's doc)."""

    context = trial_process_context(uses_torch)
    if context.get_start_method() == "forkserver":
        start_fork_server_now()
        return []
    spare = [_spawn_blank(uses_torch) for _ in range(count)]
    util.Finalize(None, _dismiss_all, args=(spare,), exitpriority=10)
    return spare


def _dismiss_all(spare: list[_Process]) -> None:
    for worker in spare:
        with contextlib.suppress(BrokenPipeError, OSError):
            worker.conn.send(None)
        # A spare may still be unpickling its start-up arguments, which fails with a traceback
        # once this process is gone; it holds nothing yet (no trial, no storage), so it need
        # not finish.
        worker.process.kill()
        worker.process.join()
    spare.clear()


@dataclass
class WarmProcesses:
    """Trials in warm processes, one GPU's configuration each."""

    configs: Mapping[int, WorkerConfig]
    spare: list[_Process] = field(default_factory=list)  # prestarted, not yet given a GPU
    uses_torch: bool = True  # the adapter trains with torch: processes import it before a trial
    processes: list[_Process] = field(default_factory=list)
    _handles: itertools.count = field(default_factory=lambda: itertools.count(1))
    _pending: list[Event] = field(default_factory=list)
    _said: set[str] = field(default_factory=set)  # the trial processes' lines said so far

    @classmethod
    def for_plans(
        cls,
        plans: list[GpuPlan],
        *,
        storage_location: StorageLocation,
        study_name: str,
        host: str,
        cpu_cores: int,
        cpu_bound: bool = False,
        settings: TrialSettings | None = None,  # None: the defaults
        spare: list[_Process] | None = None,
        uses_torch: bool = True,
    ) -> WarmProcesses:
        """Processes for the GPUs of `plans`, in their order, each trial's torch threads a share
        of the host's cores, each process given the host's `settings` (`spare`: from
        `prestart`, taken first)."""

        threads = threads_per_trial(cpu_cores, sum(p.slots for p in plans), cpu_bound=cpu_bound)
        configs = {
            index: WorkerConfig(
                storage=storage_location,
                study_name=study_name,
                device=plan.device,
                host=host,
                threads=threads,
                settings=settings or TrialSettings(),
            )
            for index, plan in enumerate(plans)
        }
        return cls(configs, spare=spare if spare is not None else [], uses_torch=uses_torch)

    def start(self, gpu: int, job: TrialJob) -> int:
        worker = next(
            (p for p in self.processes if p.gpu == gpu and p.trial is None and not p.ending), None
        )
        if worker is None:
            worker = self._spawn(gpu)
        handle = next(self._handles)
        worker.trial = handle
        worker.company.value = 0
        # If it died while idle, the next events() reaps it and reports the trial lost.
        with contextlib.suppress(BrokenPipeError, OSError):
            worker.conn.send(job)
        return handle

    def _spawn(self, gpu: int) -> _Process:
        """A process for GPU `gpu`: a prestarted one if any is alive, else a new one."""
        worker = None
        while self.spare and worker is None:
            candidate = self.spare.pop(0)
            if candidate.process.is_alive():
                worker = candidate
            else:
                candidate.process.join()
        if worker is None:
            worker = _spawn_blank(self.uses_torch)
        worker.gpu = gpu
        with contextlib.suppress(BrokenPipeError, OSError):
            worker.conn.send(self.configs[gpu])  # its first message: which GPU, which study
        self.processes.append(worker)
        return worker

    def admit(self, handle: int, go: Go) -> None:
        for worker in self.processes:
            if worker.trial == handle:
                with contextlib.suppress(BrokenPipeError, OSError):
                    worker.conn.send(go)

    def share(self, handle: int) -> None:
        for worker in self.processes:
            if worker.trial == handle:
                worker.company.value = 1

    def events(self) -> list[Event]:
        for worker in list(self.processes):
            self._read(worker)
            if not worker.process.is_alive():
                self._reap(worker)
        events, self._pending = self._pending, []
        return events

    def _read(self, worker: _Process) -> None:
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if isinstance(message, tuple) and worker.trial is not None:
                    if message[0] == "asked":
                        self._pending.append(Asked(worker.trial, int(message[1])))
                    elif message[0] == "sized":
                        members = int(message[2]) if len(message) > 2 else 1
                        self._pending.append(Sized(worker.trial, message[1], members))
                    elif message[0] == "vram_peak_mb":
                        self._pending.append(VramPeak(worker.trial, float(message[1])))
                    elif message[0] == "requeuing":
                        self._pending.append(Requeuing(worker.trial))
                    elif message[0] == "say" and message[1] not in self._said:
                        self._said.add(message[1])  # once per host, from any of its processes
                        logger.warning("%s", message[1])
                elif isinstance(message, TrialOutcome):
                    if message.recycle or message.setup_failed or message.unreachable:
                        worker.ending = True
                    if worker.trial is not None:
                        self._pending.append(Finished(worker.trial, message))
                    worker.trial = None
        except (EOFError, OSError):
            pass

    def _reap(self, worker: _Process) -> None:
        worker.process.join()
        worker.conn.close()
        self.processes.remove(worker)
        if worker.trial is not None:
            # Killed before it could report: its trial stays RUNNING until its heartbeat goes
            # stale, then the next look for stale trials fails and re-queues it.
            code = worker.process.exitcode
            outcome = TrialOutcome(
                None, "FAIL", error=f"trial process exited with code {code} before reporting"
            )
            self._pending.append(Finished(worker.trial, outcome))

    def interrupt(self, handle: int) -> None:
        for worker in self.processes:
            if worker.trial == handle and worker.process.is_alive():
                worker.ending = True
                worker.process.terminate()

    def wait(self, timeout: float) -> None:
        if self._pending:
            return
        waitables = [p.conn for p in self.processes] + [p.process.sentinel for p in self.processes]
        if waitables:
            wait_for_any(waitables, timeout=timeout)
        else:
            time.sleep(timeout)

    def keep_idle(self, gpu: int, count: int) -> None:
        idle = [p for p in self.processes if p.gpu == gpu and p.trial is None and not p.ending]
        for worker in idle[max(0, count) :]:
            self._dismiss(worker)

    def _dismiss(self, worker: _Process) -> None:
        worker.ending = True
        with contextlib.suppress(BrokenPipeError, OSError):
            worker.conn.send(None)

    def close(self) -> list[Event]:
        _dismiss_all(self.spare)
        for worker in self.processes:
            if worker.trial is not None and worker.process.is_alive():
                worker.process.terminate()
            else:
                self._dismiss(worker)
        deadline = time.monotonic() + 30
        for worker in self.processes:
            worker.process.join(max(0.1, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        return self.events()
