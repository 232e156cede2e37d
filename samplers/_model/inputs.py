"""Finished trials as configurations and model inputs, for a model of any study.

The swarm's model reads its own particle records; a recommendation reads whatever trials a
study holds, from any sampler, so it starts from params alone. A configuration is one set of
params: the trials that ran it pool their values, and a trial carrying its repeats
(`adapters.repeats`) counts as that many observations. Its inputs are the unit-cube
coordinates of `samplers._space` per param; a categorical param is a column of choice indices,
and a param that only some configurations have (a conditional space), or whose value its most
common distribution cannot place, a categorical column of cells where "absent" is one more.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import CategoricalDistribution

from samplers._space import to_unit

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

# The trial user attribute of adapters.repeats (each seed's score; the value is their mean).
REPEAT_VALUES_ATTR = "repeat_values"
_ABSENT = -1.0


@dataclass
class Configuration:
    """One set of params: its trials, their pooled value (to minimise) and how many
    observations it pools; `trial` is its best observed trial (the one named for it)."""

    key: tuple
    trials: list[FrozenTrial]
    mean: float
    count: int

    @property
    def trial(self) -> FrozenTrial:
        return self.trials[0]


def configurations(
    trials: Sequence[FrozenTrial], objective: int, sign: float
) -> list[Configuration]:
    """The completed trials with a finite value of `objective` (times `sign`: lower is
    better), grouped by params, in the order of their first trial's number."""
    from optuna.trial import TrialState

    groups: dict[tuple, list[tuple[float, int, FrozenTrial]]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        values = t.values
        if t.state != TrialState.COMPLETE or values is None or len(values) <= objective:
            continue
        value = float(values[objective])
        if not math.isfinite(value):
            continue
        count = _repeats(t) if len(values) == 1 else 1
        groups.setdefault(_key(t.params), []).append((sign * value, count, t))
    out = []
    for key, runs in groups.items():
        count = sum(n for _, n, _ in runs)
        mean = sum(v * n for v, n, _ in runs) / count
        runs.sort(key=lambda r: (r[0], r[2].number))
        out.append(Configuration(key, [t for _, _, t in runs], mean, count))
    return out


def _repeats(trial: FrozenTrial) -> int:
    """How many observations the trial's value is the mean of: its repeats, else one."""
    stored = trial.user_attrs.get(REPEAT_VALUES_ATTR)
    if isinstance(stored, list) and stored:
        return len(stored)
    return 1


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((name, repr(value)) for name, value in params.items()))


def encode(configs: Sequence[Configuration]) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) inputs of the configurations and which columns are categorical."""
    names = sorted({name for c in configs for name in c.trial.params})
    columns, categorical = [], []
    for name in names:
        dists = Counter(
            c.trial.distributions[name] for c in configs if name in c.trial.distributions
        )
        dist = dists.most_common(1)[0][0]
        cells = [
            _cell(dist, c.trial.params.get(name, _ABSENT), name in c.trial.params) for c in configs
        ]
        columns.append(cells)
        categorical.append(isinstance(dist, CategoricalDistribution) or _ABSENT in cells)
    if not columns:
        return np.zeros((len(configs), 1)), np.array([True])
    return np.array(columns, dtype=float).T, np.array(categorical, dtype=bool)


def _cell(dist: Any, value: Any, present: bool) -> float:
    """The value's coordinate (a choice's index for a categorical one); `_ABSENT` when the
    trial lacks the param or `dist` cannot place it."""
    if not present:
        return _ABSENT
    try:
        if isinstance(dist, CategoricalDistribution):
            return float(dist.choices.index(value))
        if not dist._contains(dist.to_internal_repr(value)):
            return _ABSENT
        return to_unit(dist, value)
    except (ValueError, TypeError):
        return _ABSENT
