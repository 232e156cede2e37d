"""Read-only views of studies, shared by `status`, `best` and `report`.

Two halves: queries that read the storage (Optuna's trials, our orch_* tables) and pure shaping
functions that turn trials and rows into what a person reads (trials by state, best trial, VRAM
per trial and per GPU, OOM events, slots over time). The shaping functions take plain values, so
they are tested without a database.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

    from orchestrator.records import ConcurrencyEvent
    from orchestrator.study import BudgetCount

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
    peak_mb: float | None
    concurrency: int | None
    oom: bool

    @property
    def peak_over_planned(self) -> float | None:
        if not self.planned_mb or self.peak_mb is None:
            return None
        return self.peak_mb / self.planned_mb


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


def best_of(trials: Iterable[FrozenTrial], direction: str) -> BestTrial | None:
    """The completed trial with the best value (the lowest number wins a tie).

    None for a multi-objective study: its trials carry several values and no single one is best.
    """
    from optuna.trial import TrialState

    if direction == MULTI_OBJECTIVE:
        return None
    # `values`, not `value`: reading `value` of a multi-objective trial raises.
    done = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE and t.values is not None and len(t.values) == 1
    ]
    done = [t for t in done if not math.isnan(t.values[0])]
    if not done:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    best = min(done, key=lambda t: (sign * t.values[0], t.number))
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
        gpu = attrs.get("gpu", row.get("gpu_name"))
        if gpu is None:
            continue  # never ran on a device (waiting, or failed before it got one)
        batch = trial.params.get("batch_size", row.get("batch_size"))
        out.append(
            VramRow(
                trial=trial.number,
                state=trial.state.name,
                gpu=str(gpu),
                gpu_index=_int(attrs.get("gpu_index", row.get("gpu_index"))),
                host=attrs.get("host", row.get("host")),
                batch_size=_int(batch),
                planned_mb=_float(attrs.get("vram_planned_mb", row.get("vram_planned_mb"))),
                peak_mb=_float(attrs.get("vram_peak_mb", row.get("vram_peak_mb"))),
                concurrency=_int(attrs.get("concurrency", row.get("concurrency"))),
                oom=bool(attrs.get("oom", row.get("oom", False))),
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
        peak = [r.peak_mb for r in group if r.peak_mb is not None]
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
        if not attrs.get("oom"):
            continue
        out.append(
            OomEvent(
                trial=trial.number,
                at=to_utc(trial.datetime_complete),
                host=attrs.get("host"),
                gpu=str(attrs.get("gpu", "?")),
                gpu_index=_int(attrs.get("gpu_index")),
                batch_size=_int(trial.params.get("batch_size")),
                concurrency=_int(attrs.get("concurrency")),
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
    from orchestrator.study import SPEC_ATTR, StudySpec

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


def to_utc(moment: dt.datetime | None) -> dt.datetime | None:
    """Optuna stamps trials in local time; our rows are naive UTC. Bring both to naive UTC."""
    if moment is None:
        return None
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def to_jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and NaN-free floats in a shape json.dumps takes."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def mb_text(value: float | None) -> str:
    """MB as a person reads them in a table: '1,638', or '-' when unknown."""
    return "-" if value is None else f"{value:,.0f}"


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 epoch', '15 epochs'; `many` for words that do not just take an s."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def require_single_objective(detail: StudyDetail, command: str) -> None:
    """A UserError, in one line, for a command that needs one best value."""
    if detail.direction == MULTI_OBJECTIVE:
        raise UserError(
            f"study {detail.name!r} is {describe_direction(detail.direction, detail.directions)}: "
            f"`{command}` supports single-objective studies only; `python -m orchestrator status "
            f"--study {detail.name}` shows its trials, `python -m orchestrator dashboard` its Pareto front"
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


# --- queries ---------------------------------------------------------------------------------


def open_for_reading(url: str) -> RDBStorage:
    """The storage at URL, for reading: an SQLite file that does not exist is an error, not a new file."""
    from orchestrator.storage import create_storage, describe_location, sqlite_path

    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise UserError(
            f"no study database at {describe_location(url)}: start a study with "
            "`python -m orchestrator run ADAPTER`, or point --storage at an existing one"
        )
    storage = create_storage(url)
    bring_our_tables_up_to_date(storage)
    return storage


def bring_our_tables_up_to_date(storage: RDBStorage) -> None:
    """A database written by an earlier version has our tables at an older revision: bring them
    to this version's (new columns only, nothing stored is lost), as `run` would. One with none
    of our tables (Optuna's alone) is left as it is: the views read what is there."""
    from orchestrator.locks import schema_lock
    from orchestrator.migrate import current_revision, head_revision, upgrade_orchestrator_schema

    revision = current_revision(storage)
    if revision is None or revision == head_revision():
        return
    with schema_lock(storage.url):
        if current_revision(storage) != head_revision():
            upgrade_orchestrator_schema(storage)


def _guarded(storage: RDBStorage):  # noqa: ANN202
    """Turn a database error during a read into the one-line 'cannot reach' message."""
    from contextlib import contextmanager

    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.storage import unreachable

    @contextmanager
    def guard():  # noqa: ANN202
        try:
            yield
        except SQLAlchemyError as error:
            raise unreachable(storage.url, error) from None

    return guard()


def list_studies(storage: RDBStorage) -> list[StudyRow]:
    """Every study with its counts and best trial: aggregate queries, no trial read in full."""
    from orchestrator.trial_counts import stored_count

    rows = []
    with _guarded(storage):
        for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
            directions = [d.name.lower() for d in study.directions]
            count = stored_count(storage.engine, study._study_id)
            best = _stored_best(storage, study._study_id, direction_of(directions))
            rows.append(
                study_row(study.study_name, dict(study.user_attrs), directions, count, best)
            )
    return rows


def _stored_best(storage: RDBStorage, study_id: int, direction: str) -> BestTrial | None:
    if direction == MULTI_OBJECTIVE:
        return None
    try:
        trial = storage.get_best_trial(study_id)  # one ordered query, one trial read
    except ValueError:
        return None
    return best_of([trial], direction)


def _has_table(storage: RDBStorage, name: str) -> bool:
    import sqlalchemy as sa

    return sa.inspect(storage.engine).has_table(name)


def list_workers(storage: RDBStorage, study_name: str) -> list[Worker]:
    import sqlalchemy as sa

    from orchestrator.records import workers

    if not _has_table(storage, workers.name):
        return []
    query = (
        sa.select(workers)
        .where(workers.c.study_name == study_name)
        .order_by(workers.c.started_at, workers.c.id)
    )
    with storage.engine.connect() as conn:
        return [
            Worker(
                host=row.host,
                gpu_index=row.gpu_index,
                gpu_name=row.gpu_name,
                pid=row.pid,
                started_at=row.started_at,
                last_seen=row.last_seen,
                stopped_at=row.stopped_at,
            )
            for row in conn.execute(query)
        ]


def measured_lines(
    storage: RDBStorage, adapter: str | None, gpus: Iterable[str]
) -> list[MemoryLine]:
    """Memory models measured on these kinds of GPU for this adapter (orch_memory_models)."""
    from orchestrator.records import load_memory_model, memory_models

    if adapter is None or not _has_table(storage, memory_models.name):
        return []
    lines = []
    for gpu in sorted(set(gpus)):
        model = load_memory_model(storage.engine, adapter=adapter, gpu_name=gpu)
        if model is not None:
            lines.append(MemoryLine(gpu, model.model_overhead_mb, model.per_sample_mb, "measured"))
    return lines


def study_detail(
    storage: RDBStorage,
    name: str,
    storage_label: str,
    trials: list[FrozenTrial] | None = None,
) -> StudyDetail:
    """Everything `status --study`, `best` and `report` show about one study (`trials`: its
    trials, when the caller has read them already)."""
    from orchestrator.records import (
        concurrency_events,
        list_concurrency_events,
        list_trial_vram,
        trial_vram,
    )
    from orchestrator.study import (
        count_trials,
        load_existing_study,
        load_spec,
        retried_trial_numbers,
    )
    from orchestrator.trial_reader import read_trials

    with _guarded(storage):
        study = load_existing_study(storage, name, storage_label)
        spec = load_spec(study)
        if trials is None:
            trials = read_trials(storage.engine, study._study_id)
        # `study.direction` raises on a multi-objective study: read `directions`.
        directions = [d.name.lower() for d in study.directions]
        direction = direction_of(directions)
        recorded = (
            list_trial_vram(storage.engine, name) if _has_table(storage, trial_vram.name) else []
        )
        events = (
            list_concurrency_events(storage.engine, name)
            if _has_table(storage, concurrency_events.name)
            else []
        )
        workers_seen = list_workers(storage, name)
        rows = vram_rows(trials, recorded)
        adapter = spec.adapter if spec else None
        lines = plan_lines(rows) + measured_lines(storage, adapter, (r.gpu for r in rows))
    count = count_trials(trials)
    return StudyDetail(
        name=name,
        adapter=adapter,
        direction=direction,
        budget=spec.trials if spec else None,
        epochs=spec.epochs if spec else None,
        sampler=spec.sampler if spec else None,
        states=states_of(trials),
        counted=count.counted,
        retried=count.retried,
        best=best_of(trials, direction),
        workers=workers_seen,
        concurrency_events=events,
        ooms=oom_events(trials, retried_trial_numbers(trials)),
        vram=rows,
        vram_by_gpu=vram_by_gpu(rows),
        memory_lines=lines,
        directions=directions,
    )


def load_study_trials(storage: RDBStorage, name: str, storage_label: str):  # noqa: ANN201
    """The study for Optuna's own plots: a snapshot of its trials, read once in flat queries.

    Optuna's plotting functions ask a study for its trials many times over and deep-copy them
    each time; at 3,000 trials that alone took the report past 20 s. The snapshot is an
    in-memory study that hands out the trials read once, without copying them."""
    from orchestrator.study import load_existing_study
    from orchestrator.trial_reader import read_trials

    with _guarded(storage):
        study = load_existing_study(storage, name, storage_label)
        trials = read_trials(storage.engine, study._study_id, intermediate_values=True)
    return snapshot_study(study, trials)


def snapshot_study(study: Any, trials: list[FrozenTrial]) -> Any:
    import optuna
    from optuna.trial import TrialState

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory"
    try:
        snapshot = optuna.create_study(study_name=study.study_name, directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    for key, value in study.user_attrs.items():  # the study's settings: its metric, its spec
        snapshot.set_user_attr(key, value)

    def get_trials(deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list:
        return [t for t in trials if states is None or t.state in states]

    def best_trial(deepcopy: bool = True) -> FrozenTrial:
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
        if not done:
            raise ValueError("No trials are completed yet.")
        sign = 1.0 if study.directions[0].name == "MINIMIZE" else -1.0
        return min(done, key=lambda t: (sign * t.values[0], t.number))

    # Instance attributes win over the class's methods (and over `trials`, `best_trial`,
    # `best_value` and `best_params`, which call them).
    snapshot.get_trials = get_trials
    snapshot._get_trials = get_trials
    snapshot._get_best_trial = best_trial
    return snapshot
