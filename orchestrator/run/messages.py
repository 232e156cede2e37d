"""What the supervisor and a trial process say to each other over the pipe between them.

A trial process's first message is its `WorkerConfig`: which GPU and study it serves, and the
host's `TrialSettings`, made once from the host's options and the same for every trial process.
Then, for each trial, the supervisor sends a `TrialJob` (then, once the trial has said its size, a
`Go`); the trial process sends ("asked", number), ("sized", batch size) (a fused group: ("sized",
its largest batch size, its members)), ("vram_peak_mb", MB) each epoch, ("say", line) for the
host's log (said once per host), ("requeuing",) before a fused group re-queues its members, and
last its `TrialOutcome`. All of them are plain picklable values, and this module imports nothing
of either side, so the pool builds them without loading the trial's modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchestrator.gpu.base import Device
    from orchestrator.record.store.location import StorageLocation


@dataclass(frozen=True)
class Recycling:
    """When a warm trial process makes way for a fresh one (besides an OOM, a CUDA error, a
    trial stopped at its timeout or a crash, which always do)."""

    after_trials: int | None = None  # 1: a fresh process for every trial
    memory_growth_mb: float | None = 2048.0  # resident memory grown past this since trial one
    # --trial-timeout: a trial training longer is stopped, fails, and its process makes way
    # (what the stopped code held cannot be trusted). None: no limit.
    trial_timeout: float | None = None


@dataclass(frozen=True)
class TrialSettings:
    """What this host's options say to every trial process, made once (`HostOptions.trial_settings`)
    and passed down unchanged to each process's `WorkerConfig`."""

    sim_memory_scale: float = 1.0  # a simulated trial holds this times its memory model's MB
    recycling: Recycling = Recycling()
    log_dir: str | None = None  # each trial's stdout and stderr go to a file under it
    # --fuse: the most trials one process claims and trains as one fused model (docs/fused.md);
    # 1 runs one trial at a time. Already 1 where the adapter or the study cannot fuse.
    fuse: int = 1


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a trial process needs to start, picklable."""

    storage: StorageLocation  # where the study is: what the process opens
    study_name: str
    device: Device | None  # None: run on the CPU
    host: str
    threads: int  # torch threads for this process
    settings: TrialSettings = TrialSettings()  # the host's, the same for every trial process


@dataclass(frozen=True)
class TrialJob:
    """What the supervisor says about the next trial, picklable."""

    batch_bounds: tuple[int, int]  # the batch sizes that fit this GPU alone, now
    # --fuse: the most trials this process claims for one fused group (docs/fused.md). The pool
    # spreads what is left of the budget over the processes it can start, so a short study's
    # groups fill every slot instead of one.
    members: int = 1


@dataclass(frozen=True)
class Go:
    """The supervisor's admission of a trial whose size it heard: train now."""

    planned_mb: float  # its estimate, which admitted it
    concurrency: int  # trials on the GPU with it, itself included


@dataclass(frozen=True)
class TrialOutcome:
    """How a trial process's trial ended, as the supervisor hears it: a trial's result
    (`orchestrator.run.trial.result.RunResult`, made into this by its `trial_outcome`), a trial
    another host finished first (`run/trial/runner`), or what the process says of itself (it
    could not start, it gave up, it crashed)."""

    trial_number: int | None  # None: no trial was asked (budget used, stopped, or no start)
    state: str  # COMPLETE, PRUNED, FAIL, or NONE
    oom: bool = False
    alone: bool = False
    batch_size: int | None = None
    value: float | None = None
    vram_peak_mb: float | None = None
    error: str | None = None
    requeued: bool = False
    interrupted: bool = False  # stopped by the supervisor: says nothing about memory
    log_file: str | None = None  # where its stdout and stderr went
    cuda_error: bool = False  # a CUDA error other than out-of-memory: the context may be broken
    recycle: str | None = None  # why the process ends after this trial, if it does
    setup_failed: bool = False  # the process could not open the study or the adapter
    unreachable: bool = False  # it gave up on a database away for longer than the bound
    timed_out: bool = False  # stopped at --trial-timeout: the process makes way for a fresh one
    late: bool = False  # its process woke after the trial was failed as lost and re-run
    # A fused group (docs/fused.md): this is its first member's outcome, with the group's
    # out-of-memory, CUDA error, stop and timeout; `fused` holds the other members' outcomes.
    fused: tuple[TrialOutcome, ...] = ()


class Channel(Protocol):
    """The trial process's end of its pipe to the supervisor."""

    def send(self, message: Any) -> None: ...

    def recv(self) -> Any: ...
