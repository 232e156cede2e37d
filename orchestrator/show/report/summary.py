"""The top of the report page: what ran (adapter, sampler, pruner, seed, start, end and wall time),
the recommended trial, beside the best observed one, named by its metric with its parameters as
ready-to-copy YAML, or, with several objectives, the Pareto front; then VRAM by GPU, or why a
CPU-only study has none."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.show.recommended import lines as recommended_lines
from orchestrator.show.run_facts import RunFacts, params_yaml, wall_text
from orchestrator.show.text import mb_text

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from orchestrator.show.views import StudyDetail

esc = html.escape
COPY_SCRIPT = (
    "<script>function copyBlock(id){var t=document.getElementById(id).textContent;"
    "if(navigator.clipboard){navigator.clipboard.writeText(t);}}</script>"
)


def summary_html(
    detail: StudyDetail,
    facts: RunFacts,
    names: list[str],
    front: Sequence[FrozenTrial] = (),
) -> list[str]:
    """The study's heading, what ran, its best trial (or Pareto front) and its VRAM by GPU."""
    budget = "?" if detail.budget is None else str(detail.budget)
    states = ", ".join(f"{state} {n}" for state, n in detail.states.items())
    directions = ", ".join(f"{d} {n}" for d, n in zip(detail.directions, names, strict=False))
    parts = [
        f"<h1>Study {esc(detail.name)}</h1>",
        f"<p>Adapter <b>{esc(detail.adapter or '?')}</b>, {esc(directions or detail.direction)}, "
        f"{detail.counted}/{budget} trials counted ({esc(states)}).</p>",
        what_ran_html(facts),
    ]
    if len(names) > 1:
        parts += pareto_html(front, names)
    elif detail.best is not None:
        parts += best_html(detail, names[0])
    else:
        parts.append("<p class='note'>No completed trial yet.</p>")
    return parts


def what_ran_html(facts: RunFacts) -> str:
    end = _time(facts.end)
    if facts.running:
        end += f" (so far: {facts.running} still running)"
    rows = [
        ("sampler", facts.sampler),
        ("pruner", facts.pruner),
        ("seed", facts.seed),
        ("start (UTC)", _time(facts.start)),
        ("end (UTC)", end),
        ("wall time", wall_text(facts.wall_seconds)),
    ]
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<h2>What ran</h2><table class='what-ran'>{cells}</table>"


def best_html(detail: StudyDetail, metric: str) -> list[str]:
    """The trial to deploy, the recommended one, with its parameters; the best observed one
    beside it, and why they differ (show/recommended.py)."""
    best = detail.best
    assert best is not None
    rec = detail.recommended
    if rec is None:
        heading = f"<h2>Best trial #{best.number}: {esc(metric)} {best.value:.6g}</h2>"
        said: list[str] = []
        params = best.params
    else:
        value = f"expected {rec.expected:.6g}" if rec.modelled else f"observed {rec.observed:.6g}"
        heading = f"<h2>Recommended trial #{rec.trial}: {esc(metric)} {value}</h2>"
        said = [f"<p class='note'>{esc(line)}</p>" for line in recommended_lines(rec, metric)]
        params = rec.params
    rows = "".join(
        f"<tr><td>{esc(str(k))}</td><td>{esc(_show(v))}</td></tr>" for k, v in params.items()
    )
    return [
        heading,
        *said,
        f"<table><tr><th>parameter</th><th>value</th></tr>{rows}</table>",
        *yaml_block(params, "best-params"),
    ]


def yaml_block(params: dict[str, Any], ident: str) -> list[str]:
    """The parameters as YAML in a block to copy into a training config (with a copy button)."""
    return [
        f"<p>As YAML <button onclick=\"copyBlock('{ident}')\">copy</button></p>",
        f"<pre class='yaml' id='{ident}'>{esc(params_yaml(params))}</pre>",
        COPY_SCRIPT,
    ]


def pareto_html(front: Sequence[FrozenTrial], names: list[str]) -> list[str]:
    """Several objectives have no one best trial: the trials on the Pareto front, each's values
    and parameters."""
    if not front:
        return ["<p class='note'>No completed trial yet: no Pareto front.</p>"]
    params: list[str] = []
    for trial in front:
        params += [p for p in trial.params if p not in params]
    head = "".join(f"<th>{esc(h)}</th>" for h in ["trial", *names, *params])
    rows = []
    for trial in front:
        cells = [f"#{trial.number}", *(f"{v:.6g}" for v in trial.values)]
        cells += [_show(trial.params.get(p, "")) for p in params]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return [
        f"<h2>Pareto front: {len(front)} trials ({esc(' / '.join(names))})</h2>",
        "<p class='note'>several objectives have no single best trial: these are the trials no "
        "other trial beats on every objective</p>",
        f"<div class='wide'><table class='pareto'><tr>{head}</tr>{''.join(rows)}</table></div>",
    ]


def vram_html(detail: StudyDetail, cpu_note: str | None) -> list[str]:
    """VRAM by GPU, or, for a study that ran on the CPU only, why there is none."""
    if cpu_note is not None:
        return [f"<h2>VRAM by GPU</h2><p class='note'>{esc(cpu_note)}</p>"]
    if not detail.vram_by_gpu:
        return []
    rows = "".join(
        f"<tr><td>{esc(g.gpu)}</td><td>{g.trials}</td><td>{mb_text(g.planned_mean_mb)}</td>"
        f"<td>{mb_text(g.peak_mean_mb)}</td><td>{mb_text(g.peak_max_mb)}</td><td>{g.ooms}</td></tr>"
        for g in detail.vram_by_gpu
    )
    return [
        "<h2>VRAM by GPU (MB)</h2><table><tr><th>GPU</th><th>trials</th><th>planned mean</th>"
        f"<th>peak mean</th><th>peak max</th><th>OOMs</th></tr>{rows}</table>"
    ]


def _time(moment: Any) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
