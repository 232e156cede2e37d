"""Parallel coordinates that stay readable with many parameters: the most important first, capped.

Optuna's own chart puts every parameter on an axis in alphabetical order, which for PPO's 11
parameters is a wall of lines. Here the axes are the metric and then at most `MAX_AXES`
parameters, most important first: PED-ANOVA importances when enough trials completed, else the
strength of each parameter's rank correlation with the value (a cheap proxy that needs no model).
Log-scale parameters get a log axis, categorical ones one tick per choice.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.importance import importance_evaluator

if TYPE_CHECKING:
    import matplotlib.cm as mcm
    import matplotlib.collections as mcoll
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
    import optuna
    import plotly.graph_objects as go
    from optuna.trial import FrozenTrial
else:
    mcm = LazyImport("matplotlib.cm")
    mcoll = LazyImport("matplotlib.collections")
    mcolors = LazyImport("matplotlib.colors")
    plt = LazyImport("matplotlib.pyplot")
    optuna = LazyImport("optuna")
    go = LazyImport("plotly.graph_objects")

MAX_AXES = 8  # parameters drawn; the note says how many were left out


@dataclass(frozen=True)
class ParamRanking:
    names: list[str]  # every parameter, most important first
    method: str  # "PED-ANOVA" or "rank correlation"

    def shown(self, limit: int = MAX_AXES) -> list[str]:
        return self.names[:limit]

    def note(self, limit: int = MAX_AXES) -> str:
        total = len(self.names)
        if total <= limit:
            return f"parameters ordered by importance ({self.method}), most important first"
        return (
            f"the {limit} most important of {total} parameters ({self.method}), "
            "most important first"
        )


def rank_parameters(
    study: optuna.Study, trials: Sequence[FrozenTrial], *, min_for_importance: int
) -> ParamRanking:
    """Order the parameters of the completed trials by how much they matter to the value."""
    names = sorted({name for t in trials for name in t.params})
    if len(trials) >= min_for_importance:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scores = optuna.importance.get_param_importances(
                    study, evaluator=importance_evaluator()
                )
            ordered = [n for n in scores if n in names]
            return ParamRanking(ordered + [n for n in names if n not in ordered], "PED-ANOVA")
        except (ValueError, RuntimeError, ZeroDivisionError):
            pass  # too few distinct values, or one the evaluator rejects: use the proxy
    scores = {name: explained_share(trials, name) for name in names}
    return ParamRanking(sorted(names, key=lambda n: (-scores[n], n)), "share of the value's spread")


def explained_share(trials: Sequence[FrozenTrial], name: str) -> float:
    """How much of the spread of the value's ranks the parameter explains (the correlation ratio,
    eta squared): trials grouped by the parameter's choice, or by quantile bins of a number, so an
    optimum in the middle of a range counts as much as a trend. 0 when nothing can be said."""
    pairs = [(t.params[name], t.value) for t in trials if name in t.params and t.value is not None]
    if len(pairs) < 4:
        return 0.0
    pairs.sort(key=lambda pair: _sort_key(pair[0]))
    ranks = _ranks([value for _, value in pairs])
    numeric = all(_is_number(x) for x, _ in pairs)
    if numeric:
        bins = max(2, min(6, len(pairs) // 4))
        groups = [ranks[i * len(ranks) // bins : (i + 1) * len(ranks) // bins] for i in range(bins)]
    else:
        by_choice: dict[Any, list[float]] = {}
        for (x, _), r in zip(pairs, ranks, strict=True):
            by_choice.setdefault(x, []).append(r)
        groups = list(by_choice.values())
    mean = sum(ranks) / len(ranks)
    total = sum((r - mean) ** 2 for r in ranks)
    between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups if g)
    return 0.0 if total == 0 else between / total


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if _is_number(value) else (1, 0, str(value))


def _ranks(values: Sequence[Any]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


@dataclass(frozen=True)
class Axis:
    """One axis: positions of each trial on it (log10 for a log parameter, index for a choice)."""

    label: str
    values: list[float]
    kind: str = "number"  # "number", "log" (values are log10) or "choice" (values are indices)
    tickvals: list[float] | None = None
    ticktext: list[str] | None = None


def axes_for(trials: Sequence[FrozenTrial], names: Sequence[str], metric: str) -> list[Axis]:
    """The metric's axis, then one per parameter; trials lacking a parameter are left out."""
    rows = [t for t in trials if t.value is not None and all(n in t.params for n in names)]
    axes = [Axis(metric, [float(t.value) for t in rows])]
    for name in names:
        dist = next(t.distributions[name] for t in rows) if rows else None
        values = [t.params[name] for t in rows]
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            choices = [c for c in dist.choices if c in set(values)] or list(dist.choices)
            index = {c: i for i, c in enumerate(choices)}
            axes.append(
                Axis(
                    name,
                    [float(index[v]) for v in values],
                    "choice",
                    list(map(float, range(len(choices)))),
                    [str(c) for c in choices],
                )
            )
        elif getattr(dist, "log", False):
            logs = [math.log10(v) for v in values]
            ticks = list(
                range(math.floor(min(logs, default=0)), math.ceil(max(logs, default=0)) + 1)
            )
            axes.append(
                Axis(name, logs, "log", [float(t) for t in ticks], [f"1e{t}" for t in ticks])
            )
        else:
            axes.append(Axis(name, [float(v) for v in values]))
    return axes


def plotly_parallel(axes: Sequence[Axis], *, metric: str, reverse: bool) -> Any:
    dimensions = []
    for axis in axes:
        dim: dict[str, Any] = {"label": axis.label, "values": axis.values}
        if axis.tickvals is not None:
            dim.update(tickvals=axis.tickvals, ticktext=axis.ticktext)
        dimensions.append(dim)
    line = {
        "color": axes[0].values,
        "colorscale": [[0.0, "#9ecae1"], [1.0, "#08306b"]],  # no near-white end
        "reversescale": reverse,  # the best trials darkest
        "showscale": True,
        "colorbar": {"title": {"text": metric}},
    }
    figure = go.Figure(go.Parcoords(dimensions=dimensions, line=line, labelangle=-20))
    figure.update_layout(title="Parallel coordinates", margin={"t": 110})
    return figure


def matplotlib_parallel(axes: Sequence[Axis], *, metric: str, reverse: bool) -> Any:
    figure, ax = plt.subplots()
    n = len(axes[0].values)
    scaled = []
    for axis in axes:
        lo, hi = min(axis.values, default=0.0), max(axis.values, default=1.0)
        span = (hi - lo) or 1.0
        scaled.append([(v - lo) / span for v in axis.values])
    norm = mcolors.Normalize(min(axes[0].values, default=0), max(axes[0].values, default=1))
    # Blues without its near-white end, which vanishes on the background; best trials darkest.
    blues = plt.get_cmap("Blues")([0.3 + 0.7 * i / 255 for i in range(256)])
    cmap = mcolors.ListedColormap(blues[::-1] if reverse else blues)
    # The best trials drawn last, on top; one collection, not a line each (thousands of trials).
    order = sorted(range(n), key=lambda i: axes[0].values[i], reverse=reverse)
    lines = [list(zip(range(len(axes)), [s[i] for s in scaled], strict=True)) for i in order]
    shades = [cmap(norm(axes[0].values[i])) for i in order]
    ax.add_collection(mcoll.LineCollection(lines, colors=shades, linewidths=1.2, alpha=0.8))
    ax.set_xlim(-0.2, len(axes) - 0.5)
    for x, axis in enumerate(axes):
        ax.axvline(x, color="#888", linewidth=0.8)
        for position, text in axis_labels(axis):
            ax.text(x + 0.04, position, text, ha="left", va="center", fontsize=7)
    ax.set_xticks(range(len(axes)), [a.label for a in axes], rotation=20, ha="right")
    ax.set_yticks([])
    ax.set_ylim(-0.12, 1.12)
    ax.set_title("Parallel coordinates (most important parameters first)")
    figure.colorbar(mcm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=metric)
    return ax


def axis_labels(axis: Axis) -> list[tuple[float, str]]:
    """Where to write what on a 0..1 axis: every choice, else the lowest and highest value."""
    lo, hi = min(axis.values, default=0.0), max(axis.values, default=1.0)
    span = (hi - lo) or 1.0
    if axis.kind == "choice" and axis.tickvals and axis.ticktext:
        shown = [(v, t) for v, t in zip(axis.tickvals, axis.ticktext, strict=True) if lo <= v <= hi]
        return [((v - lo) / span, t) for v, t in shown]
    if axis.kind == "log":
        lo, hi = 10**lo, 10**hi
    return [(0.0, _number(lo)), (1.0, _number(hi))]


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
