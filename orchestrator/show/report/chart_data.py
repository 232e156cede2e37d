"""What the report's charts draw, as values: the page's plotly charts and the PNGs draw the same.

Learning curves by state, the best trial's curve, the VRAM points and the memory models' lines
(with the styles that keep coinciding lines visible), the parallel coordinates' axes, and where
the slots chart ends.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.show.importance import MIN_TRIALS_FOR_IMPORTANCE
from orchestrator.show.report.parallel import axes_for, rank_parameters

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from orchestrator.show.report.parallel import Axis, ParamRanking
    from orchestrator.show.views import MemoryLine, StudyDetail, VramRow
else:
    optuna = LazyImport("optuna")

# A trial's learning curve: its number and its (epoch, value) points.
Curve = tuple[int, list[tuple[int, float]]]

CURVE_STYLES = {  # state -> (colour, dash, legend)
    "COMPLETE": ("#1f77b4", "solid", "complete"),
    "PRUNED": ("#999999", "dash", "pruned (x: where it was stopped)"),
    "FAIL": ("#d62728", "dot", "failed"),
    "RUNNING": ("#2ca02c", "dot", "running"),
}


def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def curve_groups(trials: Sequence[FrozenTrial]) -> dict[str, list[Curve]]:
    """Trials that reported a value per epoch, by state, each with its (epoch, value) points."""
    groups: dict[str, list[Curve]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.intermediate_values:
            points = sorted(trial.intermediate_values.items())
            state = trial.state.name if trial.state.name in CURVE_STYLES else "FAIL"
            groups.setdefault(state, []).append((trial.number, points))
    return groups


def best_curve(study: optuna.Study, groups: dict[str, list[Curve]]) -> Curve | None:
    """The best trial's curve, drawn on top; None before a trial completes with one."""
    try:
        number = study.best_trial.number
    except ValueError:
        return None
    return next((c for c in groups.get("COMPLETE", []) if c[0] == number), None)


def parallel_axes(study: optuna.Study, metric: str) -> tuple[ParamRanking, list[Axis]]:
    """The completed trials' parameters ranked, and the axes of the most important of them."""
    trials = completed(study)
    ranking = rank_parameters(study, trials, min_for_importance=MIN_TRIALS_FOR_IMPORTANCE)
    return ranking, axes_for(trials, ranking.shown(), metric)


def line_styles(
    lines: list[MemoryLine], *, base: float
) -> dict[tuple[str, str], tuple[float, str]]:
    """(width, legend suffix) per (gpu, source) line. Where GPUs share one memory model their lines
    coincide: the first drawn (GPUs in name order) is widest and each later one thinner on top of
    it, so every GPU's colour shows, and the legend says which line it lies on."""
    groups: list[list[MemoryLine]] = []
    for line in sorted(lines, key=lambda ln: (ln.gpu, ln.source)):
        group = next((g for g in groups if _same_line(g[0], line)), None)
        if group is None:
            groups.append([line])
        else:
            group.append(line)
    styles: dict[tuple[str, str], tuple[float, str]] = {}
    for group in groups:
        for i, line in enumerate(group):
            width = base * (1 + 1.5 * (len(group) - 1 - i))
            suffix = f", on the same line as {group[0].gpu}" if i else ""
            styles[(line.gpu, line.source)] = (width, suffix)
    return styles


def _same_line(a: MemoryLine, b: MemoryLine) -> bool:
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 0.005 * max(abs(x), abs(y)) + 1e-9

    return (
        a.source == b.source
        and close(a.model_overhead_mb, b.model_overhead_mb)
        and close(a.per_sample_mb, b.per_sample_mb)
    )


def vram_points(detail: StudyDetail) -> list[VramRow]:
    """Trials to plot: those with a batch size and a place on the VRAM axis (see point_mb)."""
    return [r for r in detail.vram if r.batch_size is not None and point_mb(r) is not None]


def point_mb(row: VramRow) -> float | None:
    """Where a trial sits on the VRAM axis: its measured peak; an OOM'd one at its planned MB.

    An OOM'd trial's recorded peak is only how far it got before the allocation that failed;
    what it asked for is the planned MB, which is what the legend and the docs promise.
    """
    return row.planned_mb if row.oom else row.vram_peak_mb


def line_span(rows: list[VramRow]) -> list[float]:
    """Batch sizes to draw a memory model at: evenly spaced on the log axis the chart uses."""
    low = min(r.batch_size for r in rows)
    high = max(r.batch_size for r in rows)
    if low == high:
        low, high = low / 2, high * 2
    steps = 40
    return [low * (high / low) ** (i / steps) for i in range(steps + 1)]


def last_time(detail: StudyDetail) -> dt.datetime | None:
    """Where the slots chart ends: the last change, OOM or sign of a worker."""
    times = [e.at for e in detail.concurrency_events] + [o.at for o in detail.ooms if o.at]
    times += [w.stopped_at or w.last_seen for w in detail.workers]
    return max(times) if times else None
