"""`status`: every study in a storage, or one study in detail; `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from orchestrator.cli import add_storage_argument, command_parser, study_name, whole_number

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from orchestrator.show.views import StudyDetail, StudyRow

DEFAULT_LIMIT = 20


def register(subparsers) -> None:  # noqa: ANN001
    parser = command_parser(
        subparsers,
        "status",
        help="show every study in the storage, or one study in detail",
        example="python -m orchestrator status --study dqn --storage postgresql://user@db:5432/studies",
    )
    parser.add_argument(
        "--study", metavar="NAME", type=study_name, help="show this study in detail"
    )
    add_storage_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--limit",
        type=whole_number("--limit", low=0, example=50),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"VRAM rows of the last N trials (default {DEFAULT_LIMIT}; 0 shows all)",
    )
    parser.set_defaults(handler=status_command)


def status_command(args: argparse.Namespace) -> int:
    from orchestrator.record.storage import describe_location, mask_password, resolve_storage_url
    from orchestrator.show.queries import list_studies, open_for_reading, study_detail
    from orchestrator.show.text import to_jsonable

    url = resolve_storage_url(args.storage)
    storage = open_for_reading(url)
    if args.study:
        detail = study_detail(storage, args.study, describe_location(url))
        if args.json:
            print(json.dumps(to_jsonable(detail), indent=2))
        else:
            _console().print(render_detail(detail, limit=args.limit))
        return 0
    rows = list_studies(storage)
    if args.json:
        print(json.dumps(to_jsonable(rows), indent=2))
    else:
        _console().print(render_studies(rows, mask_password(url)))
    return 0


def _console() -> Console:
    from rich.console import Console

    # Off a terminal rich assumes 80 columns; the tables read better wider in a log or a pipe.
    terminal = sys.stdout.isatty()
    return Console(width=None if terminal else 120, highlight=False)


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _time(moment) -> str:  # noqa: ANN001
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _table(title: str, *columns: str) -> RenderableType:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, header_style="bold")
    for name in columns:
        # Free text wraps; names, numbers and times stay on one line.
        table.add_column(name, no_wrap=name != "detail", overflow="fold")
    return table


def render_studies(rows: list[StudyRow], location: str) -> RenderableType:
    from orchestrator.show.views import MULTI_OBJECTIVE

    if not rows:
        return f"No studies in {location} yet: start one with `python -m orchestrator run ADAPTER`."
    table = _table(
        f"Studies in {location}", "study", "adapter", "trials", "running", "best", "best trial"
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


def render_detail(detail: StudyDetail, *, limit: int = DEFAULT_LIMIT) -> RenderableType:
    from rich.console import Group
    from rich.markup import escape

    from orchestrator.show.text import mb_text, plural
    from orchestrator.show.views import MULTI_OBJECTIVE, describe_direction

    parts: list[RenderableType] = []
    about = [
        f"adapter {detail.adapter or '?'}",
        describe_direction(detail.direction, detail.directions),
    ]
    if detail.sampler:
        about.append(f"sampler {detail.sampler}")
    if detail.epochs:
        about.append(plural(detail.epochs, "epoch"))

    parts.append(f"[bold]Study {escape(detail.name)}[/] ({escape(', '.join(about))})")
    budget = "?" if detail.budget is None else str(detail.budget)
    states = " · ".join(f"{state} {n}" for state, n in detail.states.items())
    retried = f" ({detail.retried} failed and re-run)" if detail.retried else ""
    parts.append(f"Trials: {detail.counted}/{budget} counted · {states}{retried}")

    if detail.direction == MULTI_OBJECTIVE:
        parts.append(
            "Best: none, a multi-objective study has no single best trial "
            "(`python -m orchestrator dashboard` shows its Pareto front)"
        )
    elif detail.best is None:
        parts.append("Best: no completed trial yet")
    else:
        best = detail.best
        parts.append(f"Best: trial #{best.number}, value {_value(best.value)}")
        params = _table("", "parameter", "value")
        for key, value in best.params.items():
            params.add_row(key, _value(value) if isinstance(value, float) else str(value))
        parts.append(params)

    workers = _table(
        f"Workers seen ({len(detail.workers)})",
        "host",
        "GPU",
        "pid",
        "started",
        "last seen",
        "stopped",
    )
    for w in detail.workers:
        gpu = w.gpu_name if w.gpu_index is None else f"#{w.gpu_index} {w.gpu_name}"
        workers.add_row(
            w.host, gpu, str(w.pid), _time(w.started_at), _time(w.last_seen), _time(w.stopped_at)
        )
    parts.append(workers if detail.workers else "Workers seen: none recorded")

    if detail.concurrency_events:
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
            gpu = e.gpu_name if e.gpu_index is None else f"#{e.gpu_index} {e.gpu_name}"
            events.add_row(
                _time(e.at),
                e.host,
                gpu,
                f"{e.from_slots} -> {e.to_slots}",
                e.reason,
                e.detail or "",
            )
        parts.append(events)
    else:
        parts.append("Concurrency changes: none recorded")

    if detail.ooms:
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
        parts.append(ooms)
    else:
        parts.append("OOM events: none")

    if detail.vram:
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
            ratio = r.peak_over_planned
            vram.add_row(
                f"#{r.trial}",
                r.state,
                r.gpu,
                str(r.batch_size or "-"),
                mb_text(r.planned_mb),
                mb_text(r.peak_mb),
                "-" if ratio is None else f"{ratio:.2f}",
                str(r.concurrency or "-"),
                "yes" if r.oom else "",
            )
        parts.append(vram)
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
            worst = g.worst_peak_over_planned
            by_gpu.add_row(
                g.gpu,
                str(g.trials),
                mb_text(g.planned_mean_mb),
                mb_text(g.peak_mean_mb),
                mb_text(g.peak_max_mb),
                "-" if worst is None else f"{worst:.2f}",
                str(g.ooms),
            )
        parts.append(by_gpu)
    else:
        parts.append("VRAM per trial: no trial has run on a device yet")
    return Group(*parts)
