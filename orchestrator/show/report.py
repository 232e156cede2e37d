"""A study's report: one self-contained HTML page (plotly.js inline, opens with no network), PNGs
and trials.csv, written into one directory.

The page: a summary, the best parameters, VRAM by GPU, every chart (orchestrator.show.report_charts,
also written as PNGs by orchestrator.show.report_pngs), then every trial in a sortable table, the
same rows as trials.csv (orchestrator.show.report_trials).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna

    from orchestrator.show.report_charts import Chart
    from orchestrator.show.report_trials import TrialTable
    from orchestrator.show.views import StudyDetail

PAGE_NAME = "index.html"
STYLE = (
    "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
    "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}"
    ".note{color:#666;font-style:italic}"
    "table.trials{font-size:13px}table.trials th{cursor:pointer;background:#f4f4f4}"
    "table.trials td,table.trials th{white-space:nowrap}.wide{overflow-x:auto}"
    "table.trials th[aria-sort=ascending]::after{content:' \\25B2'}"
    "table.trials th[aria-sort=descending]::after{content:' \\25BC'}</style>"
)
esc = html.escape


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
    from orchestrator.show.report_charts import plotly_charts
    from orchestrator.show.report_pngs import write_pngs
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


# --- the page ----------------------------------------------------------------------------------


def render_page(
    detail: StudyDetail,
    charts: list[Chart],
    pngs: list[Path],
    table: TrialTable | None = None,
    csv: Path | None = None,
) -> str:
    """The HTML page: a summary, the best parameters, each chart (plotly.js inline once), then
    every trial in a table that sorts by the column clicked."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Study {esc(detail.name)}</title>",
        STYLE,
        "</head><body>",
        *summary(detail),
        *chart_sections(charts, pngs),
    ]
    if table is not None:
        parts += trials_section(table, csv)
    parts.append("</body></html>")
    return "\n".join(parts)


def summary(detail: StudyDetail) -> list[str]:
    """The study's heading, adapter and trial counts, its best trial and its VRAM by GPU."""
    budget = "?" if detail.budget is None else str(detail.budget)
    states = ", ".join(f"{state} {n}" for state, n in detail.states.items())
    parts = [
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
        parts.append(vram_table(detail))
    return parts


def vram_table(detail: StudyDetail) -> str:
    from orchestrator.show.text import mb_text

    rows = "".join(
        f"<tr><td>{esc(g.gpu)}</td><td>{g.trials}</td><td>{mb_text(g.planned_mean_mb)}</td>"
        f"<td>{mb_text(g.peak_mean_mb)}</td><td>{mb_text(g.peak_max_mb)}</td><td>{g.ooms}</td></tr>"
        for g in detail.vram_by_gpu
    )
    return (
        "<h2>VRAM by GPU (MB)</h2><table><tr><th>GPU</th><th>trials</th><th>planned mean</th>"
        f"<th>peak mean</th><th>peak max</th><th>OOMs</th></tr>{rows}</table>"
    )


def chart_sections(charts: list[Chart], pngs: list[Path]) -> list[str]:
    """Each chart under its title, with its note and a link to its PNG; a missing one, its note."""
    png_names = {p.stem: p.name for p in pngs}
    parts = []
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
    return parts


def trials_section(table: TrialTable, csv: Path | None) -> list[str]:
    from orchestrator.show.report_trials import SORT_SCRIPT, table_html

    where = f" (also in <a href='{esc(csv.name)}'>{esc(csv.name)}</a>)" if csv else ""
    return [
        f"<h2>Trials</h2><p class='note'>click a column to sort by it{where}</p>",
        f"<div class='wide'>{table_html(table)}</div>",
        SORT_SCRIPT,
    ]


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
