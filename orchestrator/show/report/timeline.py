"""The report's GPU charts over time, drawn from orchestrator.show.report.gpu_timeline's values: a
timeline per GPU (each trial a bar on the GPU it ran on; trials that ran at once on their own
rows) and the memory its trials held against what the GPU let them use. Plotly for the page,
matplotlib for the PNGs, the same values in both.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.report.gpu_timeline import (
    CPU_ONLY_NOTE,
    Lane,
    allowance,
    cpu_only,
    memory_held,
)

if TYPE_CHECKING:
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import plotly.colors as plotly_colors
    import plotly.graph_objects as go

    from orchestrator.record.store.records import ConcurrencyEvent
else:
    mdates = LazyImport("matplotlib.dates")
    plt = LazyImport("matplotlib.pyplot")
    plotly_colors = LazyImport("plotly.colors")
    go = LazyImport("plotly.graph_objects")

STATE_COLOURS = {  # state -> (colour, legend)
    "COMPLETE": ("#1f77b4", "complete"),
    "PRUNED": ("#999999", "pruned"),
    "FAIL": ("#d62728", "failed"),
    "RUNNING": ("#2ca02c", "running"),
}
TIMELINE_NOTE = (
    "each trial a bar from its start to its end on the GPU it ran on; trials that ran at once "
    "on that GPU on rows of their own"
)
MEMORY_NOTE = (
    "filled: the VRAM peaks of the trials running at each moment, added up (an OOM at what it "
    "was planned to use); dashed: the memory the pool let that GPU's trials use (its usable "
    "memory after the safety margin, halved at the start, cut after an OOM)"
)


def row_name(lane: Lane, row: int) -> str:
    return lane.label if lane.rows == 1 else f"{lane.label} · {row + 1}"


def timeline_figure(lanes: list[Lane]) -> Any:
    figure = go.Figure()
    order = [row_name(lane, r) for lane in lanes for r in range(lane.rows)]
    for state, (colour, legend) in STATE_COLOURS.items():
        bars = [(lane, b) for lane in lanes for b in lane.bars if _state(b.state) == state]
        if not bars:
            continue
        figure.add_trace(
            go.Bar(
                orientation="h",
                base=[b.start for _, b in bars],
                x=[b.seconds * 1000 for _, b in bars],  # a date axis counts in milliseconds
                y=[row_name(lane, b.row) for lane, b in bars],
                marker={"color": colour, "line": {"color": "white", "width": 0.5}},
                name=legend,
                text=[f"#{b.trial}" for _, b in bars],
                textposition="inside",
                insidetextanchor="start",
                textangle=0,
                hovertext=[_hover(b) for _, b in bars],
                hoverinfo="text",
            )
        )
    figure.update_layout(
        title="Trials on each GPU over time",
        xaxis={"type": "date", "title": "time (UTC)"},
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": ""},
        barmode="overlay",
        showlegend=True,  # plotly hides a lone trace's legend: say what the colour means
        height=max(320, 120 + 26 * len(order)),
    )
    return figure


def memory_figure(lanes: list[Lane], events: list[ConcurrencyEvent], until: dt.datetime) -> Any:
    palette = list(plotly_colors.qualitative.Plotly)
    figure = go.Figure()
    for i, lane in enumerate(lanes):
        colour = palette[i % len(palette)]
        held = memory_held(lane.bars)
        figure.add_trace(
            go.Scatter(
                x=held.times, y=held.values, mode="lines", line_shape="hv", fill="tozeroy",
                line={"color": colour, "width": 1.5}, name=f"{lane.label}: held by trials",
            )
        )  # fmt: skip
        limit = allowance(events, lane, until)
        if limit is not None:
            figure.add_trace(
                go.Scatter(
                    x=limit.times, y=limit.values, mode="lines", line_shape="hv",
                    line={"color": colour, "width": 2, "dash": "dash"},
                    name=f"{lane.label}: trials may use",
                )
            )  # fmt: skip
    figure.update_layout(
        title="GPU memory held over time",
        xaxis={"type": "date", "title": "time (UTC)"},
        yaxis={"title": "VRAM (MB)", "rangemode": "tozero"},
    )
    return figure


def memory_note(lanes: list[Lane]) -> tuple[bool, str]:
    """(whether to draw the memory chart, its note or why it is missing)."""
    if not lanes:
        return False, "no trial has run on a device yet"
    if cpu_only(lanes):
        return False, CPU_ONLY_NOTE
    gpu_lanes = [lane for lane in lanes if lane.gpu_name != "cpu"]
    if not any(b.memory_mb is not None for lane in gpu_lanes for b in lane.bars):
        return False, "no trial on a GPU has recorded its VRAM yet"
    return True, MEMORY_NOTE


def timeline_axes(lanes: list[Lane]) -> Any:
    names = [row_name(lane, r) for lane in lanes for r in range(lane.rows)]
    figure, ax = plt.subplots(figsize=(9, max(3.0, 1.2 + 0.3 * len(names))))
    position = {name: len(names) - 1 - i for i, name in enumerate(names)}
    # One collection per row and state (broken_barh), not a patch per trial: a barh per bar
    # took 10 s at 3,000 trials.
    spans: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for lane in lanes:
        for bar in lane.bars:
            left = mdates.date2num(bar.start)
            width = max(mdates.date2num(bar.end) - left, 1e-9)
            spans[(_state(bar.state), position[row_name(lane, bar.row)])].append((left, width))
    for state, (colour, legend) in STATE_COLOURS.items():
        rows = sorted(row for kind, row in spans if kind == state)
        for i, row in enumerate(rows):
            ax.broken_barh(spans[(state, row)], (row - 0.4, 0.8), facecolors=colour,
                           edgecolor="white", label=legend if i == 0 else None)  # fmt: skip
    ax.set_yticks(list(position.values()), list(position))
    ax.xaxis_date()
    ax.set_xlabel("time (UTC)")
    ax.set_title("Trials on each GPU over time")
    ax.legend(fontsize="small", loc="upper right")
    figure.autofmt_xdate()
    return ax


def memory_axes(lanes: list[Lane], events: list[ConcurrencyEvent], until: dt.datetime) -> Any:
    figure, ax = plt.subplots()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, lane in enumerate(lanes):
        colour = colours[i % len(colours)]
        held = memory_held(lane.bars)
        if held.times:
            ax.step(held.times, held.values, where="post", color=colour, label=f"{lane.label}")
            ax.fill_between(held.times, held.values, step="post", color=colour, alpha=0.25)
        limit = allowance(events, lane, until)
        if limit is not None:
            ax.step(limit.times, limit.values, where="post", color=colour, linestyle="--",
                    label=f"{lane.label}: trials may use")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("VRAM (MB)")
    ax.set_title("GPU memory held over time")
    ax.legend(fontsize="small", loc="upper right")
    figure.autofmt_xdate()
    return ax


def _state(state: str) -> str:
    return state if state in STATE_COLOURS else "FAIL"


def _hover(bar: Any) -> str:
    parts = [f"trial #{bar.trial} {bar.state.lower()}", f"{bar.seconds:.1f} s"]
    if bar.batch_size is not None:
        parts.append(f"batch {bar.batch_size}")
    if bar.memory_mb is not None:
        parts.append(f"{bar.memory_mb:,.0f} MB")
    return ", ".join(parts)
