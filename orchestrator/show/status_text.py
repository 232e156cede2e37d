"""What `status` prints, as rich renderables: every study in one table, or one study section by
section (its settings, trials, best trial, workers, concurrency changes, OOMs and VRAM)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.repeats import REPEAT_STD_ATTR, REPEAT_VALUES_ATTR
from orchestrator.imports import LazyImport
from orchestrator.show.final_scores_text import final_score_lines
from orchestrator.show.recommended import lines as recommended_lines
from orchestrator.show.text import mb_text, plural
from orchestrator.show.views import MULTI_OBJECTIVE, describe_direction, no_best_yet

if TYPE_CHECKING:
    import rich.box as rich_box
    import rich.console as rich_console
    import rich.markup as rich_markup
    import rich.table as rich_table
    from rich.console import RenderableType
    from rich.table import Table

    from orchestrator.record.study.final_scores import FinalScores
    from orchestrator.show.views import StudyDetail, StudyRow, Worker
else:
    rich_box = LazyImport("rich.box")
    rich_console = LazyImport("rich.console")
    rich_markup = LazyImport("rich.markup")
    rich_table = LazyImport("rich.table")


def render_studies(rows: list[StudyRow], location: str) -> RenderableType:
    """Every study in the storage, one row each: its trials, how many run, its best observed
    value (the luckiest run: `status --study` and `best` name the recommended trial, which takes
    a model of each study's trials)."""
    if not rows:
        return f"No studies in {location} yet: start one with `python -m orchestrator run ADAPTER`."
    table = _table(
        f"Studies in {location}", "study", "adapter", "trials", "running", "best observed", "trial"
    )
    for row in rows:
        budget = "?" if row.budget is None else str(row.budget)
        best = (
            MULTI_OBJECTIVE  # no single best value to show
            if row.direction == MULTI_OBJECTIVE
            else f"{_value(row.best_value)} ({row.direction[:3]})"
        )
        table.add_row(
            row.name,
            row.adapter or "-",
            f"{row.counted}/{budget}",
            str(row.running),
            best,
            "-" if row.best_trial is None else f"#{row.best_trial}",
        )
    return table


def render_detail(
    detail: StudyDetail,
    *,
    limit: int,
    settings_updates: Sequence[Mapping[str, Any]] = (),
    final_scores: FinalScores | None = None,
) -> RenderableType:
    """One study in detail, a section after another (`limit`: VRAM rows of the last N trials,
    0 for all; `status --limit`; `settings_updates`: what `run --update-settings` recorded;
    `final_scores`: what the study's end scored, record/study/final_scores.py)."""
    return rich_console.Group(
        *heading(detail),
        *updates_section(settings_updates),
        *best_section(detail),
        *scores_section(final_scores, detail),
        workers_section(detail),
        concurrency_section(detail),
        oom_section(detail),
        *vram_sections(detail, limit),
    )


def heading(detail: StudyDetail) -> list[RenderableType]:
    """The study's name and settings, then its trials by state."""
    about = [
        f"adapter {detail.adapter or '?'}",
        describe_direction(detail.direction, detail.directions),
    ]
    if detail.sampler:
        about.append(f"sampler {detail.sampler}")
    if detail.epochs:
        about.append(plural(detail.epochs, "epoch"))
    budget = "?" if detail.budget is None else str(detail.budget)
    states = " · ".join(f"{state} {n}" for state, n in detail.states.items())
    retried = f" ({detail.retried} failed and re-run)" if detail.retried else ""
    name, about_text = rich_markup.escape(detail.name), rich_markup.escape(", ".join(about))
    return [
        f"[bold]Study {name}[/] ({about_text})",
        f"Trials: {detail.counted}/{budget} counted · {states}{retried}",
    ]


def updates_section(updates: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per `--update-settings`: when, on which host, each setting from and to; the
    trials before it ran under the settings it replaced."""
    lines = []
    for update in updates:
        changes = ", ".join(
            f"{change.get('setting')} {change.get('from')} -> {change.get('to')}"
            for change in update.get("changes", [])
        )
        when, host = update.get("time", "?"), update.get("host", "?")
        lines.append(rich_markup.escape(f"Settings updated {when} on {host}: {changes}"))
    return lines


def best_section(detail: StudyDetail) -> list[RenderableType]:
    if detail.direction == MULTI_OBJECTIVE:
        return [
            "Best: none, a multi-objective study has no single best trial "
            "(`python -m orchestrator dashboard` shows its Pareto front)"
        ]
    if detail.best is None:
        return [f"Best: {no_best_yet(detail.states.get('COMPLETE', 0))}"]
    best = detail.best
    rec = detail.recommended
    observed = f"trial #{best.number}, {detail.metric} {_value(best.value)}{_spread(best)}"
    if rec is None:
        return [f"Best: {observed}", _params_table(best.params)]
    said = recommended_lines(rec, detail.metric, with_best_observed=False)
    heading = "Best" if rec.same else "Best observed"
    return [
        f"{heading}: {observed}",
        *(rich_markup.escape(line[0].upper() + line[1:]) for line in said),
        _params_table(rec.params),
    ]


def _params_table(params: Mapping[str, Any]) -> Table:
    table = _table("", "parameter", "value")
    for key, value in params.items():
        table.add_row(key, _value(value) if isinstance(value, float) else str(value))
    return table


def _spread(best: Any) -> str:
    """`, mean of 3 seeds (0.41, 1.2, 0.93), +- 0.33` for a trial run with --repeats."""
    values = best.user_attrs.get(REPEAT_VALUES_ATTR)
    if not isinstance(values, list) or len(values) < 2:
        return ""
    each = ", ".join(_value(float(v)) for v in values)
    std = best.user_attrs.get(REPEAT_STD_ATTR)
    spread = "" if std is None else f" +- {float(std):.2g}"
    return f", mean of {len(values)} seeds ({each}){spread}"


def scores_section(scores: FinalScores | None, detail: StudyDetail) -> list[RenderableType]:
    """The scores to trust: the selection's validation and test, beside the baselines; where a
    current confirmation ranked first another trial than the recommended one, that trial's parameters
    (the one `best` hands out)."""
    if scores is None:
        return []
    out: list[RenderableType] = [
        "Scores to trust:",
        *(
            rich_markup.escape("  " + line)
            for line in final_score_lines(scores, valued_now=detail.valued)
        ),
    ]
    rec = detail.recommended
    if (
        scores.confirmed
        and scores.selected_params
        and rec is not None
        and scores.selected_trial != rec.trial
        and scores.complete_trials == detail.valued
    ):
        out += [
            f"To deploy: trial #{scores.selected_trial}, ranked first by the confirmation "
            "(`best --format yaml` writes its parameters)",
            _params_table(scores.selected_params),
        ]
    return out


def workers_section(detail: StudyDetail) -> RenderableType:
    if not detail.workers:
        return "Workers seen: none recorded"
    # The Slurm column only where a worker ran under Slurm: its job leads to squeue and scancel.
    slurm = any(w.slurm_job for w in detail.workers)
    columns = ["host", "GPU", "pid", "started", "last seen", "stopped"]
    workers = _table(
        f"Workers seen ({len(detail.workers)})", *columns, *(["Slurm job"] if slurm else [])
    )
    for w in detail.workers:
        cells = [
            w.host,
            _gpu(w.gpu_index, w.gpu_name),
            str(w.pid),
            _time(w.started_at),
            _time(w.last_seen),
            _time(w.stopped_at),
        ]
        workers.add_row(*cells, *([_slurm_job(w)] if slurm else []))
    return workers


def _slurm_job(w: Worker) -> str:
    """`41_1 on n1`, with how often Slurm had requeued it: `41_1 on n1, restart 1`."""
    if not w.slurm_job:
        return "-"
    text = w.slurm_job + (f" on {w.slurm_node}" if w.slurm_node else "")
    return text + (f", restart {w.slurm_restarts}" if w.slurm_restarts else "")


def concurrency_section(detail: StudyDetail) -> RenderableType:
    if not detail.concurrency_events:
        return "Concurrency changes: none recorded"
    events = _table(
        f"Concurrency changes ({len(detail.concurrency_events)})",
        "time",
        "host",
        "GPU",
        "slots",
        "reason",
        "detail",
    )
    for e in detail.concurrency_events:
        events.add_row(
            _time(e.at),
            e.host,
            _gpu(e.gpu_index, e.gpu_name),
            f"{e.from_slots} -> {e.to_slots}",
            e.reason,
            e.detail or "",
        )
    return events


def oom_section(detail: StudyDetail) -> RenderableType:
    if not detail.ooms:
        return "OOM events: none"
    ooms = _table(
        f"OOM events ({len(detail.ooms)})",
        "trial",
        "time",
        "host",
        "GPU",
        "batch",
        "slots",
        "re-run",
    )
    for o in detail.ooms:
        ooms.add_row(
            f"#{o.trial}",
            _time(o.at),
            o.host or "-",
            o.gpu,
            str(o.batch_size or "-"),
            str(o.concurrency or "-"),
            "yes" if o.retried else "no",
        )
    return ooms


def vram_sections(detail: StudyDetail, limit: int) -> list[RenderableType]:
    """VRAM per trial (the last `limit`; 0 shows all), then per kind of GPU."""
    if not detail.vram:
        return ["VRAM per trial: no trial has run on a device yet"]
    return [vram_per_trial(detail, limit), vram_per_gpu(detail)]


def vram_per_trial(detail: StudyDetail, limit: int) -> RenderableType:
    shown = detail.vram if limit <= 0 else detail.vram[-limit:]
    more = (
        ""
        if len(shown) == len(detail.vram)
        else f", last {len(shown)} of {len(detail.vram)}; --limit 0 for all"
    )
    vram = _table(
        f"VRAM per trial (MB{more})",
        "trial",
        "state",
        "GPU",
        "batch",
        "planned",
        "peak",
        "peak/planned",
        "slots",
        "OOM",
    )
    for r in shown:
        vram.add_row(
            f"#{r.trial}",
            r.state,
            r.gpu,
            str(r.batch_size or "-"),
            mb_text(r.planned_mb),
            mb_text(r.vram_peak_mb),
            _ratio(r.peak_over_planned),
            str(r.concurrency or "-"),
            "yes" if r.oom else "",
        )
    return vram


def vram_per_gpu(detail: StudyDetail) -> RenderableType:
    by_gpu = _table(
        "VRAM by GPU (MB)",
        "GPU",
        "trials",
        "planned mean",
        "peak mean",
        "peak max",
        "worst peak/planned",
        "OOMs",
    )
    for g in detail.vram_by_gpu:
        by_gpu.add_row(
            g.gpu,
            str(g.trials),
            mb_text(g.planned_mean_mb),
            mb_text(g.peak_mean_mb),
            mb_text(g.peak_max_mb),
            _ratio(g.worst_peak_over_planned),
            str(g.ooms),
        )
    return by_gpu


def _table(title: str, *columns: str) -> Table:
    table = rich_table.Table(
        title=title, title_justify="left", box=rich_box.SIMPLE_HEAD, header_style="bold"
    )
    for name in columns:
        # Free text wraps; names, numbers and times stay on one line.
        table.add_column(name, no_wrap=name != "detail", overflow="fold")
    return table


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _time(moment: dt.datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _gpu(index: int | None, name: str) -> str:
    return name if index is None else f"#{index} {name}"
