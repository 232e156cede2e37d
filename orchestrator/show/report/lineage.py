"""The report's population-based-training section: the population drawn over epochs, and the
winning lineage's schedule of params.

Each segment is a bar on its member's row from the epoch it started at to the epoch it trained
to; a segment that copied another member's checkpoint has a line from its parent's bar. The
best trial's lineage is drawn in a strong colour, and its schedule follows as a table. Plain SVG
and HTML: no chart library, so the section shows even where plotly is missing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.record.checkpoints.lineage import (
    PBT_MEMBER,
    PBT_PARENT,
    PBT_START_EPOCH,
    epochs_trained,
    is_segment,
)

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

ROW = 18  # pixels per member
WIDTH = 640  # pixels for the epochs
LEFT = 70  # room for the members' names


def lineage_section(trials: Sequence[FrozenTrial], lineage: dict[str, Any] | None) -> list[str]:
    """The section's HTML lines; none when the study's trials are not segments of PBT."""
    segments = [
        t for t in trials if is_segment(t) and isinstance(t.user_attrs.get(PBT_MEMBER), int)
    ]
    if not segments:
        return []
    best = set(lineage["trials"]) if lineage else set()
    parts = [
        "<h2>Population-based training</h2>",
        "<p class='note'>each bar is one trial (a segment of a member's training) over the "
        "epochs it trained; a line joins a segment that copied another member's checkpoint to "
        "that checkpoint; the best trial's lineage is dark</p>",
        population_svg(segments, best),
    ]
    if lineage:
        parts.append(
            "<h3>The best lineage</h3><table><tr><th>epochs</th><th>params</th><th>trials</th></tr>"
        )
        for row in lineage["schedule"]:
            params = ", ".join(f"{k}={_short(v)}" for k, v in sorted(row["params"].items()))
            trials_text = ", ".join(str(n) for n in row["trials"])
            parts.append(
                f"<tr><td>{row['from'] + 1}-{row['until']}</td><td>{html.escape(params)}</td>"
                f"<td>{trials_text}</td></tr>"
            )
        parts.append("</table>")
        weights = lineage.get("weights")
        where = "no checkpoint saved" if weights is None else str(weights)
        parts.append(f"<p>weights: {html.escape(where)}</p>")
    return parts


def population_svg(segments: Sequence[FrozenTrial], best: set[int]) -> str:
    """The population as bars on one row per member, epochs across."""
    by_number = {t.number: t for t in segments}
    last = max(_until(t) for t in segments) or 1
    members = sorted({t.user_attrs[PBT_MEMBER] for t in segments})
    row_of = {m: i for i, m in enumerate(members)}

    def x(epoch: int) -> float:
        return LEFT + WIDTH * epoch / last

    def y(trial: FrozenTrial) -> float:
        return 10 + ROW * row_of[trial.user_attrs[PBT_MEMBER]] + ROW / 2

    shapes = []
    for m, i in row_of.items():
        shapes.append(
            f"<text x='4' y='{14 + ROW * i + ROW / 2 - 2}' font-size='11'>member {m}</text>"
        )
    for t in sorted(segments, key=lambda t: t.number):
        start, until = _start(t), _until(t)
        colour = "#1f3b73" if t.number in best else _state_colour(t)
        shapes.append(
            f"<line x1='{x(start):.1f}' y1='{y(t):.1f}' x2='{x(until):.1f}' y2='{y(t):.1f}' "
            f"stroke='{colour}' stroke-width='7'><title>trial {t.number}: epochs {start + 1}-"
            f"{until}, value {_value(t)}</title></line>"
        )
        parent = by_number.get(t.user_attrs.get(PBT_PARENT))
        if parent is not None and parent.user_attrs[PBT_MEMBER] != t.user_attrs[PBT_MEMBER]:
            stroke = "#1f3b73" if t.number in best else "#999"
            shapes.append(
                f"<line x1='{x(start):.1f}' y1='{y(parent):.1f}' x2='{x(start):.1f}' "
                f"y2='{y(t):.1f}' stroke='{stroke}' stroke-width='1.5' stroke-dasharray='3,2'/>"
            )
    height = 20 + ROW * len(members) + 14
    axis = (
        f"<text x='{LEFT}' y='{height - 2}' font-size='11'>epoch 0</text>"
        f"<text x='{LEFT + WIDTH - 50}' y='{height - 2}' font-size='11'>epoch {last}</text>"
    )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{LEFT + WIDTH + 10}' height='{height}'>"
        + "".join(shapes)
        + axis
        + "</svg>"
    )


def _start(t: FrozenTrial) -> int:
    value = t.user_attrs.get(PBT_START_EPOCH)
    return value if isinstance(value, int) else 0


def _until(t: FrozenTrial) -> int:
    return epochs_trained(t)


def _state_colour(t: FrozenTrial) -> str:
    return {"COMPLETE": "#7fa7d9", "RUNNING": "#f0c36d", "WAITING": "#f0c36d"}.get(
        t.state.name, "#d98080"
    )


def _value(t: FrozenTrial) -> str:
    return "-" if t.values is None or len(t.values) != 1 else f"{t.values[0]:.4g}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
