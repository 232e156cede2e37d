"""The report page's interactive charts (plotly), every axis named by the adapter's metric.

Optimisation history and parameter importances from `optuna.visualization`, then our own:
learning curves (the value per epoch of every trial, pruned ones marked), parallel coordinates of
the most important parameters (orchestrator.show.report.parallel), batch size against peak VRAM
per kind of GPU beside the memory model's line, and slots over time per GPU with the OOMs marked.
A chart with nothing to draw is a note saying why.
"""

from __future__ import annotations

import datetime as dt
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.importance import (
    MIN_TRIALS_FOR_IMPORTANCE,
    importance_evaluator,
    importance_note,
)
from orchestrator.show.report import optuna_plots as plots
from orchestrator.show.report import timeline
from orchestrator.show.report.chart_data import (
    CURVE_STYLES,
    best_curve,
    completed,
    curve_groups,
    last_time,
    line_span,
    line_styles,
    parallel_axes,
    point_mb,
    vram_points,
)
from orchestrator.show.report.gpu_timeline import cpu_only_note, trial_lanes
from orchestrator.show.report.parallel import plotly_parallel
from orchestrator.show.text import plural, to_utc
from orchestrator.show.views import slot_series

if TYPE_CHECKING:
    import optuna
    import optuna.visualization as vis
    import plotly.colors as plotly_colors
    import plotly.graph_objects as go

    from orchestrator.show.views import MemoryLine, StudyDetail, VramRow
else:
    vis = LazyImport("optuna.visualization")
    plotly_colors = LazyImport("plotly.colors")
    go = LazyImport("plotly.graph_objects")


@dataclass(frozen=True)
class Chart:
    key: str  # file stem of its PNG
    title: str
    figure: Any | None  # a plotly Figure, or None when there is nothing to draw
    note: str = ""  # why it is missing, or what to read in it
    data: Any = None  # the values it is drawn from, for its PNG to draw the same (when shared)


def plotly_charts(
    study: optuna.Study,
    detail: StudyDetail,
    metric: str = "value",
    names: list[str] | None = None,
) -> list[Chart]:
    """Every chart of the page, in its order; `names`: what each objective is called."""
    names = names or [metric]
    if len(study.directions) > 1:
        charts = objective_charts_of_several(study, names)
    else:
        charts = objective_charts(study, metric)
    return charts + gpu_charts(study, detail) + [vram_chart(detail), slots_chart(detail)]


def objective_charts(study: optuna.Study, metric: str) -> list[Chart]:
    """History, learning curves, importances, parallel coordinates, slice and contour."""
    done = len(completed(study))
    if done == 0:
        none = "no completed trial yet"
        return [
            Chart("history", "Optimisation history", None, none),
            curves_chart(study, metric),
            *(Chart(key, title, None, none) for key, title in SEARCH_CHARTS),
        ]
    charts = [
        Chart("history", "Optimisation history",
              vis.plot_optimization_history(study, target_name=metric)),
        curves_chart(study, metric),
    ]  # fmt: skip
    if done < MIN_TRIALS_FOR_IMPORTANCE:
        charts.append(Chart("importances", "Parameter importances", None, importance_note(done)))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            figure = vis.plot_param_importances(
                study, evaluator=importance_evaluator(), target_name=metric
            )
        charts.append(Chart("importances", "Parameter importances", figure, "PED-ANOVA"))
    charts.append(parallel_chart(study, metric))
    params = plots.ranked_params(study)
    if not params:
        charts.append(Chart("slice", "Slice", None, "the completed trials have no parameters"))
    drawn, sampled = plots.plotted(study)
    if params:
        figure = plots.slice_figure(drawn, params, metric)
        charts.append(Chart("slice", "Slice", figure, plots.slice_note(params, sampled)))
    if len(params) < 2:
        charts.append(Chart("contour", "Contour", None, "a contour needs two parameters"))
    else:
        figure = plots.contour_figure(drawn, params, metric)
        charts.append(Chart("contour", "Contour", figure, plots.contour_note(params, sampled)))
    return charts


SEARCH_CHARTS = (  # the charts of the search that need completed trials: (key, title)
    ("importances", "Parameter importances"),
    ("parallel", "Parallel coordinates"),
    ("slice", "Slice"),
    ("contour", "Contour"),
)


def objective_charts_of_several(study: optuna.Study, names: list[str]) -> list[Chart]:
    """Several objectives: their Pareto front; the one-value charts say why they are missing."""
    title = "Pareto front"
    if not completed(study):
        front = Chart("pareto", title, None, "no completed trial yet")
    else:
        note = f"{' against '.join(names)}; the front: trials no other trial beats on every one"
        front = Chart("pareto", title, plots.pareto_figure(study, names), note)
    why = f"{len(names)} objectives ({', '.join(names)}): no single value to chart"
    why += "; see the Pareto front"
    return [front] + [
        Chart(key, title, None, why)
        for key, title in (("history", "Optimisation history"), *SEARCH_CHARTS)
    ]


def gpu_charts(study: optuna.Study, detail: StudyDetail) -> list[Chart]:
    """The trials on each GPU over time, and the memory they held there."""
    trials = study.get_trials(deepcopy=False)
    until = timeline_end(trials, detail)
    lanes = trial_lanes(trials, until)
    title = "Trials on each GPU over time"
    if not lanes:
        return [
            Chart("timeline", title, None, "no trial has run on a device yet"),
            Chart("memory", "GPU memory held over time", None, "no trial has run on a device yet"),
        ]
    figure = timeline.timeline_figure(lanes)
    charts = [Chart("timeline", title, figure, timeline.TIMELINE_NOTE, data=(lanes, until))]
    drawn, note = timeline.memory_note(lanes)
    gpu_lanes = [lane for lane in lanes if lane.gpu_name != "cpu"]
    figure = timeline.memory_figure(gpu_lanes, detail.concurrency_events, until) if drawn else None
    memory = (gpu_lanes, detail.concurrency_events, until)
    charts.append(Chart("memory", "GPU memory held over time", figure, note, data=memory))
    return charts


def timeline_end(trials: list, detail: StudyDetail) -> dt.datetime:
    """Where the timelines end: now while a trial runs, else the last end or sign of a worker."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    if any(t.state.name == "RUNNING" for t in trials):
        return now
    ends = [to_utc(t.datetime_complete) for t in trials if t.datetime_complete is not None]
    last = last_time(detail)
    return max([*ends, *([last] if last else [])], default=now)


def parallel_chart(study: optuna.Study, metric: str) -> Chart:
    title = "Parallel coordinates"
    ranking, axes = parallel_axes(study, metric)
    if not ranking.names:
        return Chart("parallel", title, None, "the completed trials have no parameters")
    reverse = study.direction.name == "MINIMIZE"
    figure = plotly_parallel(axes, metric=metric, reverse=reverse)
    return Chart("parallel", title, figure, ranking.note())


def curves_chart(study: optuna.Study, metric: str) -> Chart:
    title = "Learning curves"
    groups = curve_groups(study.get_trials(deepcopy=False))
    if not groups:
        return Chart("curves", title, None, "no trial has reported a value per epoch yet")
    figure = go.Figure()
    for state, curves in groups.items():
        colour, dash, legend = CURVE_STYLES[state]
        xs: list = []
        ys: list = []
        text: list = []
        for number, points in curves:  # one trace per state: gaps (None) between trials
            xs += [step for step, _ in points] + [None]
            ys += [value for _, value in points] + [None]
            text += [f"trial #{number}"] * len(points) + [None]
        figure.add_trace(
            go.Scatter(
                x=xs, y=ys, text=text, mode="lines", name=legend,
                line={"color": colour, "dash": dash, "width": 1.5}, connectgaps=False,
            )
        )  # fmt: skip
        if state == "PRUNED":
            ends = [points[-1] for _, points in curves]
            figure.add_trace(
                go.Scatter(
                    x=[step for step, _ in ends], y=[value for _, value in ends],
                    text=[f"trial #{number} pruned" for number, _ in curves], mode="markers",
                    marker={"symbol": "x", "size": 9, "color": "#555555"}, name="pruned here",
                )
            )  # fmt: skip
    best = best_curve(study, groups)
    if best is not None:
        number, points = best
        figure.add_trace(
            go.Scatter(
                x=[step for step, _ in points], y=[value for _, value in points], mode="lines",
                line={"color": "#ff7f0e", "width": 3}, name=f"best trial #{number}",
            )
        )  # fmt: skip
    figure.update_layout(title=title, xaxis_title="epoch", yaxis_title=metric)
    pruned = len(groups.get("PRUNED", []))
    return Chart("curves", title, figure, f"{metric} per epoch of every trial; {pruned} pruned")


def vram_chart(detail: StudyDetail) -> Chart:
    title = "Batch size vs peak VRAM per GPU"
    rows = vram_points(detail)
    if not rows:
        return Chart("vram", title, None, no_vram_note(detail))
    figure = go.Figure()
    palette = _palette()
    gpus = sorted({r.gpu for r in rows})
    styles = line_styles([ln for ln in detail.memory_lines if ln.gpu in gpus], base=2.0)
    for i, gpu in enumerate(gpus):
        colour = palette[i % len(palette)]
        mine = [r for r in rows if r.gpu == gpu]
        _add_vram_points(figure, gpu, colour, mine)
        xs = line_span(mine)
        for line in (ln for ln in detail.memory_lines if ln.gpu == gpu):
            _add_memory_line(figure, line, colour, xs, styles[(line.gpu, line.source)])
    figure.update_layout(
        title=title, xaxis_title="batch size", yaxis_title="VRAM (MB)", xaxis_type="log"
    )
    return Chart(
        "vram",
        title,
        figure,
        "points: measured peak per trial (an OOM at what it was planned to use); "
        "lines: the memory model the trials were planned with, and the one measured from them",
    )


def no_vram_note(detail: StudyDetail) -> str:
    """Why there is no VRAM to show: a CPU-only study has none to record."""
    return cpu_only_note(detail.vram) or "no trial has recorded its VRAM yet"


def _add_vram_points(figure: Any, gpu: str, colour: str, mine: list[VramRow]) -> None:
    fine = [r for r in mine if not r.oom]
    ooms = [r for r in mine if r.oom]
    for group, symbol, what in ((fine, "circle", "peak"), (ooms, "x", "OOM (at planned MB)")):
        if group:
            figure.add_trace(
                go.Scatter(
                    x=[r.batch_size for r in group],
                    y=[point_mb(r) for r in group],
                    mode="markers",
                    marker={
                        "color": colour,
                        "symbol": symbol,
                        "size": 10 if group is ooms else 8,
                    },
                    name=f"{gpu} {what}",
                    text=[_hover(r) for r in group],
                )
            )


def _add_memory_line(
    figure: Any, line: MemoryLine, colour: str, xs: list[float], style: tuple[float, str]
) -> None:
    width, same_as = style
    figure.add_trace(
        go.Scatter(
            x=xs,
            y=[line.at(x) for x in xs],
            mode="lines",
            line={
                "color": colour,
                "dash": "solid" if line.source == "plan" else "dash",
                "width": width,
            },
            name=f"{line.gpu} memory model ({line.source}){same_as}",
        )
    )


def slots_chart(detail: StudyDetail) -> Chart:
    title = "Slots over time, with OOMs"
    series = slot_series(detail.concurrency_events, until=last_time(detail))
    if not series and not detail.ooms:
        return Chart("slots", title, None, "no concurrency changes recorded")
    figure = go.Figure()
    for s in series:
        figure.add_trace(
            go.Scatter(
                x=s.times, y=s.slots, mode="lines", line_shape="hv", name=s.label, text=s.reasons
            )
        )
    ooms = [o for o in detail.ooms if o.at is not None]
    if ooms:
        figure.add_trace(
            go.Scatter(
                x=[o.at for o in ooms],
                y=[o.concurrency or 1 for o in ooms],
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": "crimson"},
                name="OOM",
                text=[f"trial #{o.trial}, batch {o.batch_size}, {o.gpu}" for o in ooms],
            )
        )
    figure.update_layout(title=title, xaxis_title="time (UTC)", yaxis_title="trials at once")
    return Chart("slots", title, figure)


def _hover(row: VramRow) -> str:
    at_once = "" if row.concurrency is None else f", {plural(row.concurrency, 'trial')} at once"
    return f"trial #{row.trial}{at_once}"


def _palette() -> list[str]:
    return list(plotly_colors.qualitative.Plotly)
