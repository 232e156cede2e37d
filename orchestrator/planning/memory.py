"""Which memory model plans an adapter on a GPU: the adapter's declared guess, or what was measured.

A measured model is a straight line, peak VRAM = overhead + per_sample x batch_size, fitted to
(batch size, peak MB) points from `plan --calibrate` or from finished trials' `orch_trial_vram`
rows, and stored per (adapter, GPU name) in `orch_memory_models`. Where one exists for a GPU's
name, plans use it and say so. The fitting and the choice are pure; reading and writing the
storage are the small functions at the bottom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import MemoryModel

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from orchestrator.record.records import MeasuredMemoryModel

DECLARED = "declared"
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


# --- the storage ---------------------------------------------------------------------------


def existing_engine(url: str) -> Engine | None:
    """An engine on the storage if it already holds our tables; None if there is nothing to read.

    An SQLite file that is not there means "no measurements": planning never creates a database.
    """
    import sqlalchemy as sa
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.record.records import memory_models
    from orchestrator.record.storage import engine_kwargs
    from orchestrator.record.storage_failures import unreachable
    from orchestrator.record.storage_url import is_sqlite, normalize_url, sqlite_path

    if is_sqlite(url):
        path = sqlite_path(url)
        if path is None or not path.is_file():
            return None
    url = normalize_url(url)
    engine = sa.create_engine(url, **engine_kwargs(url))
    try:
        if not sa.inspect(engine).has_table(memory_models.name):
            engine.dispose()
            return None
    except SQLAlchemyError as error:
        engine.dispose()
        raise unreachable(url, error) from None
    return engine


def measured_models(
    url: str, adapter: str, declared: MemoryModel, gpu_names: Iterable[str]
) -> dict[str, tuple[MemoryModel, str]]:
    """GPU name -> (model, source) for every named GPU that has a measured model in the storage."""
    from orchestrator.record.records import load_memory_model

    names = sorted(set(gpu_names))
    if not names:
        return {}
    engine = existing_engine(url)
    if engine is None:
        return {}
    try:
        found = {}
        for name in names:
            measured = load_memory_model(engine, adapter=adapter, gpu_name=name)
            if measured is not None:
                found[name] = choose_memory_model(declared, measured)
        return found
    finally:
        engine.dispose()


def save_measured(
    engine: Engine, *, adapter: str, gpu_name: str, model: MemoryModel, source: str, samples: int
) -> None:
    from orchestrator.record.records import save_memory_model

    save_memory_model(
        engine,
        adapter=adapter,
        gpu_name=gpu_name,
        model_overhead_mb=model.model_overhead_mb,
        per_sample_mb=model.per_sample_mb,
        source=source,
        samples=samples,
    )


def refine_from_trials(
    engine: Engine,
    *,
    adapter: str,
    gpu_name: str,
    study_names: Sequence[str],
    min_samples: int = MIN_TRIAL_SAMPLES,
) -> MemoryModel | None:
    """Fit the adapter's model on `gpu_name` to its studies' finished trials and store it.

    Returns the stored model, or None (storing nothing) while the trials say too little: fewer
    than `min_samples` measured trials, or all at one batch size. Measurements from real trials,
    run beside each other as a study runs them, replace an earlier calibration.
    """
    from orchestrator.record.records import list_trial_vram

    rows: list[dict[str, Any]] = []
    for study_name in study_names:
        rows.extend(list_trial_vram(engine, study_name))
    fitted = fit_from_trials(rows, gpu_name, min_samples=min_samples)
    if fitted is None:
        return None
    model, samples = fitted
    save_measured(
        engine, adapter=adapter, gpu_name=gpu_name, model=model, source="trials", samples=samples
    )
    return model
