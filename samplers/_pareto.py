"""Pareto dominance, crowding distance and leader tournaments, pure numpy: no Optuna.

Every objective is to be minimised here (the caller flips the maximised ones). A point with a
constraint violation (the sum of its positive constraint values) is worse than any feasible
one, and of two infeasible points the one that violates less is better (Deb's rule, which
NSGA-II uses too).
"""

from __future__ import annotations

import numpy as np


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` is no worse than `b` in every objective and better in one."""
    return bool(np.all(a <= b) and np.any(a < b))


def front(values: np.ndarray, violations: np.ndarray | None = None) -> np.ndarray:
    """Indices of the non-dominated points among those that violate the least (feasible first).

    `values` is (n, k). With no feasible point the archive holds the least-violating points,
    so the swarm is led towards feasibility before anything else.
    """
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=int)
    if violations is None:
        candidates = np.arange(n)
    else:
        violations = np.asarray(violations, dtype=float)
        candidates = np.flatnonzero(violations <= violations.min())
    points = values[candidates]
    keep = []
    for i, point in enumerate(points):
        better_or_equal = np.all(points <= point, axis=1)
        strictly = np.any(points < point, axis=1)
        if not np.any(better_or_equal & strictly):
            keep.append(candidates[i])
    return np.array(keep, dtype=int)


def crowding_distance(values: np.ndarray) -> np.ndarray:
    """NSGA-II's crowding distance of each point of a front: large where the front is sparse.

    The extremes of every objective get infinity, so they are always kept and often led to.
    """
    values = np.asarray(values, dtype=float)
    n, k = values.shape if values.ndim == 2 else (len(values), 1)
    distance = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for j in range(k):
        order = np.argsort(values[:, j], kind="stable")
        column = values[order, j]
        span = column[-1] - column[0]
        distance[order[0]] = distance[order[-1]] = np.inf
        if span > 0:
            distance[order[1:-1]] += (column[2:] - column[:-2]) / span
    return distance


def trim(values: np.ndarray, size: int) -> np.ndarray:
    """Indices of at most `size` points of a front, dropping the most crowded one at a time."""
    kept = np.arange(len(values))
    while len(kept) > size:
        distance = crowding_distance(np.asarray(values)[kept])
        kept = np.delete(kept, int(np.argmin(distance)))
    return kept


def tournament(crowding: np.ndarray, rng: np.random.Generator) -> int:
    """A binary tournament on crowding distance (SMPSO's leader choice): the sparser one wins.

    Two members are drawn at random; the one in the less crowded part of the front leads, so
    the swarm spreads along the front instead of gathering on one point of it.
    """
    n = len(crowding)
    if n == 1:
        return 0
    a, b = rng.choice(n, size=2, replace=False)
    return int(a if crowding[a] >= crowding[b] else b)
