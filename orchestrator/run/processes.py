"""Where trials run: the warm trial processes, the real backend the pool drives.

`WarmProcesses` runs each trial in a long-lived process of that GPU (`orchestrator.run.trial_worker`),
starting a fresh one when none is idle; the pool sees it through `orchestrator.run.trial_backend`.

How a trial process starts (`trial_process_context`): forked from multiprocessing's fork server,
which imports torch, Optuna and the trial code once (`PRELOAD`), so that 19 processes cost one
import of torch, not 19. The server never touches CUDA: it only imports, and importing torch does
not initialise CUDA; each process picks its GPU and starts CUDA after the fork, as a spawned one
does. Where there is no fork server (not POSIX), or `ORCHESTRATOR_TRIAL_START=spawn` says so, each
process is spawned and imports everything itself. A forked process takes the environment and the
working directory its supervisor has when it starts the process, not those of the server's start.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.run.trial_backend import Asked, Event, Finished, Sized, VramPeak
from orchestrator.run.trial_messages import Go, TrialJob, TrialOutcome

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from orchestrator.planning.planner import GpuPlan
    from orchestrator.run.trial_context import Recycling, WorkerConfig

logger = logging.getLogger(__name__)


@dataclass
class _Process:
    gpu: int
    process: BaseProcess
    conn: Connection
    company: Any  # multiprocessing Value: did another trial share the GPU during this one?
    trial: int | None = None  # the handle of the trial it runs; None while idle
    ending: bool = False  # told to go, or said it will


START_ENV = "ORCHESTRATOR_TRIAL_START"  # "spawn": no fork server (default: it where there is one)
# What the fork server imports once for every trial process. Nothing here initialises CUDA
# (tests/test_trial_start.py checks it in a process forked from the server); a module missing
# from this install is skipped by the server.
PRELOAD = (
    "numpy",
    "torch",
    "sqlalchemy",
    "psycopg2",
    "optuna",
    # Before `adapters` and `samplers`: importing the package loads ours, never a same-named
    # folder in the working directory (orchestrator/own_packages.py).
    "orchestrator",
    "adapters",
    "samplers",
    "orchestrator.record.storage",
    "orchestrator.record.study",
    "orchestrator.gpu.sim",
    "orchestrator.run.trial_context",
    "orchestrator.run.trial_worker",
    "orchestrator.run.processes",  # the entry point, `started_here`
    "orchestrator.run.fork_server_signals",  # the server outlives a SIGTERM sent to the job
)


def start_method(environ: Mapping[str, str] = os.environ, available: tuple[str, ...] = ()) -> str:
    """How trial processes start: "forkserver" where there is one, unless the environment
    asks for "spawn"."""
    from orchestrator.errors import UserError

    chosen = environ.get(START_ENV, "").strip().lower()
    if chosen not in ("", "spawn", "forkserver"):
        raise UserError(f"{START_ENV}={chosen!r} must be spawn or forkserver (or unset)")
    methods = available or tuple(mp.get_all_start_methods())
    if chosen == "spawn" or "forkserver" not in methods:
        return "spawn"
    return "forkserver"


def trial_process_context() -> Any:
    """The multiprocessing context trial processes start from (see the module's doc)."""
    method = start_method()
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(PRELOAD))  # used when the server first starts
    return context


def started_here(environ: dict[str, str], cwd: str, target: Any, *args: Any) -> None:
    """A trial process's entry point: the environment and working directory its supervisor had
    when it started the process (a forked one has the server's), then `target(*args)`."""
    os.environ.clear()
    os.environ.update(environ)
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    target(*args)


def start_process(context: Any, target: Any, *args: Any) -> BaseProcess:
    """Start `target(*args)` in a trial process of `context`, with this process's environment."""
    process = context.Process(
        target=started_here, args=(dict(os.environ), os.getcwd(), target, *args), daemon=False
    )
    process.start()
    return process


def _spawn_blank() -> _Process:
    """A trial process that imports what trials need, then waits to be told its GPU."""
    from orchestrator.run.trial_worker import serve

    context = trial_process_context()
    ours, theirs = context.Pipe(duplex=True)
    company = context.Value("b", 0)
    process = start_process(context, serve, theirs, company)
    theirs.close()
    return _Process(-1, process, ours, company)


def prestart(count: int = 1) -> list[_Process]:
    """Start the imports trial processes need now, before the study and its GPUs are known, so
    that they overlap the supervisor's own start (storage, migrations, plan) instead of
    following it. With the fork server that is the server itself, started without waiting for
    it (a fork waits until the server has imported everything; by the first trial it has), and
    no process is started yet: the list is empty. With spawn, `count` processes are started.

    `WarmProcesses(spare=...)` takes them from the list; any still in it when this process exits
    (an error came first) are told to go before multiprocessing waits for its children."""
    from multiprocessing import forkserver, util

    context = trial_process_context()
    if context.get_start_method() == "forkserver":
        forkserver.ensure_running()
        if not _stop_at_exit:
            _stop_at_exit.append(util.Finalize(None, _stop_fork_server, exitpriority=1))
        return []
    spare = [_spawn_blank() for _ in range(count)]
    util.Finalize(None, _dismiss_all, args=(spare,), exitpriority=10)
    return spare


_stop_at_exit: list[Any] = []


def _stop_fork_server() -> None:
    """At this process's exit (after `_dismiss_all` and every pool's close), end its fork server
    at once. Left alone it exits only once it has imported all of `PRELOAD`: a command that
    failed before its first trial (a storage that refused it) would leave it importing torch for
    seconds of CPU. It ignores SIGTERM (fork_server_signals), so it is killed; trial processes
    forked from it are its children, not ours, and were told to go before this runs.
    multiprocessing keeps the server's pid in a private attribute and offers no public way to
    stop it."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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
    processes: list[_Process] = field(default_factory=list)
    _handles: itertools.count = field(default_factory=lambda: itertools.count(1))
    _pending: list[Event] = field(default_factory=list)

    @classmethod
    def for_plans(
        cls,
        plans: list[GpuPlan],
        *,
        storage_url: str,
        study_name: str,
        host: str,
        cpu_cores: int,
        cpu_bound: bool = False,
        sim_memory_scale: float = 1.0,
        recycling: Recycling | None = None,
        log_dir: str | None = None,
        spare: list[_Process] | None = None,
    ) -> WarmProcesses:
        """Processes for the GPUs of `plans`, in their order, each trial's torch threads a share
        of the host's cores (`spare`: from `prestart`, taken first)."""
        from orchestrator.planning.cpu_cores import threads_per_trial
        from orchestrator.run.trial_context import Recycling, WorkerConfig

        threads = threads_per_trial(cpu_cores, sum(p.slots for p in plans), cpu_bound=cpu_bound)
        configs = {
            index: WorkerConfig(
                storage_url=storage_url,
                study_name=study_name,
                device=plan.device,
                host=host,
                threads=threads,
                sim_memory_scale=sim_memory_scale,
                recycling=recycling or Recycling(),
                log_dir=log_dir,
            )
            for index, plan in enumerate(plans)
        }
        return cls(configs, spare=spare if spare is not None else [])

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
            worker = _spawn_blank()
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
                        self._pending.append(Sized(worker.trial, message[1]))
                    elif message[0] == "vram_peak_mb":
                        self._pending.append(VramPeak(worker.trial, float(message[1])))
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
        from multiprocessing.connection import wait

        if self._pending:
            return
        waitables = [p.conn for p in self.processes] + [p.process.sentinel for p in self.processes]
        if waitables:
            wait(waitables, timeout=timeout)
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
