"""The best trial of a study: one rule for every place that names it.

The best trial is the completed trial with the best value in the study's direction, the lowest
number winning a tie; a value that is not finite (NaN, inf, -inf: Optuna stores the last two as
COMPLETE) is never best. There is none while no trial has completed, and
none in a study of several objectives: its trials carry several values and no single one is best
(its Pareto front is, which optuna-dashboard shows).

Population-based training: a segment's value is its lineage's at the segment's end, so among
trials of which any is a segment only those whose lineages trained furthest compare (a value from
the middle of training is no final one). A budget that is not a whole number of runs of the
population, or a study stopped and resumed, leaves some lineages short of the others: they are
not the answer.

The pool's progress, `run`'s outcome, `status`, `best` and the report all ask here (`pick_best`
holds the whole rule), so they name the same trial.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints.lineage import (
    TRAIN_UNTIL_EPOCH,
    epochs_trained,
    is_segment,
    lineage_of,
    schedule,
    weights_of,
)

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from orchestrator.record.trials import pareto
else:
    optuna = LazyImport("optuna")
    pareto = LazyImport("orchestrator.record.trials.pareto")


def directions_of(study: optuna.Study) -> list[str]:
    """'minimize' or 'maximize' per objective, read without `study.direction` (which raises on a
    study of several objectives)."""
    return [direction.name.lower() for direction in study.directions]


def pick_best(trials: Iterable[FrozenTrial], directions: Sequence[str]) -> FrozenTrial | None:
    """The best of these trials for a study with these directions (see the module's rule)."""
    if len(directions) != 1:
        return None
    # `values`, not `value`: reading `value` of a multi-objective trial raises.
    done = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.values is not None
        and len(t.values) == 1
        and math.isfinite(t.values[0])
    ]
    if not done:
        return None
    if any(is_segment(t) for t in done):
        done = _trained_furthest(done)
    sign = 1.0 if directions[0] == "minimize" else -1.0
    return min(done, key=lambda t: (sign * t.values[0], t.number))


def best_of_study(study: optuna.Study) -> FrozenTrial | None:
    """The study's best trial, found by its storage in one ordered query however many trials it
    holds; None when no trial has completed or the study has several objectives.

    Among trials tied on the best value the storage's query picks one; `pick_best` over all the
    trials picks the lowest number."""
    directions = directions_of(study)
    if len(directions) != 1:
        return None  # `study.best_trial` would raise RuntimeError
    try:
        trial = study.best_trial
    except ValueError:  # no completed trial yet
        return None
    best = pick_best([trial], directions)
    # An inf or -inf at the top of the query: the finite ones, read whole. A segment of
    # population-based training (or a trial that trains to a set epoch, as a re-run of one
    # does): the rule needs every lineage, so every completed trial is read.
    if best is None or is_segment(best) or TRAIN_UNTIL_EPOCH in best.user_attrs:
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        best = pick_best(done, directions)
    return best


def _trained_furthest(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The segments whose lineages trained the most epochs (the module's rule)."""
    segments = [t for t in trials if is_segment(t)]
    furthest = max(epochs_trained(t) for t in segments)
    return [t for t in segments if epochs_trained(t) == furthest]


def feasible(trial: FrozenTrial) -> bool:
    """Not marked infeasible by its constraints (Optuna's: each value <= 0 is met;
    orchestrator.record.study.objectives marks a trial that ran out of memory)."""
    return all(float(c) <= 0.0 for c in trial.constraints.values())


def pareto_front(trials: Iterable[FrozenTrial], directions: Sequence[str]) -> list[FrozenTrial]:
    """The completed, feasible trials no other one dominates (at least as good on every
    objective and better on one), by number; of equal values the lowest number stands for all.
    For one objective it is the best trial."""
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    done = [
        t
        for t in sorted(trials, key=lambda t: t.number)
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.values is not None
        and len(t.values) == len(signs)
        and not any(math.isnan(v) for v in t.values)
        and feasible(t)
    ]
    keys = [tuple(s * v for s, v in zip(signs, t.values, strict=True)) for t in done]
    return [done[i] for i in pareto.non_dominated(keys) if keys[i] not in keys[:i]]


def best_lineage(trials: Iterable[FrozenTrial], best: int | None) -> dict | None:
    """The lineage of trial `best` when it is a segment of population-based training (None
    otherwise): its segments' numbers, its schedule of params over epochs, and where its
    weights are (its latest checkpoint, or None when it saved none)."""
    by_number = {t.number: t for t in trials}
    trial = by_number.get(best) if best is not None else None
    if trial is None or not is_segment(trial):
        return None
    chain = lineage_of(trial, by_number)
    return {
        "trials": [t.number for t in chain],
        "schedule": schedule(chain),
        "weights": weights_of(trial),
    }
