"""A study's report: one self-contained HTML page (plotly.js inline, opens with no network), PNGs
and trials.csv, written into one directory.

The page: what ran (orchestrator.show.report.summary), the best parameters as YAML (or the Pareto
front of several objectives), VRAM by GPU, every chart (orchestrator.show.report.charts,
also written as PNGs by orchestrator.show.report.pngs), then every trial in a sortable table, the
same rows as trials.csv (orchestrator.show.report.trials).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from adapters import metric_name
from adapters.study_adapter import resolve_adapter
from orchestrator.errors import UserError
from orchestrator.record.study.spec import SPEC_ATTR, load_spec
from orchestrator.show.final_scores_text import final_scores_section
from orchestrator.show.report.charts import plotly_charts
from orchestrator.show.report.gpu_timeline import cpu_only_note
from orchestrator.show.report.lineage import lineage_section
from orchestrator.show.report.pngs import write_pngs
from orchestrator.show.report.summary import summary_html, vram_html
from orchestrator.show.report.trials import (
    CSV_NAME,
    SORT_SCRIPT,
    table_html,
    trial_table,
    write_csv,
)
from orchestrator.show.run_facts import objective_names, run_facts

if TYPE_CHECKING:
    import optuna

    from orchestrator.show.report.charts import Chart
    from orchestrator.show.report.trials import TrialTable
    from orchestrator.show.views import StudyDetail

PAGE_NAME = "index.html"
STYLE = (
    "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
    "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}"
    ".note{color:#666;font-style:italic}table.what-ran th{background:none;font-weight:600}"
    "pre.yaml{background:#f6f6f6;padding:8px 12px;border:1px solid #ddd;display:inline-block}"
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
    spec = load_spec(study)
    if spec is None:
        return "value"
    try:
        return metric_name(resolve_adapter(spec), spec.options)
    except Exception:  # an adapter not installed on this machine, or one that fails to import
        return "value"


def write_report(
    study: optuna.Study, detail: StudyDetail, out_dir: Path, *, metric: str | None = None
) -> ReportFiles:
    """Write index.html, one PNG per drawn chart and trials.csv into out_dir (created if missing)."""
    out_dir = Path(out_dir)
    _writable(out_dir)
    trials = study.get_trials(deepcopy=False)
    adapter_metric = metric or study_metric(study)
    names = objective_names(_metric_names(study), len(study.directions), adapter_metric)
    charts = plotly_charts(study, detail, names[0], names)
    pngs = write_pngs(study, detail, charts, out_dir, names[0], names)
    table = trial_table(trials, names)
    csv = write_csv(table, out_dir / CSV_NAME)
    page = out_dir / PAGE_NAME
    front = study.best_trials if len(names) > 1 else []
    facts = run_facts(study.user_attrs.get(SPEC_ATTR), trials)
    top = ["<section class='summary'>", *summary_html(detail, facts, names, front)]
    top.append(final_scores_section(study.user_attrs))  # validation, test, baselines
    top += [*vram_html(detail, cpu_only_note(detail.vram)), "</section>"]
    top += lineage_section(trials, detail.lineage)  # population-based training only
    page.write_text(render_page(detail, charts, pngs, table, csv, top=top), encoding="utf-8")
    notes = [f"{chart.title}: {chart.note}" for chart in charts if chart.figure is None]
    return ReportFiles(page=page, pngs=pngs, notes=notes, csv=csv)


def _metric_names(study: optuna.Study) -> list[str] | None:
    """The study's metric names (optuna's set_metric_names), when it has them."""
    try:
        return study.metric_names
    except Exception:  # an older Optuna, or a study that cannot say: fall back to the adapter's
        return None


def _writable(out_dir: Path) -> None:
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


# --- the page ----------------------------------------------------------------------------------


def render_page(
    detail: StudyDetail,
    charts: list[Chart],
    pngs: list[Path],
    table: TrialTable | None = None,
    csv: Path | None = None,
    *,
    top: list[str] | None = None,
) -> str:
    """The HTML page: what ran and the best trial (`top`), each chart (plotly.js inline once),
    then every trial in a table that sorts by the column clicked."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Study {esc(detail.name)}</title>",
        STYLE,
        "</head><body>",
        *(top if top is not None else [f"<h1>Study {esc(detail.name)}</h1>"]),
        *chart_sections(charts, pngs),
    ]
    if table is not None:
        parts += trials_section(table, csv)
    parts.append("</body></html>")
    return "\n".join(parts)


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
    where = f" (also in <a href='{esc(csv.name)}'>{esc(csv.name)}</a>)" if csv else ""
    return [
        f"<h2>Trials</h2><p class='note'>click a column to sort by it{where}</p>",
        f"<div class='wide'>{table_html(table)}</div>",
        SORT_SCRIPT,
    ]
