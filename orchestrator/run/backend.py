"""The small interface the pool drives to run trials, and the events it hears back.

The pool (`orchestrator.run.pool.loop`) decides; a backend runs. `TrialBackend` is all the pool needs:
start a trial on a GPU, hear what happened (`events`: asked, sized, its VRAM peak so far, a fused
group re-queuing its members, finished), admit a sized trial, stop a trial, wait for something to
happen, keep at most so many idle processes. `orchestrator.run.pool.processes.WarmProcesses` runs trials in warm processes;
`orchestrator.run.simulated` runs the same loop on a virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orchestrator.run.messages import Go, TrialJob, TrialOutcome


@dataclass(frozen=True)
class Asked:
    """A started trial has its number (it holds a trial of the study from now on)."""

    handle: int
    number: int


@dataclass(frozen=True)
class Sized:
    """A trial drew its parameters: its batch size (None for a model without one) is known, so
    its footprint is, and it waits to be admitted."""

    handle: int
    batch_size: int | None
    members: int = 1  # a fused group's trials (docs/fused.md), admitted as one by their bytes


@dataclass(frozen=True)
class VramPeak:
    """A training trial's VRAM peak so far, as it measured it."""

    handle: int
    vram_peak_mb: float


@dataclass(frozen=True)
class Requeuing:
    """A fused group's process is about to re-queue its members (out of memory, stopped, timed
    out), one at a time: the room they free stays the group's until it finishes, or the first
    one queued would start alone while the others are still being queued."""

    handle: int


@dataclass(frozen=True)
class Finished:
    """A started trial ended; `outcome` says how (a lost process gives a FAIL with no report)."""

    handle: int
    outcome: TrialOutcome


Event = Asked | Sized | VramPeak | Requeuing | Finished


class TrialBackend(Protocol):
    def start(self, gpu: int, job: TrialJob) -> int:
        """Run `job` on GPU `gpu` (the pool's index); returns the trial's handle."""

    def admit(self, handle: int, go: Go) -> None:
        """Let a sized trial train."""

    def share(self, handle: int) -> None:
        """Another trial joined this one's GPU while it runs."""

    def events(self) -> list[Event]:
        """What happened since the last call, without waiting."""

    def interrupt(self, handle: int) -> None:
        """Stop the trial: it fails and is re-queued (or, not asked yet, asks for nothing)."""

    def wait(self, timeout: float) -> None:
        """Return when something may have happened, or after `timeout` seconds."""

    def keep_idle(self, gpu: int, count: int) -> None:
        """Let at most `count` idle processes of GPU `gpu` wait for work; end the rest."""

    def close(self) -> list[Event]:
        """End every process (running trials are stopped first); what they said at the end."""
