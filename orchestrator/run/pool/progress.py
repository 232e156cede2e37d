"""Live progress of a running pool: a live panel on a terminal, plain log lines anywhere else.

The worker loop calls `update(snapshot)` about once a second and whenever a trial finishes, and
`close(final)` once at the end. What a line or a panel says is decided by pure functions of a
PoolSnapshot (`summary_line`, `gpu_line`, `render`), so both modes are tested without a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import rich.console as rich_console
    import rich.file_proxy as rich_file_proxy
    import rich.live as rich_live
    import rich.markup as rich_markup
    import rich.progress_bar as rich_progress_bar
    import rich.table as rich_table
    from rich.console import Console, RenderableType

    from orchestrator.run.pool.snapshot import GpuSnapshot, PoolSnapshot
else:
    rich_console = LazyImport("rich.console")
    rich_markup = LazyImport("rich.markup")
    rich_progress_bar = LazyImport("rich.progress_bar")
    rich_table = LazyImport("rich.table")
    rich_live = LazyImport("rich.live")
    rich_file_proxy = LazyImport("rich.file_proxy")

# Off a terminal (CI, nohup, Kubernetes logs) one line at most this often, plus one per finished trial.
LOG_INTERVAL_S = 10.0


class Progress(Protocol):
    def update(self, snapshot: PoolSnapshot) -> None: ...

    def close(self, final: PoolSnapshot | None) -> None: ...


def make_progress(
    *,
    quiet: bool,
    verbose: bool,
    stream: TextIO | None = None,
    force_terminal: bool | None = None,
) -> Progress:
    """The display that suits `stream`: nothing with --quiet, a live panel on a terminal, else log lines."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return QuietProgress()
    terminal = _is_terminal(stream) if force_terminal is None else force_terminal
    if terminal:
        return LiveProgress(stream=stream, verbose=verbose, force_terminal=force_terminal)
    return LogProgress(stream=stream, verbose=verbose)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


# --- words and numbers (pure) --------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """3725 -> '1h02m', 133 -> '2m13s', 9.4 -> '9s'; None -> '?'."""
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def format_mb(used: float | None, total: float | None) -> str:
    """VRAM in GB, '9.1/24.0 GB', or '-' without a GPU."""
    if used is None or total is None:
        return "-"
    return f"{used / 1024:.1f}/{total / 1024:.1f} GB"


def best_text(snapshot: PoolSnapshot) -> str:
    """'best loss 0.031 (#12)'; for several objectives, where no one trial is best, the size of
    their Pareto front: 'front 3 trials'."""
    if snapshot.front is not None:
        return f"front {_count(snapshot.front, 'trial', 'trials')}"
    if snapshot.best_value is None:
        return f"best {snapshot.metric} -"
    trial = f" (#{snapshot.best_trial})" if snapshot.best_trial is not None else ""
    return f"best {snapshot.metric} {format_value(snapshot.best_value)}{trial}"


def gpu_line(gpu: GpuSnapshot) -> str:
    """'sim:0 Simulated GPU 24 GB: 3 running, 3 slots (plan allows 4), 9.1/24.0 GB, 1 OOM'.

    Slots are how many trials may run at once now; the plan's maximum is said in words, so no
    'X/Y slots' is left to be read as running/slots in one place and slots/max in another.
    """
    slots = f"{_count(gpu.slots, 'slot', 'slots')} (plan allows {gpu.max_slots})"
    parts = [f"{gpu.running} running", slots, format_mb(gpu.vram_used_mb, gpu.vram_total_mb)]
    if gpu.ooms:
        parts.append(_count(gpu.ooms, "OOM", "OOMs"))
    if gpu.batch_bounds:
        parts.append(f"batch {gpu.batch_bounds[0]}-{gpu.batch_bounds[1]}")
    return f"{gpu.label}: " + ", ".join(parts)


def summary_line(snapshot: PoolSnapshot) -> str:
    """One log line: counted/budget, running, best, slots and VRAM per GPU, OOMs, retries, time."""
    parts = [
        f"{snapshot.counted}/{snapshot.budget} {_trials(snapshot.budget)}",
        f"{snapshot.running} running",
    ]
    if snapshot.waiting:
        parts.append(f"{snapshot.waiting} waiting")
    parts.append(best_text(snapshot))
    for gpu in snapshot.gpus:
        used = format_mb(gpu.vram_used_mb, gpu.vram_total_mb)
        vram = "" if used == "-" else f", {used}"
        slots = _count(gpu.slots, "slot", "slots")
        parts.append(f"{gpu.label.split(' ', 1)[0]} {gpu.running} running, {slots}{vram}")
    parts.append(_count(snapshot.ooms, "OOM", "OOMs"))
    parts.append(_count(snapshot.retries, "retry", "retries"))
    parts.append(f"{format_duration(snapshot.elapsed_s)} elapsed")
    eta = snapshot.eta_s
    if eta is not None:
        parts.append(f"~{format_duration(eta)} left")
    return f"[{snapshot.study_name}] " + " · ".join(parts)


def final_line(snapshot: PoolSnapshot) -> str:
    return (
        f"[{snapshot.study_name}] done: {snapshot.counted}/{snapshot.budget} "
        f"{_trials(snapshot.budget)} in "
        f"{format_duration(snapshot.elapsed_s)}, {best_text(snapshot)}, "
        f"{_count(snapshot.ooms, 'OOM', 'OOMs')}, {_count(snapshot.retries, 'retry', 'retries')}"
    )


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _trials(budget: int) -> str:
    """The word after 'counted/budget': '0/1 trial', '3/10 trials'."""
    return "trial" if budget == 1 else "trials"


def render(snapshot: PoolSnapshot) -> RenderableType:
    """The live panel: a progress bar over the budget, the study's numbers, one row per GPU."""

    head = rich_table.Table.grid(padding=(0, 2))
    for _ in range(3):
        head.add_column(no_wrap=True)
    bar = rich_progress_bar.ProgressBar(
        total=max(snapshot.budget, 1), completed=snapshot.counted, width=30
    )
    head.add_row(
        f"[bold]{rich_markup.escape(snapshot.study_name)}[/]",
        bar,
        f"[bold]{snapshot.counted}/{snapshot.budget}[/] {_trials(snapshot.budget)}",
    )
    eta = snapshot.eta_s
    timing = f"{format_duration(snapshot.elapsed_s)} elapsed" + (
        f" · ~{format_duration(eta)} left" if eta is not None else ""
    )
    # Two short lines rather than one long one: an 80-column terminal must not wrap them.
    best = rich_markup.escape(best_text(snapshot))
    now = f"{snapshot.running} running · {snapshot.waiting} waiting · {best}"
    trouble = f"{_count(snapshot.ooms, 'OOM', 'OOMs')} · {_count(snapshot.retries, 'retry', 'retries')} · {timing}"
    gpus = rich_table.Table(box=None, pad_edge=False, header_style="bold")
    # "slots/max": trials allowed at once now, of what the plan allows (running has its column).
    for name in ("GPU", "running", "slots/max", "VRAM in use", "OOMs", "batch"):
        gpus.add_column(name, no_wrap=True)
    for gpu in snapshot.gpus:
        batch = f"{gpu.batch_bounds[0]}-{gpu.batch_bounds[1]}" if gpu.batch_bounds else "-"
        gpus.add_row(
            gpu.label,
            str(gpu.running),
            f"{gpu.slots}/{gpu.max_slots}",
            format_mb(gpu.vram_used_mb, gpu.vram_total_mb),
            str(gpu.ooms),
            batch,
        )
    return rich_console.Group(head, now, trouble, gpus)


# --- the three displays --------------------------------------------------------------------


class QuietProgress:
    """--quiet: nothing while the run lasts."""

    def update(self, snapshot: PoolSnapshot) -> None:
        return None

    def close(self, final: PoolSnapshot | None) -> None:
        return None


class LogProgress:
    """Plain lines: one when the count of finished trials changes, else at most every LOG_INTERVAL_S.

    With verbose, one line per GPU follows each summary line.
    """

    def __init__(
        self,
        *,
        stream: TextIO,
        verbose: bool = False,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.verbose = verbose
        self.interval_s = interval_s
        self.clock = clock
        self._last_at: float | None = None
        self._last_counted: int | None = None

    def update(self, snapshot: PoolSnapshot) -> None:
        now = self.clock()
        due = self._last_at is None or now - self._last_at >= self.interval_s
        if not due and snapshot.counted == self._last_counted:
            return
        self._write(snapshot)
        self._last_at = now
        self._last_counted = snapshot.counted

    def close(self, final: PoolSnapshot | None) -> None:
        if final is not None:
            self._emit(final_line(final))

    def _write(self, snapshot: PoolSnapshot) -> None:
        self._emit(summary_line(snapshot))
        if self.verbose:
            for gpu in snapshot.gpus:
                self._emit("    " + gpu_line(gpu))

    def _emit(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(f"{stamp} {line}\n")
        self.stream.flush()


class LiveProgress:
    """A rich Live panel, redrawn on each update and left on screen with a final line at close."""

    def __init__(
        self, *, stream: TextIO, verbose: bool = False, force_terminal: bool | None = None
    ) -> None:
        self.verbose = verbose
        self.stream = stream
        self.console: Console = rich_console.Console(file=stream, force_terminal=force_terminal)
        self._live = None
        self._rerouted: list = []  # (logging handler, its own stream) while the panel is up

    def update(self, snapshot: PoolSnapshot) -> None:
        if self._live is None:
            self._live = rich_live.Live(
                render(snapshot), console=self.console, auto_refresh=False, transient=False
            )
            self._live.start()
            self._route_logging()
        self._live.update(render(snapshot), refresh=True)

    def close(self, final: PoolSnapshot | None) -> None:
        if self._live is not None:
            if final is not None:
                self._live.update(render(final), refresh=True)
            self._live.stop()
            self._live = None
            self._restore_logging()
        if final is not None:
            self.console.print(final_line(final), highlight=False, markup=False)

    def _route_logging(self) -> None:
        # Log records written straight to our stream would be drawn over by the next refresh;
        # through rich's proxy they print above the panel instead.

        proxy = rich_file_proxy.FileProxy(self.console, self.stream)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self.stream:
                self._rerouted.append((handler, handler.setStream(proxy)))

    def _restore_logging(self) -> None:
        for handler, stream in self._rerouted:
            handler.flush()
            handler.setStream(stream)
        self._rerouted = []
