"""What `run`, `worker` and `plan` are told about this host, as flags and as one typed value.

The flags are defined here once, with their defaults taken from `HostOptions`; the commands turn
the parsed Namespace into a `HostOptions` (`from_args`) and everything below them takes that.
The Python API builds one directly: `HostOptions(gpus="sim:24576", concurrency=2)`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.base import BATCH_SIZE_MIN, memory_model_of
from orchestrator.errors import UserError
from orchestrator.flags.common import number, user_checked, whole_number
from orchestrator.gpu import check_gpu_spec, check_gpus_exist
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import (
    WORKLOADS_ENV,
    add_workloads_argument,
    load_workload_classes,
)
from orchestrator.record.outages.riding import DEFAULT_RETRY_SECONDS, set_retry_seconds
from orchestrator.run.messages import Recycling, TrialSettings
from orchestrator.run.pool.placement import FUSE_AUTO
from orchestrator.run.pool.stopping import Stop

if TYPE_CHECKING:
    from orchestrator.record.store import storage
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.trials import logs as trial_logs
else:
    # Ours, loaded when first used: this module loads with every command's --help.
    storage = LazyImport("orchestrator.record.store.storage")
    trial_logs = LazyImport("orchestrator.record.trials.logs")


@dataclass(frozen=True)
class HostOptions:
    """This host's part of a run: which GPUs, how many trials at once, for how long, and how
    trial processes live. The defaults are the flags' defaults."""

    gpus: str = "auto"
    sim_memory_scale: float = 1.0
    concurrency: int | None = None
    # --fuse N: trials of one shape trained as one fused model in one process (docs/fused.md);
    # "auto": as many as each GPU's plan packs; None keeps the study's (1, a process per trial,
    # for a new one). `run` stores it.
    fuse: int | str | None = None
    timeout: float | None = None
    trial_timeout: float | None = None  # seconds one trial may train; None: no limit
    grace: float = Stop.grace_s  # the pool's, and `--grace`'s
    recycle_after: int | None = None
    recycle_memory_mb: float = Recycling.memory_growth_mb  # type: ignore[assignment]  (2048, not None)
    fresh_process: bool = False
    log_dir: str | None = None
    storage_retry_seconds: float = DEFAULT_RETRY_SECONDS
    workloads: str | None = None
    json: bool = False
    quiet: bool = False
    verbose: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HostOptions:
        """The options a command's parsed flags hold (a flag the command lacks keeps its default)."""
        given = vars(args)
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    def trial_settings(self, location: StorageLocation) -> TrialSettings:
        """What every trial process of this host is told of these options (`location`: the
        study's storage, beside which trials' logs go unless --log-dir says where)."""
        after = 1 if self.fresh_process else self.recycle_after
        recycling = Recycling(
            after_trials=after,
            memory_growth_mb=self.recycle_memory_mb,
            trial_timeout=self.trial_timeout,
        )
        return TrialSettings(
            sim_memory_scale=self.sim_memory_scale,
            recycling=recycling,
            log_dir=self.log_dir_for(location),
        )

    def log_dir_for(self, location: StorageLocation) -> str:
        """Where trials' logs go: --log-dir, else beside the study's SQLite file or here."""
        return str(self.log_dir) if self.log_dir else str(trial_logs.default_log_dir(location))

    @property
    def shows_progress(self) -> bool:
        """A live panel or log lines, unless the result is JSON and nothing else was asked for."""
        return self.verbose or not self.json


_DEFAULTS = HostOptions()


# --- the flags ---------------------------------------------------------------------------------


def add_gpus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus",
        default=_DEFAULTS.gpus,
        metavar="SPEC",
        type=user_checked(check_gpu_spec),
        help="auto (default), none, indices such as 0,2, part of one such as 0:24576 (MB), "
        "or simulated devices sim:MB[,sim:MB...]",
    )


def add_concurrency_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=whole_number("--concurrency", high=10_000),
        metavar="N",
        help="at most N trials at once per GPU (lowers the plan, never raises it past VRAM)",
    )


def add_fuse_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fuse",
        type=fuse_setting,
        metavar="N",
        help="train up to N trials of one shape in one process, as one fused model (default 1: "
        "a process per trial; auto: as many as each GPU's plan packs by their bytes, 8 without "
        "a GPU; stored with the study; an adapter without train_fused runs unfused; "
        "docs/fused.md)",
    )


def fuse_setting(text: str) -> int | str:
    """--fuse's value: `auto`, or a whole number from 1 to MAX_FUSE."""
    if text.strip().lower() == FUSE_AUTO:
        return FUSE_AUTO
    try:
        return whole_number("--fuse", high=MAX_FUSE, example=8)(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error} (or --fuse auto)") from None


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `run` and `worker` about this host."""

    add_gpus_argument(parser)
    add_concurrency_argument(parser)
    add_fuse_argument(parser)
    _add_time_arguments(parser)
    _add_process_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_workloads_argument(parser)


def _add_time_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=number("--timeout", above_low=True, example="3600"),
        metavar="SECONDS",
        help="start no trial after this long; running ones finish",
    )
    parser.add_argument(
        "--trial-timeout",
        type=number("--trial-timeout", above_low=True, example="600"),
        metavar="SECONDS",
        help="a trial training longer is stopped and fails with reason timeout (re-run only "
        "within --max-retries; default: no limit)",
    )
    parser.add_argument(
        "--grace",
        type=number("--grace", example="30"),
        default=_DEFAULTS.grace,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, running trials get this long to finish before they are "
        f"stopped and re-queued (default {_DEFAULTS.grace:g})",
    )
    parser.add_argument(
        "--storage-retry-seconds",
        type=number("--storage-retry-seconds", example="300"),
        default=_DEFAULTS.storage_retry_seconds,
        metavar="SECONDS",
        help="ride out a database outage this long, retrying, before stopping "
        f"(default {_DEFAULTS.storage_retry_seconds:g}; 0 stops at once)",
    )


def _add_process_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sim-memory-scale",
        type=number("--sim-memory-scale", above_low=True, example="1.5"),
        default=_DEFAULTS.sim_memory_scale,
        metavar="F",
        help="a simulated trial holds F times its memory model's MB (default 1.0)",
    )
    parser.add_argument(
        "--recycle-after",
        type=whole_number("--recycle-after", example=20),
        metavar="N",
        help="a trial process makes way for a fresh one after N trials (default: never; it always "
        "does after an out-of-memory or CUDA error)",
    )
    parser.add_argument(
        "--recycle-memory-mb",
        type=number("--recycle-memory-mb", above_low=True, example="2048"),
        default=_DEFAULTS.recycle_memory_mb,
        metavar="MB",
        help="a trial process whose resident memory grew by more than MB since its first trial "
        f"makes way for a fresh one (default {_DEFAULTS.recycle_memory_mb:g})",
    )
    parser.add_argument(
        "--fresh-process",
        action="store_true",
        help="run every trial in a fresh process, for models that leak (slower: each trial pays "
        "for the imports, the storage connection and the CUDA context)",
    )
    parser.add_argument(
        "--log-dir",
        metavar="DIR",
        help="each trial's stdout and stderr go to DIR/STUDY/trial-N.log (default: beside an SQLite "
        "file, e.g. study-logs/ for study.db; else orchestrator-logs/ in the current directory)",
    )


# --- what argparse cannot check alone ----------------------------------------------------------


def check_host_options(options: HostOptions) -> None:
    """Refuse what cannot run, before anything is stored, and apply what the process needs.

    The flags' values were checked as they were parsed (finite, in range, well-formed); these
    lines keep the same promise for HostOptions built in Python. The GPUs named must exist."""

    problems = host_option_problems(options)
    if problems:
        raise UserError(problems[0])  # one line: the first thing to fix
    if options.log_dir:
        check_log_dir(options.log_dir)
    set_retry_seconds(options.storage_retry_seconds)
    check_gpus_exist(options.gpus)
    storage.heartbeat_settings()  # a bad value in the environment is refused before anything starts
    if options.workloads:
        # Checked now (a bad file stops before anything is stored), then named in the
        # environment, where every later read of the workload classes looks, trial processes too.
        load_workload_classes(options.workloads)
        os.environ[WORKLOADS_ENV] = os.path.abspath(options.workloads)


def host_option_problems(o: HostOptions) -> list[str]:
    """What is wrong with these options, one line each (none: they can run)."""

    def positive(value: float) -> bool:
        return math.isfinite(value) and value > 0

    checks: list[tuple[bool, str]] = [
        (
            o.concurrency is not None and o.concurrency < 1,
            f"--concurrency {o.concurrency} must be at least 1",
        ),
        (
            not fuse_ok(o.fuse),
            f"--fuse {o.fuse} must be auto or a whole number from 1 to {MAX_FUSE}",
        ),
        (
            not positive(o.sim_memory_scale),
            f"--sim-memory-scale {o.sim_memory_scale} must be more than 0",
        ),
        (
            not (math.isfinite(o.grace) and o.grace >= 0),
            f"--grace {o.grace} must be 0 or more seconds",
        ),
        (
            math.isfinite(o.grace) and o.grace > MAX_GRACE_S,
            f"--grace {o.grace:g} is more than a day: give at most --grace {MAX_GRACE_S:.0f}",
        ),
        *((True, message) for message in _sim_size_problems(o.gpus)),
        (
            o.timeout is not None and not positive(o.timeout),
            f"--timeout {o.timeout} must be more than 0 seconds",
        ),
        (
            o.trial_timeout is not None and not positive(o.trial_timeout),
            f"--trial-timeout {o.trial_timeout} must be more than 0 seconds",
        ),
        (
            o.recycle_after is not None and o.recycle_after < 1,
            f"--recycle-after {o.recycle_after} must be at least 1",
        ),
        (
            not o.recycle_memory_mb > 0,
            f"--recycle-memory-mb {o.recycle_memory_mb} must be more than 0",
        ),
        (
            not (math.isfinite(o.storage_retry_seconds) and o.storage_retry_seconds >= 0),
            f"--storage-retry-seconds {o.storage_retry_seconds} must be 0 or more seconds",
        ),
    ]
    return [message for wrong, message in checks if wrong]


# Members of one fused group: past this a group is one process's whole study, and its stacked
# tensors grow past what fusing is for (docs/fused.md measures up to 16).
MAX_FUSE = 256


def fuse_ok(fuse: object) -> bool:
    """Whether `fuse` is a --fuse value: None (the study's), auto, or 1 to MAX_FUSE."""
    if fuse is None or fuse == FUSE_AUTO:
        return True
    return isinstance(fuse, int) and not isinstance(fuse, bool) and 1 <= fuse <= MAX_FUSE


# A grace period is how long a stop waits for running trials: past a day it is a typing error
# (and a number such as 1e15 would overflow the clocks it is added to).
MAX_GRACE_S = 86_400.0
# More than any GPU holds (the largest have a few hundred GB): a bigger simulated one is a typo.
MAX_SIM_MB = 1_048_576.0


def _sim_size_problems(gpus: str) -> list[str]:
    problems = []
    for part in (p.strip() for p in gpus.split(",")):
        if not part.startswith("sim:"):
            continue
        try:
            size = float(part[4:])
        except ValueError:
            continue  # its form is check_gpu_spec's to refuse
        if math.isfinite(size) and size > MAX_SIM_MB:
            problems.append(
                f"--gpus {part}: a simulated GPU of more than {MAX_SIM_MB:,.0f} MB (1 TiB) is "
                "larger than any GPU; give its size in MB, e.g. sim:24576"
            )
    return problems


def check_model_fits_a_gpu(adapter: object, options: dict) -> None:
    """A memory model that needs more than any GPU holds at the smallest batch size (a typo such
    as per_sample_mb=1e308) is refused here: on a host without a GPU nothing would say so."""

    model = memory_model_of(adapter, options)
    smallest = int(options.get("batch_size_min") or BATCH_SIZE_MIN)
    need = model.planned_mb(smallest)
    if not need <= MAX_SIM_MB:  # NaN too
        raise UserError(
            f"adapter {getattr(adapter, 'name', '?')!r}: one trial at batch size {smallest} needs "
            f"{need:,.0f} MB by its memory model ({model.model_overhead_mb:g} MB + "
            f"{model.per_sample_mb:g} MB per sample), more than any GPU holds: check its "
            "overhead_mb and per_sample_mb"
        )


def check_log_dir(log_dir: str) -> None:
    """--log-dir must be a folder this user can write in (made if missing): else every trial
    process would fail to open its log and be re-run as lost. What this check makes it removes,
    so that a run refused later leaves nothing behind; the pool makes the folder again."""

    folder = Path(log_dir)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--log-dir {log_dir} is a file: give a folder for the trials' logs")
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UserError(
            f"--log-dir {log_dir} cannot hold the trials' logs ({error.strerror or error}): "
            "give a folder this user can write in"
        ) from None
    finally:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()


def check_storage_for_workers(location: StorageLocation) -> None:
    """Trial processes open the storage themselves: an in-memory database cannot be shared."""
    if location.is_sqlite and location.sqlite_path is None:
        raise UserError(
            "an in-memory SQLite storage cannot be shared with trial processes: "
            "use a file, e.g. --storage sqlite:///study.db"
        )
