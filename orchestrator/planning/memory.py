"""Which memory model plans an adapter on a GPU: the adapter's declared guess, or what was measured.

A measured model is a straight line, peak VRAM = overhead + per_sample x batch_size, fitted to
(batch size, peak MB) points from `plan --calibrate` or from finished trials' `orch_trial_vram`
rows, and stored per (adapter, GPU name) in `orch_memory_models`. Where one exists for a GPU's
name, plans use it and say so. One function writes it, `save_learnt_model`, by one rule
(`learnt_model`): during a run and at its end alike, an OOM's floor survives the fit. The fitting
and the choices are pure; reading and writing the storage are the small functions at the bottom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import MemoryModel
from orchestrator.imports import LazyImport
from orchestrator.planning.footprint import envelope
from orchestrator.record.outages.riding import when_a_connection_is_free
from orchestrator.record.store.storage import engine_kwargs
from orchestrator.record.store.storage_failures import unreachable

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Engine

    from orchestrator.planning.footprint import Footprint
    from orchestrator.record.store import records
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.records import MeasuredMemoryModel
else:
    records = LazyImport("orchestrator.record.store.records")
    sa = LazyImport("sqlalchemy")

DECLARED = "declared"
CALIBRATION = "calibration"  # the sources stored in orch_memory_models
SOURCE_TRIALS = "trials"
# Trials whose peak says something about the memory model: they ran to the end or were pruned
# after their first epoch (the peak comes early), and did not run out of memory.
MEASURED_STATES = frozenset({"COMPLETE", "PRUNED"})
MIN_TRIAL_SAMPLES = 5


def fit_memory_model(points: Iterable[tuple[float, float]]) -> MemoryModel:
    """The line through (batch size, peak MB) points by least squares, raised to cover every point.

    Raising the intercept by the largest residual makes the model an upper envelope: no measured
    trial used more than the model says for its batch size. A falling or flat slope (noise, or a
    model whose memory does not grow with the batch) becomes per_sample 0 at the largest peak;
    a negative intercept becomes overhead 0 with the steepest per-sample cost seen.
    """
    data = [(float(batch), float(peak)) for batch, peak in points]
    if len({batch for batch, _ in data}) < 2:
        raise ValueError("fitting a memory model needs peaks measured at two or more batch sizes")
    if any(batch <= 0 or peak < 0 or not math.isfinite(peak) for batch, peak in data):
        raise ValueError("batch sizes must be positive and peaks finite and not negative")
    n = len(data)
    mean_x = sum(batch for batch, _ in data) / n
    mean_y = sum(peak for _, peak in data) / n
    sxx = sum((batch - mean_x) ** 2 for batch, _ in data)
    sxy = sum((batch - mean_x) * (peak - mean_y) for batch, peak in data)
    slope = sxy / sxx
    if slope <= 0:
        return MemoryModel(max(peak for _, peak in data), 0.0)
    intercept = mean_y - slope * mean_x
    intercept += max(0.0, max(peak - (intercept + slope * batch) for batch, peak in data))
    if intercept < 0:
        return MemoryModel(0.0, max(peak / batch for batch, peak in data))
    return MemoryModel(intercept, slope)


def describe_measured(measured: MeasuredMemoryModel) -> str:
    return f"measured ({measured.source}, {measured.samples} samples)"


def choose_memory_model(
    declared: MemoryModel, measured: MeasuredMemoryModel | None
) -> tuple[MemoryModel, str]:
    """The measured model where one exists, else the declared one; with the words that say which."""
    if measured is None:
        return declared, DECLARED
    return MemoryModel(measured.model_overhead_mb, measured.per_sample_mb), describe_measured(
        measured
    )


def trial_points(rows: Iterable[Mapping[str, Any]], gpu_name: str) -> list[tuple[int, float]]:
    """(batch size, peak MB) of the finished, not-OOM trials on GPUs called `gpu_name`."""
    return [
        (int(row["batch_size"]), float(row["vram_peak_mb"]))
        for row in rows
        if row.get("gpu_name") == gpu_name
        and str(row.get("state", "")).upper() in MEASURED_STATES
        and not row.get("oom")
        and row.get("batch_size")
        and row.get("vram_peak_mb") is not None
    ]


def fit_from_trials(
    rows: Iterable[Mapping[str, Any]], gpu_name: str, *, min_samples: int = MIN_TRIAL_SAMPLES
) -> tuple[MemoryModel, int] | None:
    """A model fitted to the trials' peaks and its sample count, or None while they say too little."""
    points = trial_points(rows, gpu_name)
    if len(points) < min_samples or len({batch for batch, _ in points}) < 2:
        return None
    return fit_memory_model(points), len(points)


def learnt_model(
    measured: tuple[MemoryModel, int] | None, footprints: Iterable[Footprint]
) -> tuple[MemoryModel, int] | None:
    """What to store for an adapter on one kind of GPU, and its sample count (None: nothing new).

    The rule: what was measured (the trials' fit, or a calibration) where there is one, else what
    the run's footprints learnt (their `effective_model`); in both cases raised to every OOM floor
    the footprints learnt. The floor must survive the fit: the fit leaves OOM'd trials out (they
    measured no peak), so on its own it can say a batch size fits the very room it ran out of
    memory in, and the next plan, on this node or another, would admit it there again to OOM again.
    """
    learnt = [footprint for footprint in footprints if footprint.learnt]
    if measured is None:
        if not learnt:
            return None
        models = [footprint.effective_model() for footprint in learnt]
        return envelope(models), max(len(footprint.peaks) for footprint in learnt)
    model, samples = measured
    floors = [floor for floor in (footprint.oom_floor() for footprint in learnt) if floor]
    return envelope([model, *floors]), samples


# --- the storage ---------------------------------------------------------------------------


def existing_engine(location: StorageLocation) -> Engine | None:
    """An engine on the storage if it already holds our tables; None if there is nothing to read.

    An SQLite file that is not there means "no measurements": planning never creates a database.
    """
    if location.is_sqlite:
        path = location.sqlite_path
        if path is None or not path.is_file():
            return None
    engine = sa.create_engine(location.url, **engine_kwargs(location))
    try:
        # A server with no connection free is waited for, as opening the storage does: a host
        # joining a full server reads its memory models once a connection is free.
        has_models = when_a_connection_is_free(
            lambda: sa.inspect(engine).has_table(records.memory_models.name)
        )
        if not has_models:
            engine.dispose()
            return None
    except sa.exc.SQLAlchemyError as error:
        engine.dispose()
        raise unreachable(location, error) from None
    return engine


def measured_models(
    location: StorageLocation, adapter: str, declared: MemoryModel, gpu_names: Iterable[str]
) -> dict[str, tuple[MemoryModel, str]]:
    """GPU name -> (model, source) for every named GPU that has a measured model in the storage."""
    names = sorted(set(gpu_names))
    if not names:
        return {}
    engine = existing_engine(location)
    if engine is None:
        return {}
    try:
        found = {}
        for name in names:
            measured = when_a_connection_is_free(
                lambda name=name: records.load_memory_model(engine, adapter=adapter, gpu_name=name)
            )
            if measured is not None:
                found[name] = choose_memory_model(declared, measured)
        return found
    finally:
        engine.dispose()


def save_learnt_model(
    engine: Engine,
    *,
    adapter: str,
    gpu_name: str,
    footprints: Sequence[Footprint] = (),
    study_names: Sequence[str] = (),
    calibration: tuple[MemoryModel, int] | None = None,
    min_samples: int = MIN_TRIAL_SAMPLES,
) -> MemoryModel | None:
    """The one writer of `orch_memory_models`: store what `learnt_model` says, and return it.

    `footprints`: what a run learnt on GPUs called `gpu_name` (the pool, after each trial that
    taught it something, and the end of a run). `study_names`: studies whose finished trials'
    peaks are fitted (the end of a run; while they say too little, fewer than `min_samples`
    measured trials or all at one batch size, the footprints alone decide). `calibration`: a
    model `plan --calibrate` measured, stored as such. Stores nothing where nothing is learnt.
    """
    source = SOURCE_TRIALS
    measured = None
    if calibration is not None:
        source, measured = CALIBRATION, calibration
    elif study_names:
        rows: list[dict[str, Any]] = []
        for study_name in study_names:
            rows.extend(records.list_trial_vram(engine, study_name))
        measured = fit_from_trials(rows, gpu_name, min_samples=min_samples)
    merged = learnt_model(measured, footprints)
    if merged is None:
        return None
    model, samples = merged
    records.save_memory_model(
        engine,
        adapter=adapter,
        gpu_name=gpu_name,
        model_overhead_mb=model.model_overhead_mb,
        per_sample_mb=model.per_sample_mb,
        source=source,
        samples=samples,
    )
    return model


def save_measured(
    engine: Engine, *, adapter: str, gpu_name: str, model: MemoryModel, source: str, samples: int
) -> None:
    """Store a calibration (`plan --calibrate`), through the one writer."""
    if source != CALIBRATION:
        raise ValueError(f"only a calibration is stored as measured, not {source!r}")
    save_learnt_model(engine, adapter=adapter, gpu_name=gpu_name, calibration=(model, samples))
