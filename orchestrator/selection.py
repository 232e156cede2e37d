"""Scores to trust for the trial a study selected: confirmed on more seeds, tested once.

A study's best value is the best of many noisy runs, picked on the part of the data it is then
quoted on. At the end of a study (`run --confirm K`, and `best --confirm K` any time after):

1. the top K completed trials are trained again with `seeds` seeds each (the adapter's `seed`
   option, seed .. seed + seeds - 1, as `--repeats` does) and ranked again on the mean: the
   re-run that decides is the intensification step of SMAC and similar tuners;
2. the trial ranked first is trained again with each seed on everything before the test part and
   scored once on the test part, which no trial has seen (`adapter.final_scores`);
3. the adapter's baselines are scored on the same validation and test parts.

With K = 0 only steps 2 and 3 run, with the study's own seed. An adapter without a test part or
baselines gives what it has. The result is stored with the study (`record/final_scores`).
"""

from __future__ import annotations

import logging
import statistics
from typing import TYPE_CHECKING, Any

from orchestrator.record.final_scores import Confirmed, FinalScores

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna.trial import FrozenTrial

    from orchestrator.record.study import StudySpec

logger = logging.getLogger(__name__)

DEFAULT_CONFIRM_SEEDS = 3


def _ignore(step: int, value: float) -> None:
    """A report that prunes nothing: re-runs are not trials of the study."""


def _spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def top_trials(trials: list[FrozenTrial], direction: str, count: int) -> list[FrozenTrial]:
    """The `count` best completed trials with a finite value, best first."""
    import math

    from optuna.trial import TrialState

    done = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
    ]
    sign = -1.0 if direction == "maximize" else 1.0
    return sorted(done, key=lambda t: (sign * float(t.value), t.number))[: max(count, 1)]


def confirm(
    adapter: Any,
    spec: StudySpec,
    trials: list[FrozenTrial],
    device: torch.device,
    *,
    top: int,
    seeds: int,
) -> list[Confirmed]:
    """The `top` trials re-run with `seeds` seeds each, ranked again on their mean."""
    from adapters.repeats import seeded

    confirmed = []
    for trial in top_trials(trials, spec.direction, top):
        values = [
            float(
                adapter.train(
                    trial.params,
                    epochs=spec.epochs,
                    device=device,
                    options=seeded(spec.options, offset),
                    report=_ignore,
                )
            )
            for offset in range(seeds)
        ]
        mean, std = _spread(values)
        confirmed.append(Confirmed(trial.number, float(trial.value), values, mean, std))
        logger.info("trial #%d confirmed on %d seeds: %.4g +- %.3g", trial.number, seeds, mean, std)
    sign = -1.0 if spec.direction == "maximize" else 1.0
    return sorted(confirmed, key=lambda c: (sign * c.mean, c.trial))


def score_selection(
    study: optuna.Study,
    spec: StudySpec,
    adapter: Any,
    device: torch.device,
    *,
    top: int = 0,
    seeds: int = DEFAULT_CONFIRM_SEEDS,
) -> FinalScores | None:
    """Steps 1-3 of the module's docstring; None while no trial has completed."""
    from adapters.repeats import seeded

    trials = study.get_trials(deepcopy=False)
    if not top_trials(trials, spec.direction, 1):
        return None
    confirmed = confirm(adapter, spec, trials, device, top=top, seeds=seeds) if top else []
    selected = (
        next(t for t in trials if t.number == confirmed[0].trial)
        if confirmed
        else top_trials(trials, spec.direction, 1)[0]
    )
    runs = seeds if confirmed else 1
    test_values: list[float] = []
    if callable(getattr(adapter, "final_scores", None)):
        for offset in range(runs):
            scores = adapter.final_scores(
                selected.params,
                epochs=spec.epochs,
                device=device,
                options=seeded(spec.options, offset),
            )
            test_values.append(float(scores["test"]))
    baselines = (
        adapter.baselines(spec.options) if callable(getattr(adapter, "baselines", None)) else {}
    )
    test, test_std = _spread(test_values) if test_values else (None, None)
    metric = getattr(adapter, "metric_for", lambda o: getattr(adapter, "metric", "value"))(
        spec.options
    )
    return FinalScores(
        selected_trial=selected.number,
        validation=float(selected.value),
        metric=str(metric),
        seeds=runs,
        test=test,
        test_std=test_std,
        test_values=test_values,
        confirmed=confirmed,
        baselines=baselines,
    )
