"""Pareto dominance, the one rule for a study of several objectives, pure numpy: no Optuna.

Every objective is to be minimised here (the caller flips the maximised ones). Both the study's
Pareto front (`orchestrator.record.trials.best.pareto_front`, what `best`, `status`, the report
and the result show) and the swarm's archive of leaders (`samplers._pareto.front`) ask here, so
the trials a user sees on the front are the ones the sampler leads with.
"""

from __future__ import annotations

import numpy as np


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` is no worse than `b` in every objective and better in one."""
    return bool(np.all(a <= b) and np.any(a < b))


def non_dominated(points: np.ndarray) -> np.ndarray:
    """Indices, in order, of the points (n, k) that no other point dominates; equal points
    dominate neither, so each of them is kept."""
    points = np.asarray(points, dtype=float)
    keep = []
    for i, point in enumerate(points):
        better_or_equal = np.all(points <= point, axis=1)
        strictly = np.any(points < point, axis=1)
        if not np.any(better_or_equal & strictly):
            keep.append(i)
    return np.array(keep, dtype=int)
