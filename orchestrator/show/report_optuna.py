"""Optuna's own plots that the report adds: slice and contour of the most important parameters,
and the Pareto front of a study with several objectives; each for the page (plotly), and as a PNG
(optuna.visualization.matplotlib) but for the contour. The parameters are those the parallel
coordinates rank first: a contour of every pair of a dozen parameters is a grid nobody reads,
and costs seconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

SLICE_PARAMS = 6  # the slice plot's panels, most important parameters first
CONTOUR_PARAMS = 3  # a 3 x 3 grid at most: every pair of the three most important


def ranked_params(study: optuna.Study) -> list[str]:
    """The completed trials' parameters, most important first (as the parallel coordinates)."""
    from orchestrator.show.chart_data import completed
    from orchestrator.show.importance import MIN_TRIALS_FOR_IMPORTANCE
    from orchestrator.show.report_parallel import rank_parameters

    trials = completed(study)
    ranking = rank_parameters(study, trials, min_for_importance=MIN_TRIALS_FOR_IMPORTANCE)
    return list(ranking.names)


def slice_figure(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    import optuna.visualization as vis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vis.plot_slice(study, params=list(params[:SLICE_PARAMS]), target_name=metric)


def contour_figure(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    import optuna.visualization as vis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure = vis.plot_contour(study, params=list(params[:CONTOUR_PARAMS]), target_name=metric)
    shown = len(params[:CONTOUR_PARAMS])
    if shown > 2:  # a grid of pairs: plotly's default height squashes each to a strip
        figure.update_layout(height=280 * shown)
    return figure


def pareto_figure(study: optuna.Study, names: Sequence[str]) -> Any:
    import optuna.visualization as vis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vis.plot_pareto_front(study, target_names=list(names))


def slice_png(study: optuna.Study, params: Sequence[str], metric: str) -> Any:
    import optuna.visualization.matplotlib as mvis

    return mvis.plot_slice(study, params=list(params[:SLICE_PARAMS]), target_name=metric)


def pareto_png(study: optuna.Study, names: Sequence[str]) -> Any:
    import optuna.visualization.matplotlib as mvis

    return mvis.plot_pareto_front(study, target_names=list(names))


def contour_note(params: Sequence[str]) -> str:
    shown = list(params[:CONTOUR_PARAMS])
    return (
        f"{', '.join(shown)}: the {len(shown)} most important parameters, pair by pair "
        "(on this page only, no PNG: see orchestrator.show.report_pngs)"
    )


def slice_note(params: Sequence[str]) -> str:
    shown = len(params[:SLICE_PARAMS])
    of = f" of {len(params)}" if len(params) > shown else ""
    return f"the {shown}{of} most important parameters, in name order; each dot a completed trial"
