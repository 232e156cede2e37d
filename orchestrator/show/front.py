"""A study of several objectives has no one best trial but a front of them: what `best` shows.

The front is orchestrator.record.trials.best's (completed, feasible, not dominated); here it is
shaped with the study's names for its values and written as a table for a person.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.record.trials.best import pareto_front

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


@dataclass(frozen=True)
class FrontTrial:
    """A trial on a study's Pareto front: its values by objective name, and its parameters."""

    number: int
    values: dict[str, float]
    params: dict[str, Any]


def objective_names(metric_names: Sequence[str] | None, count: int) -> list[str]:
    """The study's names for its values (`study.set_metric_names`), else "value 0", ..."""
    if metric_names and len(metric_names) == count:
        return list(metric_names)
    return [f"value {i}" for i in range(count)]


def front_of(
    trials: Iterable[FrozenTrial], directions: Sequence[str], metric_names: Sequence[str] | None
) -> list[FrontTrial]:
    """The Pareto front (orchestrator.record.trials.best's rule), as `best` shows it."""
    names = objective_names(metric_names, len(directions))
    return [
        FrontTrial(t.number, dict(zip(names, t.values, strict=True)), dict(t.params))
        for t in pareto_front(trials, directions)
    ]


def front_table(front: list[Any], names: list[str]) -> str:
    """The Pareto front as a table a person reads: a trial per row, its values, its parameters."""
    params = sorted({key for trial in front for key in trial.params})
    header = ["trial", *names, *params]
    rows = [
        [
            f"#{t.number}",
            *(f"{t.values[n]:.6g}" for n in names),
            *(_cell(t.params.get(p)) for p in params),
        ]
        for t in front
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    head = "  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True))
    return "\n".join([head.rstrip(), *(line.rstrip() for line in lines)]) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
