"""What the study's selected trial scored where no trial was selected on: stored with the study.

A study selects its best trial on the validation score, so that score is biased upward (the best
of N noisy runs). `FinalScores` holds what can be trusted beside it: the top trials re-run with
more seeds (their mean and spread), the selected trial's score on the untouched test part, and
the baselines (buy-and-hold, flat, random) on the same validation and test parts. It is kept in
the study's user attributes under `FINAL_SCORES_ATTR` (optuna-dashboard shows them), written by
`run` at the end of a study and by `best --confirm`, read by `best`, `status` and the report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

FINAL_SCORES_ATTR = "final_scores"


@dataclass(frozen=True)
class Confirmed:
    """One trial re-run with several seeds."""

    trial: int
    validation: float  # the value the study selected it on
    values: list[float]  # one per seed
    mean: float
    std: float


@dataclass(frozen=True)
class FinalScores:
    selected_trial: int
    validation: float  # the selected trial's own value in the study
    metric: str
    # With --repeats: the seeds' scores behind `validation` (their mean) and their spread.
    validation_values: list[float] = field(default_factory=list)
    validation_std: float | None = None
    seeds: int = 1  # seeds behind `test` (and each confirmed mean)
    test: float | None = None  # mean over `seeds`; None when the adapter has no test part
    test_std: float | None = None
    test_values: list[float] = field(default_factory=list)
    confirmed: list[Confirmed] = field(default_factory=list)  # re-ranked, best first
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    complete_trials: int = 0  # the study's completed trials (finite values) when it was scored
    selected_params: dict[str, Any] = field(default_factory=dict)  # the selected trial's

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> FinalScores:
        known = set(cls.__dataclass_fields__)
        data = {k: v for k, v in value.items() if k in known}
        data["confirmed"] = [Confirmed(**c) for c in data.get("confirmed", [])]
        return cls(**data)


def valued_trials(trials: Iterable[FrozenTrial]) -> int:
    """The completed trials with a finite value: what `complete_trials` counts."""
    from optuna.trial import TrialState

    return sum(
        1
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.values  # `value` raises on a trial of several objectives
        and all(math.isfinite(v) for v in t.values)
    )


def is_current(scores: FinalScores, trials: Iterable[FrozenTrial]) -> bool:
    """Whether no trial has completed since the scores were stored: a confirmation ranked the
    model's top configurations of that study, and a later trial may have displaced them."""
    return scores.complete_trials == valued_trials(trials)


def save_final_scores(study: optuna.Study, scores: FinalScores) -> None:
    study.set_user_attr(FINAL_SCORES_ATTR, scores.as_dict())


def final_scores_of(user_attrs: dict[str, Any]) -> FinalScores | None:
    """The stored scores in a study's user attributes; None where none were stored (or are of
    another shape: an older writer's)."""
    value = user_attrs.get(FINAL_SCORES_ATTR)
    if not isinstance(value, dict):
        return None
    try:
        return FinalScores.from_dict(value)
    except (TypeError, KeyError):
        return None
