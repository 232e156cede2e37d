"""Optuna's own plots that the report adds: slice and contour of the most important parameters,
and the Pareto front of a study with several objectives; each for the page (plotly), and as a PNG
(optuna.visualization.matplotlib) but for the contour. The parameters are those the parallel
coordinates rank first: a contour of every pair of a dozen parameters is a grid nobody reads,
and costs seconds. On a large study both draw a sample of the completed trials (`plotted`, the
best always among them), and their notes say so: thousands of dots hide each other anyway, and
their cost grows with every trial.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.importance import MIN_TRIALS_FOR_IMPORTANCE
from orchestrator.show.queries import snapshot_study
from orchestrator.show.report.chart_data import completed
from orchestrator.show.report.parallel import rank_parameters

if TYPE_CHECKING:
    import optuna
    import optuna.visualization as vis
    import optuna.visualization.matplotlib as mvis
else:
    vis = LazyImport("optuna.visualization")
    mvis = LazyImport("optuna.visualization.matplotlib")

SLICE_PARAMS = 6  # the slice plot's panels, most important parameters first
CONTOUR_PARAMS = 3  # a 3 x 3 grid at most: every pair of the three most important
MAX_PLOTTED = 1000  # completed trials drawn in the slice and contour plots
SAMPLE_SEED = 0  # the same study gives the same sample, report after report


def sample_numbers(numbers: Sequence[int], best: int | None, limit: int = MAX_PLOTTED) -> list[int]:
    """At most `limit` of the trial `numbers`, drawn at random with a fixed seed, `best` always
    among them; all of them when there are no more than `limit` (pure)."""
    if len(numbers) <= limit:
        return sorted(numbers)
    rest = [n for n in numbers if n != best]
    keep = limit - 1 if best in numbers else limit
    chosen = random.Random(SAMPLE_SEED).sample(rest, keep)
    return sorted([*chosen, *([best] if best in numbers else [])])


def plotted(study: optuna.Study) -> tuple[optuna.Study, str | None]:
    """The study the slice and contour draw (a sample of its completed trials past
    MAX_PLOTTED) and the words that say it is a sample (None: every completed trial)."""
    trials = completed(study)
    if len(trials) <= MAX_PLOTTED:
        return study, None
    try:
        best = study.best_trial.number if len(study.directions) == 1 else None
    except ValueError:
        best = None
    keep = set(sample_numbers([t.number for t in trials], best))
    sample = snapshot_study(study, [t for t in trials if t.number in keep])
    return sample, (
        f"{len(keep):,} of the {len(trials):,} completed trials, drawn at random (the best "
        "always among them)"
    )


def ranked_params(study: optuna.Study) -> list[str]:
    """The completed trials' parameters, most important first (as the parallel coordinates)."""
    trials = completed(study)
    ranking = rank_parameters(study, trials, min_for_importance=MIN_TRIALS_FOR_IMPORTANCE)
    return list(ranking.names)


def slice_figure(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure = vis.plot_slice(study, params=list(params[:SLICE_PARAMS]), target_name=metric)
    return fit_the_page(figure)


def fit_the_page(figure: Any) -> Any:
    """Optuna draws the slice 300 px wide per parameter (1,800 px for six), wider than the
    report's page: the figure takes the page's width instead, and each panel's axis gets a few
    ticks, so that a log-scale batch size (64 to 4,096) does not print its labels into each
    other in a narrow panel."""
    figure.update_layout(width=None, autosize=True)
    for name in figure.layout:
        if name.startswith("xaxis"):
            axis = figure.layout[name]
            # Few enough labels for a narrow panel; a log axis (the batch size) as 100, 1k.
            axis.update(nticks=4, tickangle=0, automargin=True)
            if axis.type == "log":
                axis.update(tickformat="~s")
    return figure


def contour_figure(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure = vis.plot_contour(study, params=list(params[:CONTOUR_PARAMS]), target_name=metric)
    shown = len(params[:CONTOUR_PARAMS])
    if shown > 2:  # a grid of pairs: plotly's default height squashes each to a strip
        figure.update_layout(height=280 * shown)
    return figure


def pareto_figure(study: optuna.Study, names: Sequence[str]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vis.plot_pareto_front(study, target_names=list(names))


def slice_png(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    return mvis.plot_slice(study, params=list(params[:SLICE_PARAMS]), target_name=metric)


def pareto_png(study: optuna.Study, names: Sequence[str]) -> Any:
    return mvis.plot_pareto_front(study, target_names=list(names))


def contour_note(params: Sequence[str], sampled: str | None = None) -> str:
    shown = list(params[:CONTOUR_PARAMS])
    return (
        f"{', '.join(shown)}: the {len(shown)} most important parameters, pair by pair "
        "(on this page only, no PNG: drawn as one it takes about 10 s for three parameters)"
        + (f"; {sampled}" if sampled else "")
    )


def slice_note(params: Sequence[str], sampled: str | None = None) -> str:
    shown = len(params[:SLICE_PARAMS])
    of = f" of {len(params)}" if len(params) > shown else ""
    dots = f"each dot a completed trial: {sampled}" if sampled else "each dot a completed trial"
    if shown == 1 and not of:
        return f"the study's one parameter; {dots}"
    return f"the {shown}{of} most important parameters, in name order; {dots}"
