"""What ran, as values: the study's settings (sampler, pruner, seed), when its trials started and
ended, what each objective is called, and its best parameters as YAML. Pure functions over the
study's attributes and trials; the report writes them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.text import to_utc

if TYPE_CHECKING:
    import yaml
    from optuna.trial import FrozenTrial
else:
    yaml = LazyImport("yaml")

NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class RunFacts:
    sampler: str
    pruner: str
    seed: str
    start: dt.datetime | None  # naive UTC: the first trial's start
    end: dt.datetime | None  # naive UTC: the last trial's end (None while none has ended)
    running: int  # trials still running: `end` is then only the last end so far

    @property
    def wall_seconds(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, (self.end - self.start).total_seconds())


def run_facts(spec_attr: Any, trials: Sequence[FrozenTrial]) -> RunFacts:
    """The settings from the study's stored spec (a study made by plain Optuna has none) and the
    span of its trials' datetimes."""
    spec = spec_attr if isinstance(spec_attr, dict) else {}
    starts = [to_utc(t.datetime_start) for t in trials if t.datetime_start is not None]
    ends = [to_utc(t.datetime_complete) for t in trials if t.datetime_complete is not None]
    seed = spec.get("seed")
    return RunFacts(
        sampler=_setting(spec.get("sampler")),
        pruner=_setting(spec.get("pruner")),
        seed=NOT_RECORDED if seed is None else str(seed),
        start=min(starts) if starts else None,
        end=max(ends) if ends else None,
        running=sum(1 for t in trials if t.state.name == "RUNNING"),
    )


def _setting(value: Any) -> str:
    if value is None or value == "":
        return NOT_RECORDED
    if isinstance(value, dict):  # a sampler or pruner object stored by its class and arguments
        name = value.get("name") or value.get("class") or value.get("type")
        return str(name) if name else str(value)
    return str(value)


def wall_text(seconds: float | None) -> str:
    """'1 h 02 min', '3 min 05 s', '12.4 s'; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def objective_names(
    metric_names: Sequence[str] | None, n_objectives: int, adapter_metric: str
) -> list[str]:
    """What each objective is called: the study's metric names (optuna's set_metric_names), else
    the adapter's metric for one objective, else 'objective N'."""
    if metric_names and len(metric_names) == n_objectives:
        return [str(name) for name in metric_names]
    if n_objectives == 1:
        return [adapter_metric]
    return [f"objective {i}" for i in range(n_objectives)]


def params_yaml(params: dict[str, Any]) -> str:
    """The parameters as a YAML mapping, in the order drawn, to paste into a training config."""
    return yaml.safe_dump(dict(params), sort_keys=False, default_flow_style=False)
