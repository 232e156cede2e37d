"""How the GPUs were used, as values: each trial a bar on the GPU it ran on, from its start to its
end, and the memory its trials held on each GPU over time against what the GPU let them use.

Where a trial ran comes from its attributes (host, gpu_index, gpu); when, from the time its GPU
admitted it (a trial waits for room after Optuna stamps its start) to Optuna's end.
The memory held at a moment is the sum of the VRAM peaks of the trials running then (an OOM'd
trial counts at what it was planned to use, as in the VRAM chart): a trial's peak is the one
figure recorded for it, so each is drawn as held from its start to its end. What the GPU let
trials use is the allowance the pool recorded with each change (orch_concurrency_events' to_mb:
the GPU's usable memory after the safety margin, halved at the start, cut on an OOM); the GPU's
physical total is not stored with a study.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.record.trials import attr_names as names
from orchestrator.show.text import to_utc

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from orchestrator.record.store.records import ConcurrencyEvent
    from orchestrator.show.views import VramRow

CPU = "cpu"  # what a trial run without a GPU records as its GPU
CPU_ONLY_NOTE = (
    "every trial ran on the CPU (--gpus none, or no GPU was found): there is no GPU memory to "
    "show; trials record their VRAM only on a GPU"
)


@dataclass(frozen=True)
class Bar:
    trial: int
    state: str
    start: dt.datetime  # naive UTC
    end: dt.datetime
    memory_mb: float | None  # its VRAM peak (an OOM: what it was planned to use)
    batch_size: int | None
    row: int = 0  # which of its GPU's rows it is drawn on: trials that overlap get their own

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Lane:
    """One GPU of one host, and the trials that ran on it."""

    label: str  # "vm #0 Simulated GPU 12 GB"
    host: str
    gpu_index: int | None
    gpu_name: str
    bars: list[Bar]

    @functools.cached_property
    def rows(self) -> int:  # cached: asked once per bar when the charts name its row
        return 1 + max((b.row for b in self.bars), default=0)


@dataclass(frozen=True)
class Steps:
    """A value that changes at moments and holds between them (drawn with line_shape='hv')."""

    times: list[dt.datetime]
    values: list[float]


def lane_label(host: str | None, index: int | None, name: str) -> str:
    """The slots chart's label for a GPU: host, #index, name."""
    host = host or "?"
    return f"{host} {name}" if index is None else f"{host} #{index} {name}"


def trial_lanes(trials: Iterable[FrozenTrial], until: dt.datetime) -> list[Lane]:
    """Trials that ran somewhere, by GPU; one still running ends at `until` (naive UTC)."""
    groups: dict[tuple[str, int | None, str], list[Bar]] = defaultdict(list)
    for trial in trials:
        attrs = trial.user_attrs
        if names.GPU not in attrs or trial.datetime_start is None:
            continue  # waiting, or never got a device
        start = _admitted_at(attrs) or to_utc(trial.datetime_start)
        end = to_utc(trial.datetime_complete) if trial.datetime_complete else until
        index = attrs.get(names.GPU_INDEX)
        key = (str(attrs.get(names.HOST) or "?"), None if index is None else int(index),
               str(attrs[names.GPU]))  # fmt: skip
        groups[key].append(
            Bar(trial.number, trial.state.name, start, max(start, end), _held_mb(attrs),
                _int(trial.params.get(names.BATCH_SIZE)))
        )  # fmt: skip
    lanes = []
    for (host, index, name), bars in sorted(groups.items(), key=lambda kv: _lane_order(kv[0])):
        lanes.append(Lane(lane_label(host, index, name), host, index, name, pack_rows(bars)))
    return lanes


def _admitted_at(attrs: dict) -> dt.datetime | None:
    """When the trial's GPU let it start (naive UTC); None for a trial recorded before that."""
    try:
        return to_utc(dt.datetime.fromisoformat(str(attrs[names.ADMITTED_AT])))
    except (KeyError, ValueError):
        return None


def _lane_order(key: tuple[str, int | None, str]) -> tuple[str, int, str]:
    host, index, name = key
    return host, -1 if index is None else index, name


def pack_rows(bars: Sequence[Bar]) -> list[Bar]:
    """Each bar on the lowest row where it overlaps no other: as many rows as trials ran at once."""
    row_ends: list[dt.datetime] = []
    out = []
    for bar in sorted(bars, key=lambda b: (b.start, b.trial)):
        row = next((i for i, end in enumerate(row_ends) if end <= bar.start), len(row_ends))
        if row == len(row_ends):
            row_ends.append(bar.end)
        else:
            row_ends[row] = bar.end
        out.append(replace(bar, row=row))
    return out


def memory_held(bars: Sequence[Bar]) -> Steps:
    """The sum of the memory of the bars running at each moment, stepping at starts and ends."""
    changes: dict[dt.datetime, float] = defaultdict(float)
    for bar in bars:
        if bar.memory_mb is None:
            continue
        changes[bar.start] += bar.memory_mb
        changes[bar.end] -= bar.memory_mb
    times, values, held = [], [], 0.0
    for moment in sorted(changes):
        held += changes[moment]
        times.append(moment)
        values.append(round(max(held, 0.0), 1))  # float sums may leave -1e-13 behind
    return Steps(times, values)


def allowance(
    events: Iterable[ConcurrencyEvent], lane: Lane, until: dt.datetime | None
) -> Steps | None:
    """What the pool let this GPU's trials use over time (MB), from its recorded changes; None
    where it recorded none with a figure (an older study, or the CPU's unlimited allowance)."""
    mine = sorted(
        (e for e in events if e.host == lane.host and e.gpu_index == lane.gpu_index
         and e.gpu_name == lane.gpu_name and e.to_mb is not None),
        key=lambda e: e.at,
    )  # fmt: skip
    if not mine:
        return None
    times = [e.at for e in mine]
    values = [float(e.to_mb) for e in mine]
    if until is not None and until > times[-1]:
        times.append(until)
        values.append(values[-1])
    return Steps(times, values)


def cpu_only(lanes: Sequence[Lane]) -> bool:
    """Every trial that ran, ran on the CPU."""
    return bool(lanes) and all(lane.gpu_name == CPU for lane in lanes)


def cpu_only_note(rows: Sequence[VramRow]) -> str | None:
    """Why a study whose every trial ran on the CPU has no VRAM to show; None for any other."""
    if rows and all(row.gpu == CPU for row in rows):
        return CPU_ONLY_NOTE
    return None


def _held_mb(attrs: dict) -> float | None:
    if attrs.get(names.OOM):
        return _float(attrs.get(names.VRAM_PLANNED_MB))
    peak = _float(attrs.get(names.VRAM_PEAK_MB))
    return peak if peak is not None else _float(attrs.get(names.VRAM_PLANNED_MB))


def _int(value: object) -> int | None:
    try:
        return None if value is None else int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _float(value: object) -> float | None:
    try:
        return None if value is None else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
