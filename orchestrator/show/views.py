"""What the read-only views show, as values: trials by state, the best trial, VRAM per trial and
per GPU, OOM events, slots over time.

Pure shaping functions over plain values, tested without a database; `show.queries` reads the
storage into them, `show.text` writes them for a person.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.record.study.spec import SPEC_ATTR, StudySpec
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.best import pick_best
from orchestrator.show.text import to_utc

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from orchestrator.record.store.records import ConcurrencyEvent
    from orchestrator.record.study.spec import BudgetCount
    from orchestrator.show.recommended import Recommended

STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
# A study with more than one objective has no single best trial; its `direction` reads this.
MULTI_OBJECTIVE = "multi-objective"


# --- what the views hold -------------------------------------------------------------------


@dataclass(frozen=True)
class StudyRow:
    """One study in `status` without --study."""

    name: str
    adapter: str | None
    direction: str  # "minimize", "maximize" or MULTI_OBJECTIVE
    counted: int
    budget: int | None
    running: int
    waiting: int
    best_value: float | None
    best_trial: int | None
    directions: list[str] = field(default_factory=list)  # one per objective


@dataclass(frozen=True)
class BestTrial:
    number: int
    value: float
    params: dict[str, Any]
    user_attrs: dict[str, Any]


@dataclass(frozen=True)
class VramRow:
    """What one trial that ran on a device planned and used."""

    trial: int
    state: str
    gpu: str  # the kind of GPU (its name): the memory model is per kind
    gpu_index: int | None
    host: str | None
    batch_size: int | None
    planned_mb: float | None
    vram_peak_mb: float | None
    concurrency: int | None
    oom: bool

    @property
    def peak_over_planned(self) -> float | None:
        if not self.planned_mb or self.vram_peak_mb is None:
            return None
        return self.vram_peak_mb / self.planned_mb


@dataclass(frozen=True)
class GpuVram:
    """VRAM per trial on one kind of GPU, planned against peak."""

    gpu: str
    trials: int
    planned_mean_mb: float | None
    peak_mean_mb: float | None
    peak_max_mb: float | None
    worst_peak_over_planned: float | None
    ooms: int


@dataclass(frozen=True)
class OomEvent:
    trial: int
    at: dt.datetime | None  # naive UTC, like our orch_* timestamps
    host: str | None
    gpu: str
    gpu_index: int | None
    batch_size: int | None
    concurrency: int | None
    retried: bool  # its parameters were queued again


@dataclass(frozen=True)
class Worker:
    host: str
    gpu_index: int | None
    gpu_name: str
    pid: int
    started_at: dt.datetime
    last_seen: dt.datetime
    stopped_at: dt.datetime | None
    slurm_job: str | None = None  # ARRAYJOB_TASK or JOBID under Slurm
    slurm_node: str | None = None
    slurm_restarts: int | None = None


@dataclass(frozen=True)
class MemoryLine:
    """A memory model as a line: planned MB = overhead + batch size x per sample."""

    gpu: str
    model_overhead_mb: float
    per_sample_mb: float
    source: str  # "plan" (what trials were planned with), "measured", or "adapter"

    def at(self, batch_size: float) -> float:
        return self.model_overhead_mb + batch_size * self.per_sample_mb


@dataclass(frozen=True)
class StudyDetail:
    name: str
    adapter: str | None
    direction: str
    budget: int | None
    epochs: int | None
    sampler: str | None
    states: dict[str, int]
    counted: int
    retried: int
    best: BestTrial | None
    workers: list[Worker] = field(default_factory=list)
    concurrency_events: list[ConcurrencyEvent] = field(default_factory=list)
    ooms: list[OomEvent] = field(default_factory=list)
    vram: list[VramRow] = field(default_factory=list)
    vram_by_gpu: list[GpuVram] = field(default_factory=list)
    memory_lines: list[MemoryLine] = field(default_factory=list)
    directions: list[str] = field(default_factory=list)  # one per objective
    # Population-based training: the best trial's lineage (record/trials/best.best_lineage).
    lineage: dict[str, Any] | None = None
    # The trial to deploy: the configuration the model expects best (show/recommended.py).
    recommended: Recommended | None = None
    valued: int = 0  # completed trials with a finite value (record/study/final_scores.py)
    metric: str = "value"  # the objective's name where the study stores one (Optuna's metric_names)


# --- pure shaping ------------------------------------------------------------------------------


def states_of(trials: Iterable[FrozenTrial]) -> dict[str, int]:
    counts = Counter(trial.state.name for trial in trials)
    return {state: counts.get(state, 0) for state in STATES}


def direction_of(directions: Sequence[str]) -> str:
    """'minimize' or 'maximize' for one objective, MULTI_OBJECTIVE for more."""
    if len(directions) > 1:
        return MULTI_OBJECTIVE
    return directions[0] if directions else "minimize"


def describe_direction(direction: str, directions: Sequence[str]) -> str:
    """'minimize', or 'multi-objective (minimize, maximize)'."""
    if direction == MULTI_OBJECTIVE:
        return f"{MULTI_OBJECTIVE} ({', '.join(directions)})"
    return direction


def no_best_yet(complete: int) -> str:
    """Why a study has no best trial: none completed yet, or none with a finite value."""
    if not complete:
        return "no completed trial yet"
    return (
        f"{complete} trial{'' if complete == 1 else 's'} completed, none with a finite value "
        "(the objective returned inf or nan)"
    )


def best_of(trials: Iterable[FrozenTrial], direction: str) -> BestTrial | None:
    """The best trial, by orchestrator.record.trials.best's rule, as the views show it.

    None for a multi-objective study: its trials carry several values and no single one is best.
    """
    if direction == MULTI_OBJECTIVE:
        return None
    best = pick_best(trials, [direction])
    if best is None:
        return None
    return BestTrial(
        number=best.number,
        value=float(best.values[0]),
        params=dict(best.params),
        user_attrs=dict(best.user_attrs),
    )


def vram_rows(
    trials: Iterable[FrozenTrial], recorded: Sequence[dict[str, Any]] = ()
) -> list[VramRow]:
    """VRAM per trial from its user attributes, filled in from orch_trial_vram rows where missing."""
    by_number: dict[int, dict[str, Any]] = {}
    for row in recorded:  # the newest row of a trial number wins (rows come ordered by id)
        by_number[int(row["trial_number"])] = row
    out: list[VramRow] = []
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        row = by_number.get(trial.number, {})
        gpu = attrs.get(names.GPU, row.get("gpu_name"))
        if gpu is None:
            continue  # never ran on a device (waiting, or failed before it got one)
        batch = trial.params.get(names.BATCH_SIZE, row.get("batch_size"))
        out.append(
            VramRow(
                trial=trial.number,
                state=trial.state.name,
                gpu=str(gpu),
                gpu_index=_int(attrs.get(names.GPU_INDEX, row.get("gpu_index"))),
                host=attrs.get(names.HOST, row.get("host")),
                batch_size=_int(batch),
                planned_mb=_float(attrs.get(names.VRAM_PLANNED_MB, row.get("vram_planned_mb"))),
                vram_peak_mb=_float(attrs.get(names.VRAM_PEAK_MB, row.get("vram_peak_mb"))),
                concurrency=_int(attrs.get(names.CONCURRENCY, row.get("concurrency"))),
                oom=bool(attrs.get(names.OOM, row.get("oom", False))),
            )
        )
    return out


def vram_by_gpu(rows: Iterable[VramRow]) -> list[GpuVram]:
    groups: dict[str, list[VramRow]] = defaultdict(list)
    for row in rows:
        groups[row.gpu].append(row)
    out = []
    for gpu in sorted(groups):
        group = groups[gpu]
        planned = [r.planned_mb for r in group if r.planned_mb is not None]
        peak = [r.vram_peak_mb for r in group if r.vram_peak_mb is not None]
        ratios = [r.peak_over_planned for r in group if r.peak_over_planned is not None]
        out.append(
            GpuVram(
                gpu=gpu,
                trials=len(group),
                planned_mean_mb=sum(planned) / len(planned) if planned else None,
                peak_mean_mb=sum(peak) / len(peak) if peak else None,
                peak_max_mb=max(peak) if peak else None,
                worst_peak_over_planned=max(ratios) if ratios else None,
                ooms=sum(1 for r in group if r.oom),
            )
        )
    return out


def oom_events(trials: Iterable[FrozenTrial], retried: set[int]) -> list[OomEvent]:
    out = []
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        if not attrs.get(names.OOM):
            continue
        out.append(
            OomEvent(
                trial=trial.number,
                at=to_utc(trial.datetime_complete),
                host=attrs.get(names.HOST),
                gpu=str(attrs.get(names.GPU, "?")),
                gpu_index=_int(attrs.get(names.GPU_INDEX)),
                batch_size=_int(trial.params.get(names.BATCH_SIZE)),
                concurrency=_int(attrs.get(names.CONCURRENCY)),
                retried=trial.number in retried,
            )
        )
    return out


def plan_lines(rows: Iterable[VramRow]) -> list[MemoryLine]:
    """Per kind of GPU, the line through (batch size, planned MB): the memory model trials ran with.

    Least squares over the planned points; with a single batch size the line is flat at its value.
    """
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        if row.batch_size is not None and row.planned_mb is not None:
            points[row.gpu].append((float(row.batch_size), row.planned_mb))
    lines = []
    for gpu in sorted(points):
        xs, ys = zip(*points[gpu], strict=True)
        n = len(xs)
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = (
            0.0
            if spread == 0
            else sum((x - mean_x) * (y - mean_y) for x, y in points[gpu]) / spread
        )
        lines.append(MemoryLine(gpu, mean_y - slope * mean_x, slope, "plan"))
    return lines


@dataclass(frozen=True)
class SlotSeries:
    """Slots over time on one GPU of one host: steps at each concurrency change."""

    label: str
    times: list[dt.datetime]
    slots: list[int]
    reasons: list[str]


def slot_series(
    events: Iterable[ConcurrencyEvent], until: dt.datetime | None = None
) -> list[SlotSeries]:
    """Step series per (host, GPU): starts at the first event's from-slots, ends at `until`."""
    groups: dict[tuple[str, int | None, str], list[ConcurrencyEvent]] = defaultdict(list)
    for event in events:
        groups[(event.host, event.gpu_index, event.gpu_name)].append(event)
    out = []
    for (host, index, name), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)
    ):
        group.sort(key=lambda e: e.at)
        times = [group[0].at]
        slots = [group[0].from_slots]
        reasons = ["start"]
        for event in group:
            times.append(event.at)
            slots.append(event.to_slots)
            reasons.append(event.reason)
        if until is not None and until > times[-1]:
            times.append(until)
            slots.append(slots[-1])
            reasons.append("end")
        label = f"{host} {name}" if index is None else f"{host} #{index} {name}"
        out.append(SlotSeries(label=label, times=times, slots=slots, reasons=reasons))
    return out


def study_row(
    name: str,
    user_attrs: dict[str, Any],
    directions: Sequence[str],
    count: BudgetCount,
    best: BestTrial | None,
) -> StudyRow:
    spec_attr = user_attrs.get(SPEC_ATTR)
    spec = StudySpec.from_attr(spec_attr) if isinstance(spec_attr, dict) else None
    direction = direction_of(directions)
    return StudyRow(
        name=name,
        adapter=spec.adapter if spec else None,
        direction=direction,
        counted=count.counted,
        budget=spec.trials if spec else None,
        running=count.running,
        waiting=count.waiting,
        best_value=best.value if best else None,
        best_trial=best.number if best else None,
        directions=list(directions),
    )


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
