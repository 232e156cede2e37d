"""A warm trial process: opens the study once, then runs trial after trial for one GPU slot.

The supervisor starts `serve` in a fresh process, forked from the fork server or spawned, never
forked from itself (CUDA and fork do not mix: `run/pool/trial_start`), sends it a
`TrialJob` for each trial over a pipe and gets back ("asked", number) and then the trial's
`TrialOutcome`. The process ends, and a fresh one takes its slot, when `recycle_reason` says so:
after an out-of-memory error or any other CUDA error (only a process exit gives back everything
CUDA held, and a failed context cannot be trusted), after a trial stopped at --trial-timeout
(what the stopped code held is as suspect), when its resident memory has grown past a bound (a
model that leaks), after a set number of trials, or when it was told to stop. When its host is
gone it stops its trial, leaves it re-queued and ends (`run/trial/host`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from orchestrator.record.outages.state import quiet_in_trial_processes
from orchestrator.record.store.storage_failures import StorageUnreachable
from orchestrator.record.trials.logs import keep_stdout_clean
from orchestrator.run.messages import Recycling, TrialOutcome, WorkerConfig
from orchestrator.run.trial.context import TrialContext, pin_device
from orchestrator.run.trial.group import run_group
from orchestrator.run.trial.host import HostLink, idle_name, name_process
from orchestrator.run.trial.runner import run_trial
from orchestrator.run.trial.signals import (
    Interrupted,
    install_signal_handlers,
    interruptible,
    stop_requested,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)


def recycle_reason(
    recycling: Recycling,
    outcome: TrialOutcome,
    *,
    trials_done: int,
    resident_mb: float | None,
    baseline_mb: float | None,
    stopping: bool = False,
) -> str | None:
    """Why this process should make way for a fresh one after `outcome`, or None to stay."""
    if stopping or outcome.interrupted:
        return "stopped"
    if outcome.oom:
        return "out of memory"
    if outcome.timed_out:
        return "trial timed out"
    if outcome.cuda_error:
        return "CUDA error"
    if recycling.after_trials is not None and trials_done >= recycling.after_trials:
        return f"ran {trials_done} trial{'s' if trials_done != 1 else ''}"
    if (
        recycling.memory_growth_mb is not None
        and resident_mb is not None
        and baseline_mb is not None
        and resident_mb - baseline_mb > recycling.memory_growth_mb
    ):
        grown = resident_mb - baseline_mb
        return f"resident memory grew by {grown:.0f} MB (limit {recycling.memory_growth_mb:.0f})"
    return None


def resident_mb() -> float | None:
    """This process's resident memory now (Linux /proc), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def serve(conn: Connection, company: Any, uses_torch: bool = True) -> None:
    """Process entry point: never raises; answers every job with one TrialOutcome.

    The first message is the process's WorkerConfig: a process can start (and import torch and
    Optuna, most of its start-up) before the supervisor knows which GPU it will serve. Torch is
    left out for an adapter that uses none (`uses_torch`)."""

    install_signal_handlers()
    link = HostLink(conn)
    link.watch()  # from here on, the host's death stops this process
    keep_stdout_clean()
    _log_as_the_host_does()
    _import_what_every_trial_needs(uses_torch)
    config = _next_job(link)
    if not isinstance(config, WorkerConfig):
        return
    name_process(idle_name(config.study_name))
    pin_device(config.device)  # before CUDA starts: importing torch does not start it
    try:
        ctx = TrialContext(config)
    except StorageUnreachable as error:
        _send(link, TrialOutcome(None, "FAIL", error=str(error), unreachable=True))
        return
    except BaseException as error:  # report, never leave the supervisor guessing
        logger.error("trial process could not start: %s", traceback.format_exc())
        _send(link, TrialOutcome(None, "FAIL", error=_one_line(error), setup_failed=True))
        return
    _serve_jobs(ctx, link, company)


def _log_as_the_host_does() -> None:
    """Lines with the time and level, as the host's own; no outage lines (the host says them)."""

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    quiet_in_trial_processes()


def _import_what_every_trial_needs(uses_torch: bool) -> None:
    # Imported on purpose here, once the signal handlers are set and while the process waits for
    # its first message, so its first trial does not pay for them (the modules' tops name them
    # through LazyImport); torch only when the adapter uses it.
    import optuna  # noqa: F401
    import sqlalchemy  # noqa: F401

    if uses_torch:
        import torch  # noqa: F401


def _serve_jobs(ctx: Any, conn: HostLink, company: Any) -> None:
    trials_done, baseline = 0, None
    while True:
        job = _next_job(conn)
        if job is None:
            return
        try:
            # --fuse N: a group of up to N trials trained as one model (run/trial/group)
            fused = ctx.config.settings.fuse > 1
            outcome = (run_group if fused else run_trial)(ctx, job, conn, company)
            name_process(idle_name(ctx.config.study_name))
        except StorageUnreachable as error:  # its one line says it all: no traceback
            _send(
                conn,
                TrialOutcome(None, "FAIL", error=str(error), unreachable=True, recycle="gave up"),
            )
            return
        except BaseException as error:  # the trial's own errors are outcomes; this is the process
            logger.error("trial process failed: %s", traceback.format_exc())
            _send(conn, TrialOutcome(None, "FAIL", error=_one_line(error), recycle="crashed"))
            return
        if outcome.trial_number is not None:
            trials_done += 1 + len(outcome.fused)
        memory = resident_mb()
        if baseline is None and trials_done == 1:
            baseline = memory  # after one trial: imports, the adapter and its caches are in
        reason = recycle_reason(
            ctx.config.settings.recycling,
            outcome,
            trials_done=trials_done,
            resident_mb=memory,
            baseline_mb=baseline,
            stopping=stop_requested(),
        )
        _send(conn, replace(outcome, recycle=reason))
        if reason is not None:
            return


def _next_job(conn: HostLink) -> Any:
    """The next job, or None when told to stop (None sent, pipe closed, or SIGTERM while idle)."""
    try:
        with interruptible():
            return conn.recv()
    except (Interrupted, EOFError, OSError):
        return None


def _send(conn: HostLink, outcome: TrialOutcome) -> None:
    # If the supervisor is gone, the trial has said so and was re-queued; nobody hears this.
    with contextlib.suppress(Interrupted):
        conn.send(outcome)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
