"""A study's report: one self-contained HTML page (plotly.js inline, opens with no network) and PNGs.

Charts, every axis named by the adapter's metric: optimisation history and parameter importances
from `optuna.visualization` (and `optuna.visualization.matplotlib` for the PNGs), then our own:
learning curves (the value per epoch of every trial, pruned ones marked), parallel coordinates of
the most important parameters (orchestrator.show.report_parallel), batch size against peak VRAM per kind
of GPU beside the memory model's line, and slots over time per GPU with the OOMs marked. Below
them, every trial in a sortable table, also written as trials.csv (orchestrator.show.report_trials).
"""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna

    from orchestrator.show.views import StudyDetail

# Importances need enough completed trials to say anything; below this the chart is a note.
MIN_TRIALS_FOR_IMPORTANCE = 8
PAGE_NAME = "index.html"


@dataclass(frozen=True)
class Chart:
    key: str  # file stem of its PNG
    title: str
    figure: Any | None  # a plotly Figure, or None when there is nothing to draw
    note: str = ""  # why it is missing, or what to read in it


@dataclass(frozen=True)
class ReportFiles:
    page: Path
    pngs: list[Path]
    notes: list[str]
    csv: Path | None = None


def study_metric(study: optuna.Study) -> str:
    """What the study's value is, in the adapter's words; "value" when the adapter is unknown here."""
    from adapters import metric_name
    from orchestrator.record.study import load_spec

    spec = load_spec(study)
    if spec is None:
        return "value"
    try:
        return metric_name(spec.resolve_adapter(), spec.options)
    except Exception:  # an adapter not installed on this machine, or one that fails to import
        return "value"


def write_report(
    study: optuna.Study, detail: StudyDetail, out_dir: Path, *, metric: str | None = None
) -> ReportFiles:
    """Write index.html, one PNG per drawn chart and trials.csv into out_dir (created if missing)."""
    from orchestrator.show.report_trials import CSV_NAME, trial_table, write_csv

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(
            f"cannot write the report to {out_dir}: {error.strerror or error}; "
            "choose a writable directory with --out"
        ) from None
    metric = metric or study_metric(study)
    charts = plotly_charts(study, detail, metric)
    pngs = write_pngs(study, detail, charts, out_dir, metric)
    table = trial_table(study.get_trials(deepcopy=False), metric)
    csv = write_csv(table, out_dir / CSV_NAME)
    page = out_dir / PAGE_NAME
    page.write_text(render_page(detail, charts, pngs, table, csv), encoding="utf-8")
    notes = [f"{chart.title}: {chart.note}" for chart in charts if chart.figure is None]
    return ReportFiles(page=page, pngs=pngs, notes=notes, csv=csv)


def completed_count(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def importance_evaluator():  # noqa: ANN201
    # PED-ANOVA needs no scikit-learn (fANOVA, Optuna's default, does).
    from optuna.importance import PedAnovaImportanceEvaluator

    return PedAnovaImportanceEvaluator(target_quantile=0.25)


# --- plotly charts (the page) ------------------------------------------------------------------


def plotly_charts(study: optuna.Study, detail: StudyDetail, metric: str = "value") -> list[Chart]:
    import optuna.visualization as vis

    done = completed_count(study)
    charts: list[Chart] = []
    if done == 0:
        none = "no completed trial yet"
        charts.append(Chart("history", "Optimisation history", None, none))
        charts.append(curves_chart(study, metric))
        charts.append(Chart("importances", "Parameter importances", None, none))
        charts.append(Chart("parallel", "Parallel coordinates", None, none))
    else:
        history = vis.plot_optimization_history(study, target_name=metric)
        charts.append(Chart("history", "Optimisation history", history))
        charts.append(curves_chart(study, metric))
        if done < MIN_TRIALS_FOR_IMPORTANCE:
            charts.append(
                Chart("importances", "Parameter importances", None, importance_note(done))
            )
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                figure = vis.plot_param_importances(
                    study, evaluator=importance_evaluator(), target_name=metric
                )
            charts.append(Chart("importances", "Parameter importances", figure, "PED-ANOVA"))
        charts.append(parallel_chart(study, metric))
    charts.append(vram_chart(detail))
    charts.append(slots_chart(detail))
    return charts


def _completed(study: optuna.Study) -> list:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def parallel_chart(study: optuna.Study, metric: str) -> Chart:
    from orchestrator.show.report_parallel import axes_for, plotly_parallel, rank_parameters

    title = "Parallel coordinates"
    trials = _completed(study)
    ranking = rank_parameters(study, trials, min_for_importance=MIN_TRIALS_FOR_IMPORTANCE)
    if not ranking.names:
        return Chart("parallel", title, None, "the completed trials have no parameters")
    axes = axes_for(trials, ranking.shown(), metric)
    reverse = study.direction.name == "MINIMIZE"
    figure = plotly_parallel(axes, metric=metric, reverse=reverse)
    return Chart("parallel", title, figure, ranking.note())


# --- learning curves ---------------------------------------------------------------------------

CURVE_STYLES = {  # state -> (colour, dash, legend)
    "COMPLETE": ("#1f77b4", "solid", "complete"),
    "PRUNED": ("#999999", "dash", "pruned (x: where it was stopped)"),
    "FAIL": ("#d62728", "dot", "failed"),
    "RUNNING": ("#2ca02c", "dot", "running"),
}


def curve_groups(trials: list) -> dict[str, list]:
    """Trials that reported a value per epoch, by state, each with its (epoch, value) points."""
    groups: dict[str, list] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.intermediate_values:
            points = sorted(trial.intermediate_values.items())
            state = trial.state.name if trial.state.name in CURVE_STYLES else "FAIL"
            groups.setdefault(state, []).append((trial.number, points))
    return groups


def curves_chart(study: optuna.Study, metric: str) -> Chart:
    import plotly.graph_objects as go

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
    best = _best_curve(study, groups)
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


def _best_curve(study: optuna.Study, groups: dict[str, list]):  # noqa: ANN202
    try:
        number = study.best_trial.number
    except ValueError:
        return None
    return next((c for c in groups.get("COMPLETE", []) if c[0] == number), None)


def importance_note(done: int) -> str:
    from orchestrator.show.text import plural

    return (
        f"skipped: {plural(done, 'completed trial')}, "
        f"importances need at least {MIN_TRIALS_FOR_IMPORTANCE}"
    )


def vram_chart(detail: StudyDetail) -> Chart:
    import plotly.graph_objects as go

    title = "Batch size vs peak VRAM per GPU"
    rows = vram_points(detail)
    if not rows:
        return Chart("vram", title, None, "no trial has recorded its VRAM yet")
    figure = go.Figure()
    palette = _palette()
    gpus = sorted({r.gpu for r in rows})
    styles = line_styles([ln for ln in detail.memory_lines if ln.gpu in gpus], base=2.0)
    for i, gpu in enumerate(gpus):
        colour = palette[i % len(palette)]
        mine = [r for r in rows if r.gpu == gpu]
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
        xs = _line_span(mine)
        for line in (ln for ln in detail.memory_lines if ln.gpu == gpu):
            width, same_as = styles[(line.gpu, line.source)]
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
                    name=f"{gpu} memory model ({line.source}){same_as}",
                )
            )
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


def line_styles(lines: list, *, base: float) -> dict[tuple[str, str], tuple[float, str]]:
    """(width, legend suffix) per (gpu, source) line. Where GPUs share one memory model their lines
    coincide: the first drawn (GPUs in name order) is widest and each later one thinner on top of
    it, so every GPU's colour shows, and the legend says which line it lies on."""
    groups: list[list] = []
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


def _same_line(a, b) -> bool:  # noqa: ANN001
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 0.005 * max(abs(x), abs(y)) + 1e-9

    return (
        a.source == b.source
        and close(a.model_overhead_mb, b.model_overhead_mb)
        and close(a.per_sample_mb, b.per_sample_mb)
    )


def vram_points(detail: StudyDetail) -> list:
    """Trials to plot: those with a batch size and a place on the VRAM axis (see point_mb)."""
    return [r for r in detail.vram if r.batch_size is not None and point_mb(r) is not None]


def point_mb(row) -> float | None:  # noqa: ANN001
    """Where a trial sits on the VRAM axis: its measured peak; an OOM'd one at its planned MB.

    An OOM'd trial's recorded peak is only how far it got before the allocation that failed;
    what it asked for is the planned MB, which is what the legend and the docs promise.
    """
    return row.planned_mb if row.oom else row.peak_mb


def slots_chart(detail: StudyDetail) -> Chart:
    import plotly.graph_objects as go

    from orchestrator.show.views import slot_series

    title = "Slots over time, with OOMs"
    series = slot_series(detail.concurrency_events, until=_last_time(detail))
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


def _hover(row) -> str:  # noqa: ANN001
    from orchestrator.show.text import plural

    at_once = "" if row.concurrency is None else f", {plural(row.concurrency, 'trial')} at once"
    return f"trial #{row.trial}{at_once}"


def _line_span(rows: list) -> list[float]:
    """Batch sizes to draw a memory model at: evenly spaced on the log axis the chart uses."""
    low = min(r.batch_size for r in rows)
    high = max(r.batch_size for r in rows)
    if low == high:
        low, high = low / 2, high * 2
    steps = 40
    return [low * (high / low) ** (i / steps) for i in range(steps + 1)]


def _last_time(detail: StudyDetail):  # noqa: ANN202
    times = [e.at for e in detail.concurrency_events] + [o.at for o in detail.ooms if o.at]
    times += [w.stopped_at or w.last_seen for w in detail.workers]
    return max(times) if times else None


def _palette() -> list[str]:
    import plotly.colors

    return list(plotly.colors.qualitative.Plotly)


# --- PNGs (matplotlib, Agg) ------------------------------------------------------------------


def write_pngs(
    study: optuna.Study,
    detail: StudyDetail,
    charts: list[Chart],
    out_dir: Path,
    metric: str = "value",
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as mvis

    drawn = {chart.key for chart in charts if chart.figure is not None}
    makers = {
        "history": lambda: mvis.plot_optimization_history(study, target_name=metric),
        "curves": lambda: _curves_axes(study, metric),
        "importances": lambda: mvis.plot_param_importances(
            study, evaluator=importance_evaluator(), target_name=metric
        ),
        "parallel": lambda: _parallel_axes(study, metric),
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
        figure.set_size_inches(11 if key == "parallel" else 9, 5.5 if key == "parallel" else 5)
        figure.tight_layout()
        path = out_dir / f"{key}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths


def _figure_of(axes: Any) -> Any:
    import numpy as np

    if isinstance(axes, np.ndarray):  # parallel coordinates may hand back several axes
        axes = axes.flat[0]
    return axes.figure


def _curves_axes(study: optuna.Study, metric: str) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    figure, ax = plt.subplots()
    groups = curve_groups(study.get_trials(deepcopy=False))
    for state, curves in groups.items():
        colour, dash, legend = CURVE_STYLES[state]
        style = {"solid": "-", "dash": "--", "dot": ":"}[dash]
        # One collection a state, not a line a trial (a study may hold thousands).
        ax.add_collection(
            LineCollection(
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
    best = _best_curve(study, groups)
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
    from orchestrator.show.report_parallel import axes_for, matplotlib_parallel, rank_parameters

    trials = _completed(study)
    ranking = rank_parameters(study, trials, min_for_importance=MIN_TRIALS_FOR_IMPORTANCE)
    axes = axes_for(trials, ranking.shown(), metric)
    return matplotlib_parallel(axes, metric=metric, reverse=study.direction.name == "MINIMIZE")


def _vram_axes(detail: StudyDetail) -> Any:
    import matplotlib.pyplot as plt

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
                [r.peak_mb for r in fine],
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
        xs = _line_span(mine)
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
    import matplotlib.pyplot as plt

    from orchestrator.show.views import slot_series

    figure, ax = plt.subplots()
    for s in slot_series(detail.concurrency_events, until=_last_time(detail)):
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


# --- the page ----------------------------------------------------------------------------------


def render_page(
    detail: StudyDetail,
    charts: list[Chart],
    pngs: list[Path],
    table: Any = None,
    csv: Path | None = None,
) -> str:
    """The HTML page: a summary, the best parameters, each chart (plotly.js inline once), then
    every trial in a table that sorts by the column clicked."""
    from orchestrator.show.report_trials import SORT_SCRIPT, table_html
    from orchestrator.show.text import mb_text

    esc = html.escape
    png_names = {p.stem: p.name for p in pngs}
    budget = "?" if detail.budget is None else str(detail.budget)
    states = ", ".join(f"{state} {n}" for state, n in detail.states.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Study {esc(detail.name)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}"
        ".note{color:#666;font-style:italic}"
        "table.trials{font-size:13px}table.trials th{cursor:pointer;background:#f4f4f4}"
        "table.trials td,table.trials th{white-space:nowrap}.wide{overflow-x:auto}"
        "table.trials th[aria-sort=ascending]::after{content:' \\25B2'}"
        "table.trials th[aria-sort=descending]::after{content:' \\25BC'}</style>",
        "</head><body>",
        f"<h1>Study {esc(detail.name)}</h1>",
        f"<p>Adapter <b>{esc(detail.adapter or '?')}</b>, {esc(detail.direction)}, "
        f"{detail.counted}/{budget} trials counted ({esc(states)}).</p>",
    ]
    if detail.best is not None:
        rows = "".join(
            f"<tr><td>{esc(str(k))}</td><td>{esc(_show(v))}</td></tr>"
            for k, v in detail.best.params.items()
        )
        parts.append(
            f"<h2>Best trial #{detail.best.number}: {detail.best.value:.6g}</h2>"
            f"<table><tr><th>parameter</th><th>value</th></tr>{rows}</table>"
        )
    else:
        parts.append("<p class='note'>No completed trial yet.</p>")
    if detail.vram_by_gpu:
        rows = "".join(
            f"<tr><td>{esc(g.gpu)}</td><td>{g.trials}</td><td>{mb_text(g.planned_mean_mb)}</td>"
            f"<td>{mb_text(g.peak_mean_mb)}</td><td>{mb_text(g.peak_max_mb)}</td><td>{g.ooms}</td></tr>"
            for g in detail.vram_by_gpu
        )
        parts.append(
            "<h2>VRAM by GPU (MB)</h2><table><tr><th>GPU</th><th>trials</th><th>planned mean</th>"
            f"<th>peak mean</th><th>peak max</th><th>OOMs</th></tr>{rows}</table>"
        )
    inline_js = True  # plotly.js goes into the page once, with the first figure
    for chart in charts:
        parts.append(f"<h2>{esc(chart.title)}</h2>")
        if chart.figure is None:
            parts.append(f"<p class='note'>{esc(chart.note)}</p>")
            continue
        if chart.note:
            parts.append(f"<p class='note'>{esc(chart.note)}</p>")
        parts.append(chart.figure.to_html(full_html=False, include_plotlyjs=inline_js))
        inline_js = False
        if chart.key in png_names:
            name = esc(png_names[chart.key])
            parts.append(f"<p><a href='{name}'>{name}</a></p>")
    if table is not None:
        where = f" (also in <a href='{esc(csv.name)}'>{esc(csv.name)}</a>)" if csv else ""
        parts.append(f"<h2>Trials</h2><p class='note'>click a column to sort by it{where}</p>")
        parts.append(f"<div class='wide'>{table_html(table)}</div>")
        parts.append(SORT_SCRIPT)
    parts.append("</body></html>")
    return "\n".join(parts)


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
