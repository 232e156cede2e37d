"""When a worker stops starting trials, and when it stops the ones running: values, not flags.

Three things end a worker's run: a signal (Ctrl-C, SIGTERM: running trials get a grace period,
then are stopped and re-queued; a second signal stops them at once), `--timeout` (no new trials;
running ones finish in their own time) and the study's budget (every trial counted, none
running anywhere). `Stop` holds what has happened; `next_step` says what the loop does now.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Step(enum.Enum):
    START = "start"  # fill free slots with new trials
    DRAIN = "drain"  # start nothing new; wait for running trials to end
    STOP_RUNNING = "stop running"  # the grace period is over: stop running trials now
    DONE = "done"  # nothing runs and nothing more will: leave the loop


@dataclass(frozen=True)
class Stop:
    started_at: float
    timeout_s: float | None = None
    grace_s: float = 30.0
    signalled_at: float | None = None  # when the first stop signal came
    timed_out: bool = False

    def signalled(self, now: float) -> Stop:
        """A stop signal: the first starts the grace period, a second ends it."""
        if self.signalled_at is None:
            return replace(self, signalled_at=now)
        return replace(self, grace_s=0.0)

    def timeout_passed(self, now: float) -> bool:
        return self.timeout_s is not None and now - self.started_at >= self.timeout_s

    @property
    def interrupted(self) -> bool:
        return self.signalled_at is not None

    @property
    def draining(self) -> bool:
        """No new trials from here on (a signal or the timeout)."""
        return self.interrupted or self.timed_out


def next_step(stop: Stop, *, now: float, running: int, budget_finished: bool) -> tuple[Stop, Step]:
    """What the loop does now, given how many trials of this worker run and whether the study's
    budget is used up everywhere (counted in full, nothing running on any node)."""
    if stop.signalled_at is not None:
        if running == 0:
            return stop, Step.DONE
        if now - stop.signalled_at >= stop.grace_s:
            return stop, Step.STOP_RUNNING
        return stop, Step.DRAIN
    if not stop.timed_out and stop.timeout_passed(now):
        stop = replace(stop, timed_out=True)
    if stop.timed_out:
        return stop, Step.DONE if running == 0 else Step.DRAIN
    # While trials of ours run, or trials elsewhere hold the rest of the budget, keep going: one of
    # theirs may die and be re-queued (this worker finds it stale and picks it up).
    if running == 0 and budget_finished:
        return stop, Step.DONE
    return stop, Step.START
