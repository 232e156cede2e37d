"""What the end of a trial process's turn means to the pool: a value naming which end, and its log.

A trial process reports every end as a `TrialOutcome`; `ending_of` reads one, purely, into an
`Ending`: nothing was run, the database was away, the trial was stopped, it lost its process,
the process failed before it had a trial, or the trial finished and has something to teach.
`log_ending` says it in the log, a failed trial with the end of its own output.

Trial processes that end before they get a trial say something is wrong with the set-up (a
storage the children cannot open, an adapter that cannot load): `FailedStarts` counts them in a
row, and after `MAX_FAILED_STARTS` the worker stops with their error instead of starting more
for ever.
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.record.trials.logs import last_lines

if TYPE_CHECKING:
    from orchestrator.run.messages import TrialOutcome

logger = logging.getLogger(__name__)

MAX_FAILED_STARTS = 5


class TrialsCannotStart(Exception):
    """Several trial processes in a row failed before asking for a trial."""


class End(enum.Enum):
    NOTHING_RUN = "nothing run"  # no trial was asked (budget used, dismissed): not a trial run
    UNREACHABLE = "unreachable"  # the database, not the set-up: this pool meets it too
    NEVER_STARTED = "never started"  # the process ended before it asked for a trial
    STOPPED = "stopped"  # stopped by the pool and re-queued
    LOST = "lost"  # its process died mid-trial: the heartbeat tells the study
    FINISHED = "finished"  # told to the study: complete, pruned or failed


@dataclass(frozen=True)
class Ending:
    end: End
    number: int | None  # the trial's number: the process's word, else the one it asked for

    @property
    def asked(self) -> bool:
        """The process got as far as a trial: the set-up works."""
        return self.number is not None


def ending_of(outcome: TrialOutcome, asked_number: int | None) -> Ending:
    """Which end a process's outcome is; `asked_number` is the trial it said it asked for."""
    if outcome.state == "NONE":
        return Ending(End.NOTHING_RUN, None)
    number = outcome.trial_number if outcome.trial_number is not None else asked_number
    if outcome.unreachable:
        end = End.UNREACHABLE
    elif outcome.interrupted:
        end = End.STOPPED
    elif outcome.trial_number is None:
        end = End.LOST if number is not None else End.NEVER_STARTED
    else:
        end = End.FINISHED
    return Ending(end, number)


@dataclass(frozen=True)
class FailedStarts:
    in_a_row: int = 0  # trial processes that ended before they had a trial, since one had one

    def after(self, ending: Ending, *, draining: bool) -> FailedStarts:
        """The count after this ending: a process that got a trial ends the run of failures, as
        does any ending while the pool drains (it stops processes itself)."""
        return FailedStarts() if ending.asked or draining else FailedStarts(self.in_a_row + 1)


def check_starts(failed: FailedStarts, outcome: TrialOutcome) -> None:
    """Warn of a failed start; after `MAX_FAILED_STARTS` in a row, stop the worker."""
    if failed.in_a_row == 0:
        return
    logger.warning("a trial process failed before it had a trial: %s", outcome.error)
    if failed.in_a_row >= MAX_FAILED_STARTS:
        raise TrialsCannotStart(
            f"{failed.in_a_row} trial processes in a row failed before starting a trial; "
            f"the last said: {outcome.error}"
        )


def log_ending(label: str, ending: Ending, outcome: TrialOutcome) -> None:
    if ending.end is End.UNREACHABLE:
        # Every trial process meets the same outage: the host's own final line says it once.
        logger.debug("%s: a trial process gave up: %s", label, outcome.error)
        return
    if outcome.recycle and outcome.recycle != "stopped":
        logger.info("%s: a fresh trial process takes over (%s)", label, outcome.recycle)
    if ending.end is End.STOPPED:
        logger.info("%s: trial %s stopped and re-queued", label, ending.number)
    elif outcome.late:  # one line, after the re-run was queued: nothing more will happen to it
        logger.warning("%s: trial %s: %s", label, ending.number, outcome.error)
    elif ending.end is End.LOST:
        logger.warning(
            "%s: trial %s lost its process (%s); it is re-run once its heartbeat is stale",
            label,
            ending.number,
            outcome.error,
        )
    elif ending.end is End.FINISHED:
        _log_finished(label, outcome)


def log_group_split(label: str, members: int, cap: int | None) -> None:
    logger.warning(
        "%s: a fused group of %d ran out of memory: its members are re-queued, and groups here "
        "take at most %s from now on",
        label,
        members,
        cap,
    )


def _log_finished(label: str, outcome: TrialOutcome) -> None:
    if outcome.oom:
        logger.warning(
            "%s: trial %s ran out of memory (batch %s%s)%s",
            label,
            outcome.trial_number,
            outcome.batch_size,
            ", alone on the GPU: its batch size is now the limit" if outcome.alone else "",
            "; re-queued" if outcome.requeued else "",
        )
    elif outcome.error and outcome.state == "FAIL":
        logger.warning(
            "%s: trial %s failed: %s%s%s",
            label,
            outcome.trial_number,
            outcome.error,
            "; re-queued" if outcome.requeued else "",
            _tail(outcome.log_file),
        )
    elif outcome.state == "COMPLETE" and not _finite(outcome.value):
        logger.warning(
            "%s: trial %s returned %s: stored as COMPLETE, as Optuna does, but never "
            "named the best trial",
            label,
            outcome.trial_number,
            outcome.value,
        )


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def _tail(log_file: str | None) -> str:
    """A failed trial's last lines, indented under the log line that says it failed."""

    if log_file is None:
        return ""
    lines = last_lines(log_file)
    if not lines:
        return f" (log: {log_file})"
    return f"; the end of {log_file}:\n" + "\n".join(f"    {line}" for line in lines)
