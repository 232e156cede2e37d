"""Every trial in one table: the report page's sortable table, and the same rows as trials.csv."""

from __future__ import annotations

import csv
import datetime as dt
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.record.trials import attr_names as names
from orchestrator.show.text import to_utc

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

CSV_NAME = "trials.csv"
LOG_COLUMN = "log_file"  # the trial's own output: a link on the page
# Recorded by every trial that ran on a device (`orchestrator.record.trials.attrs`), in the order a person reads them.
RECORD_COLUMNS = (  # (the trial's attribute, the column's header)
    (names.GPU, "gpu"),
    (names.VRAM_PLANNED_MB, "vram_planned_mb"),
    (names.VRAM_PEAK_MB, "vram_peak_mb"),
    (names.CONCURRENCY, "concurrency"),
    (names.OOM, "oom"),
)


@dataclass(frozen=True)
class TrialTable:
    header: list[str]
    rows: list[list[Any]]  # None where a trial has no value for a column


def trial_table(trials: Sequence[FrozenTrial], metric: str | Sequence[str]) -> TrialTable:
    """One row per trial: number, state, its value for each objective (`metric`: their names),
    epochs reported, duration, start and complete (UTC), records, parameters, its log file."""
    objectives = [metric] if isinstance(metric, str) else list(metric)
    params: list[str] = []
    for trial in trials:  # declared order, as the adapter's suggest drew them
        params += [name for name in trial.params if name not in params]
    header = ["trial", "state", *objectives, "epochs", "seconds", "start", "complete"]
    header += [label for _, label in RECORD_COLUMNS] + params + [LOG_COLUMN]
    rows = []
    for trial in sorted(trials, key=lambda t: t.number):
        seconds = round(trial.duration.total_seconds(), 2) if trial.duration is not None else None
        values = list(trial.values) if trial.values is not None else [None] * len(objectives)
        row = [trial.number, trial.state.name, *values, len(trial.intermediate_values), seconds]
        row += [_utc_text(trial.datetime_start), _utc_text(trial.datetime_complete)]
        row += [trial.user_attrs.get(attr) for attr, _ in RECORD_COLUMNS]
        row += [trial.params.get(name) for name in params]
        row.append(trial.user_attrs.get(names.LOG_FILE))
        rows.append(row)
    return TrialTable(header, rows)


def _utc_text(moment: dt.datetime | None) -> str | None:
    """Optuna's local time as UTC, to the second: '2026-12-01 19:32:47' (sorts as text)."""
    utc = to_utc(moment)
    return None if utc is None else utc.strftime("%Y-%m-%d %H:%M:%S")


def write_csv(table: TrialTable, path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(table.header)
        writer.writerows([["" if v is None else v for v in row] for row in table.rows])
    return path


SORT_SCRIPT = """<script>
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, column) {
    th.addEventListener('click', function () {
      var up = th.getAttribute('aria-sort') !== 'ascending';
      table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var v = row.cells[column].getAttribute('data-v');
        var n = parseFloat(v);
        return v === '' ? null : (isNaN(n) ? v : n);
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null) return 1;  // empty cells last, either way
        if (y === null) return -1;
        var c = (typeof x === typeof y) ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === 'number' ? -1 : 1);
        return up ? c : -c;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
</script>"""


def table_html(table: TrialTable) -> str:
    """The table as HTML that sorts by a column when its header is clicked (script inline)."""
    esc = html.escape
    head = "".join(f"<th title='sort by {esc(h)}'>{esc(h)}</th>" for h in table.header)
    body = []
    log = table.header.index(LOG_COLUMN) if LOG_COLUMN in table.header else -1
    for row in table.rows:
        shown = [_log_link(v) if i == log else esc(_shown(v)) for i, v in enumerate(row)]
        cells = "".join(
            f"<td data-v='{esc(_raw(v), quote=True)}'>{text}</td>"
            for v, text in zip(row, shown, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return (
        "<table class='sortable trials'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _log_link(path: Any) -> str:
    """A link to a trial's log file (an absolute path on the machine that ran it)."""
    if not path:
        return ""
    where = Path(str(path))
    href = where.as_uri() if where.is_absolute() else str(where)
    return f"<a href='{html.escape(href, quote=True)}'>{html.escape(where.name)}</a>"


def _raw(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
