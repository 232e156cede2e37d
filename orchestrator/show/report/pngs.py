"""The report's charts as PNGs (matplotlib, Agg): one file per chart the page drew, to paste
into a document or look at without a browser. `optuna.visualization.matplotlib` draws the history
and the importances, slice and Pareto front; the rest are drawn here from the same values as the
page's charts. The contour is on the page only: optuna's matplotlib contour interpolates every
pair on a grid, about 10 s for three parameters and two dozen trials, most of the report's time."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.importance import importance_evaluator
from orchestrator.show.report import optuna_plots as plots
from orchestrator.show.report import timeline
from orchestrator.show.report.chart_data import (
    CURVE_STYLES,
    best_curve,
    curve_groups,
    last_time,
    line_span,
    line_styles,
    parallel_axes,
    point_mb,
    vram_points,
)
from orchestrator.show.report.charts import timeline_end
from orchestrator.show.report.gpu_timeline import trial_lanes
from orchestrator.show.report.parallel import matplotlib_parallel
from orchestrator.show.views import slot_series

if TYPE_CHECKING:
    import matplotlib
    import matplotlib.collections as mcoll
    import matplotlib.pyplot as plt
    import numpy as np
    import optuna
    import optuna.visualization.matplotlib as mvis

    from orchestrator.show.report.charts import Chart
    from orchestrator.show.views import StudyDetail
else:
    matplotlib = LazyImport("matplotlib")
    mcoll = LazyImport("matplotlib.collections")
    plt = LazyImport("matplotlib.pyplot")
    np = LazyImport("numpy")
    mvis = LazyImport("optuna.visualization.matplotlib")


def write_pngs(
    study: optuna.Study,
    detail: StudyDetail,
    charts: list[Chart],
    out_dir: Path,
    metric: str = "value",
    names: list[str] | None = None,
) -> list[Path]:
    matplotlib.use("Agg")

    drawn = {chart.key for chart in charts if chart.figure is not None}
    shared = {chart.key: chart.data for chart in charts if chart.data is not None}
    makers = {
        "history": lambda: mvis.plot_optimization_history(study, target_name=metric),
        "curves": lambda: _curves_axes(study, metric),
        "importances": lambda: mvis.plot_param_importances(
            study, evaluator=importance_evaluator(), target_name=metric
        ),
        "parallel": lambda: _parallel_axes(study, metric),
        "slice": lambda: plots.slice_png(
            plots.plotted(study)[0], plots.ranked_params(study), metric
        ),
        "pareto": lambda: plots.pareto_png(study, names or [metric]),
        "timeline": lambda: timeline.timeline_axes(
            shared["timeline"][0] if "timeline" in shared else _lanes(study, detail)[0]
        ),
        "memory": lambda: timeline.memory_axes(*shared.get("memory") or _gpu_lanes(study, detail)),
        "vram": lambda: _vram_axes(detail),
        "slots": lambda: _slots_axes(detail),
    }
    paths = []
    for key, make in makers.items():
        if key not in drawn:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            axes = make()
        figure = _figure_of(axes)
        if key not in SIZED_BY_THEIR_CONTENT:
            wide = key == "parallel"
            figure.set_size_inches(11 if wide else 9, 5.5 if wide else 5)
        with warnings.catch_warnings():  # optuna's contour and slice grids refuse it politely
            warnings.simplefilter("ignore")
            figure.tight_layout()
        path = out_dir / f"{key}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths


# Their height follows what they hold: a row per trial at once, a panel per parameter.
SIZED_BY_THEIR_CONTENT = {"timeline", "slice"}


def _lanes(study: optuna.Study, detail: StudyDetail) -> tuple[list, Any]:
    trials = study.get_trials(deepcopy=False)
    until = timeline_end(trials, detail)
    return trial_lanes(trials, until), until


def _gpu_lanes(study: optuna.Study, detail: StudyDetail) -> tuple[list, list, Any]:
    lanes, until = _lanes(study, detail)
    return [lane for lane in lanes if lane.gpu_name != "cpu"], detail.concurrency_events, until


def _figure_of(axes: Any) -> Any:
    if isinstance(axes, np.ndarray):  # parallel coordinates may hand back several axes
        axes = axes.flat[0]
    return axes.figure


def _curves_axes(study: optuna.Study, metric: str) -> Any:
    figure, ax = plt.subplots()
    groups = curve_groups(study.get_trials(deepcopy=False))
    for state, curves in groups.items():
        colour, dash, legend = CURVE_STYLES[state]
        style = {"solid": "-", "dash": "--", "dot": ":"}[dash]
        # One collection a state, not a line a trial (a study may hold thousands).
        ax.add_collection(
            mcoll.LineCollection(
                [points for _, points in curves],
                colors=colour,
                linestyles=style,
                linewidths=1.2,
                alpha=0.8,
                label=legend,
            )
        )
        ax.autoscale_view()
        if state == "PRUNED":
            ends = [points[-1] for _, points in curves]
            ax.scatter(*zip(*ends, strict=True), marker="x", color="#555555", zorder=3)
    best = best_curve(study, groups)
    if best is not None:
        number, points = best
        ax.plot(*zip(*points, strict=True), color="#ff7f0e", linewidth=2.5, label=f"best #{number}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title("Learning curves")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small", loc="upper right")  # "best" searches every point: seconds
    return ax


def _parallel_axes(study: optuna.Study, metric: str) -> Any:
    _, axes = parallel_axes(study, metric)
    return matplotlib_parallel(axes, metric=metric, reverse=study.direction.name == "MINIMIZE")


def _vram_axes(detail: StudyDetail) -> Any:
    figure, ax = plt.subplots()
    rows = vram_points(detail)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    gpus = sorted({r.gpu for r in rows})
    styles = line_styles([ln for ln in detail.memory_lines if ln.gpu in gpus], base=1.5)
    for i, gpu in enumerate(gpus):
        colour = colours[i % len(colours)]
        mine = [r for r in rows if r.gpu == gpu]
        fine = [r for r in mine if not r.oom]
        ooms = [r for r in mine if r.oom]
        if fine:
            ax.scatter(
                [r.batch_size for r in fine],
                [r.vram_peak_mb for r in fine],
                color=colour,
                label=f"{gpu} peak",
            )
        if ooms:
            ax.scatter(
                [r.batch_size for r in ooms],
                [point_mb(r) for r in ooms],
                color=colour,
                marker="x",
                s=80,
                label=f"{gpu} OOM (at planned MB)",
            )
        xs = line_span(mine)
        for line in (ln for ln in detail.memory_lines if ln.gpu == gpu):
            style = "-" if line.source == "plan" else "--"
            width, same_as = styles[(line.gpu, line.source)]
            ax.plot(
                xs,
                [line.at(x) for x in xs],
                style,
                color=colour,
                linewidth=width,
                label=f"{gpu} memory model ({line.source}){same_as}",
            )
    ax.set_xscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("VRAM (MB)")
    ax.set_title("Batch size vs peak VRAM per GPU")
    ax.legend(fontsize="small", loc="upper right")  # "best" searches every point: seconds
    return ax


def _slots_axes(detail: StudyDetail) -> Any:
    figure, ax = plt.subplots()
    for s in slot_series(detail.concurrency_events, until=last_time(detail)):
        ax.step(s.times, s.slots, where="post", label=s.label)
    ooms = [o for o in detail.ooms if o.at is not None]
    if ooms:
        ax.scatter(
            [o.at for o in ooms],
            [o.concurrency or 1 for o in ooms],
            marker="x",
            s=80,
            color="crimson",
            label="OOM",
            zorder=3,
        )
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("trials at once")
    ax.set_title("Slots over time, with OOMs")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small", loc="upper right")  # "best" searches every point: seconds
    figure.autofmt_xdate()
    return ax
