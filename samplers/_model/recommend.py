"""What a study recommends: the configuration its trials say is best, not its luckiest draw.

Optuna's `best_trial` is the best single observation: on a noisy objective it is the trial
whose noise happened to help most, and it ranks far below the best configuration the study
evaluated. Here a noise-aware Gaussian process (`samplers._model.gp`) is fitted on every
finished trial and the recommendation is the evaluated configuration of best posterior mean:
the model pools what neighbouring configurations say, and shrinks a lone lucky draw towards
them. Trials with the same params are one configuration observed several times, and a trial
that carries its repeats (`adapters.repeats`: the `repeat_values` user attribute) counts as
that many observations; a configuration's noise is the kernel's over its count.

Inputs: the params every trial shares, in the unit cube of `samplers._space` (a categorical
column compared by whether two choices differ); a param only some trials have (a conditional
space) is a categorical column, its cell or "absent". Values that are not finite are never
recommended and left out of the model. The fit takes at most `MAX_POINTS` configurations
(`target.capped`: the best half and a spread of the rest) and every evaluated configuration
is scored. Below `MIN_CONFIGURATIONS` there is no model: the best observed trial stands.
Population-based training segments follow `record/trials/best.py`'s rule (a segment's value
is its lineage's so far), as do studies of several objectives without a model.

"expected" is in the objective's units: the model works on normal scores of the values' ranks
(`gp.standardise`), and a posterior mean is mapped back through the same ranks (quantile
mapping: a mean equal to the k-th observed score reads as the k-th observed value, linear in
between), so it is monotone in the model's order and never outside the observed range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints.lineage import is_segment
from orchestrator.record.trials import best as best_rule
from samplers._model.gp import GaussianProcess, one_blas_thread
from samplers._model.inputs import Configuration, configurations, encode
from samplers._model.target import capped

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial
else:
    optuna = LazyImport("optuna")

# Fewer evaluated configurations than this: no model, the best observed trial.
MIN_CONFIGURATIONS = 10
# The recommendation minimises mean + RISK x standard deviation of the posterior (0: the mean).
RISK = 0.0
# The fit's starting noise variances (standardised), the most probable fit kept.
NOISE_STARTS = (0.01, 1.0)


@dataclass(frozen=True)
class Recommendation:
    """The recommended trial beside the luckiest one, and why they differ."""

    trial: FrozenTrial
    expected: float
    observed: float
    repeats: int
    best_observed: FrozenTrial
    reason: str
    modelled: bool = True  # False: too few configurations, the best mean of runs stands


def recommendation(
    trials: Sequence[FrozenTrial], directions: Sequence[str]
) -> Recommendation | None:
    """The study's recommendation from its trials; None when no trial completed with a finite
    value, or for several objectives (see `front`)."""
    if len(directions) != 1:
        return None
    lucky = best_rule.pick_best(trials, directions)
    if lucky is None:
        return None
    if is_segment(lucky):
        return _segment_best(trials, directions)
    sign = 1.0 if directions[0] == "minimize" else -1.0
    configs = configurations(trials, 0, sign)
    mine = next(i for i, c in enumerate(configs) if lucky in c.trials)
    if len(configs) < MIN_CONFIGURATIONS:
        return _unmodelled(configs, configs[mine], sign)
    order, expected = _scored(configs, sign)
    top = configs[order[0]]
    return Recommendation(
        trial=top.trial,
        expected=expected[order[0]],
        observed=sign * top.mean,
        repeats=top.count,
        best_observed=lucky,
        reason=_reason(top, configs[mine], expected[order[0]], expected[mine], sign),
    )


def ranked(
    trials: Sequence[FrozenTrial], directions: Sequence[str]
) -> list[tuple[FrozenTrial, float]]:
    """Every completed configuration, best first by the model, with its expected value (one
    trial each: the best observed of its trials); by observed value when too few for a model."""
    if len(directions) != 1:
        return []
    sign = 1.0 if directions[0] == "minimize" else -1.0
    configs = configurations(trials, 0, sign)
    if len(configs) < MIN_CONFIGURATIONS:
        configs.sort(key=lambda c: (c.mean, c.trial.number))
        return [(c.trial, sign * c.mean) for c in configs]
    order, expected = _scored(configs, sign)
    return [(configs[i].trial, expected[i]) for i in order]


def recommend(study: optuna.Study) -> FrozenTrial:
    """The trial the study recommends (see the module). Raises as `study.best_trial` does:
    RuntimeError for a study of several objectives, ValueError when no trial is complete."""
    _check_study(study, "recommend")
    directions = best_rule.directions_of(study)
    if len(directions) != 1:
        raise RuntimeError(
            "A single recommended trial cannot be named for a study of several objectives: "
            "use recommend_front(study) for the front of the model's expected values."
        )
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if any(is_segment(t) for t in done):
        best = best_rule.best_of_study(study)
        if best is not None:
            return best
    found = recommendation(done, directions)
    if found is None and done:
        raise ValueError(
            f"No trial completed with a finite value ({len(done)} completed with inf or nan)."
        )
    if found is None:
        raise ValueError("No trials are completed yet.")
    return found.trial


def recommend_front(study: optuna.Study) -> list[FrozenTrial]:
    """Several objectives: the evaluated configurations no other one dominates by the model's
    expected values (one trial each), by number."""
    _check_study(study, "recommend_front")
    return front(
        study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)),
        best_rule.directions_of(study),
    )


def front(trials: Sequence[FrozenTrial], directions: Sequence[str]) -> list[FrozenTrial]:
    """The front of posterior means over feasible evaluated configurations; the front of the
    observed values (`best.pareto_front`) when too few for a model or for one objective."""
    from orchestrator.record.trials import pareto

    feasible = [t for t in trials if best_rule.feasible(t)]
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    per = [configurations(feasible, j, s) for j, s in enumerate(signs)]
    if len(directions) < 2 or len(per[0]) < MIN_CONFIGURATIONS:
        return best_rule.pareto_front(trials, directions)
    # The configurations finite on every objective, in the same order for each.
    shared = set.intersection(*({c.key for c in p} for p in per))
    per = [[c for c in p if c.key in shared] for p in per]
    means = np.column_stack([_posterior_means(p)[0] for p in per])
    keep = pareto.non_dominated(means)
    return sorted((per[0][i].trial for i in keep), key=lambda t: t.number)


def _check_study(study: Any, name: str) -> None:
    if not isinstance(study, optuna.Study):
        raise TypeError(
            f"{name}() takes an optuna.Study (optuna.load_study(study_name=..., storage=...)), "
            f"not {type(study).__name__}."
        )


def _scored(configs: list[Configuration], sign: float) -> tuple[np.ndarray, list[float]]:
    """The configurations' order by the model (best first) and their expected values."""
    means, sds, to_units = _posterior_means(configs)
    score = means + RISK * sds
    order = np.lexsort(([c.trial.number for c in configs], score))
    return order, [sign * float(v) for v in to_units(means)]


def _posterior_means(configs: list[Configuration]) -> tuple[np.ndarray, np.ndarray, Any]:
    """Posterior means and standard deviations (standardised, lower is better) at every
    configuration, and the map from standardised means to the objective's units (to minimise)."""
    x, categorical = encode(configs)
    y = np.array([c.mean for c in configs])
    counts = np.array([c.count for c in configs], dtype=float)
    use = capped(y)
    with one_blas_thread():
        gp = GaussianProcess(
            x[use], y[use], categorical, counts=counts[use], noise_starts=NOISE_STARTS
        )
        mean, variance = gp.posterior(x)
    scores, raw = np.sort(gp.y), np.sort(y[use])
    return mean, np.sqrt(variance), lambda m: np.interp(m, scores, raw)


def _segment_best(trials: Sequence[FrozenTrial], directions: Sequence[str]) -> Recommendation:
    """Population-based training: the best trial by `best.py`'s rule for segments."""
    best = best_rule.best_of_study(_TrialsAsStudy(trials, directions))
    assert best is not None
    return _plain(
        best,
        best,
        1,
        "population-based training: the best lineage's last segment, as `best` names it",
    )


def _unmodelled(configs: list[Configuration], lucky: Configuration, sign: float) -> Recommendation:
    """Too few configurations for a model: the configuration of best mean over its runs (a
    configuration run several times pools its runs, as `ranked` orders them)."""
    top = min(configs, key=lambda c: (c.mean, c.trial.number))
    few = (
        f"only {len(configs)} configuration{'' if len(configs) == 1 else 's'} finished: "
        "too few for a model"
    )
    if top is lucky and top.count == 1:
        reason = f"{few}, the best observed trial stands"
    elif top is lucky:
        reason = f"{few}; the best observed trial's configuration is also the best on average"
    else:
        reason = (
            f"{few}; trial {lucky.trial.number} observed {_g(sign * lucky.mean)} "
            f"{_times(lucky.count)}, trial {top.trial.number}'s configuration "
            f"{_g(sign * top.mean)} {_times(top.count)}"
        )
    value = sign * top.mean
    return Recommendation(top.trial, value, value, top.count, lucky.trial, reason, False)


def _plain(trial: FrozenTrial, lucky: FrozenTrial, repeats: int, reason: str) -> Recommendation:
    value = float(trial.values[0])
    return Recommendation(trial, value, value, repeats, lucky, reason, False)


def _reason(
    top: Configuration, lucky: Configuration, expected: float, lucky_expected: float, sign: float
) -> str:
    if top is lucky:
        return "the best observed trial is also the model's best"
    return (
        f"trial {lucky.trial.number} observed {_g(sign * lucky.mean)} {_times(lucky.count)}; "
        f"the model expects {_g(lucky_expected)} there and {_g(expected)} at trial "
        f"{top.trial.number} (observed {_g(sign * top.mean)} {_times(top.count)})"
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"on average over {count} runs"


def _g(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class _TrialsAsStudy:
    """The few read-only parts of a study that `best.best_of_study` reads, over a list of
    trials: the rule for segments of population-based training is stated once, there."""

    def __init__(self, trials: Sequence[FrozenTrial], directions: Sequence[str]) -> None:
        self._trials = list(trials)
        self.directions = [optuna.study.StudyDirection[d.upper()] for d in directions]
        self._names = list(directions)

    @property
    def best_trial(self) -> FrozenTrial:
        best = best_rule.pick_best(self._trials, self._names)
        if best is None:
            raise ValueError("No trials are completed yet.")
        return best

    def get_trials(self, deepcopy: bool = False, states: Any = None) -> list[FrozenTrial]:
        return [t for t in self._trials if states is None or t.state in states]
