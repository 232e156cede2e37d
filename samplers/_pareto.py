"""The swarm's archive of leaders: its front, crowding distance and tournaments, pure numpy: no
Optuna. Dominance itself is the study's one rule, `orchestrator.record.trials.pareto`.

Every objective is to be minimised here (the caller flips the maximised ones). A point with a
constraint violation (the sum of its positive constraint values) is worse than any feasible
one, and of two infeasible points the one that violates less is better (Deb's rule, which
NSGA-II uses too).
"""

from __future__ import annotations

import numpy as np

from orchestrator.record.trials.pareto import non_dominated


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
    return candidates[non_dominated(values[candidates])]


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


def hypervolume_gain(front_points: np.ndarray, reference: np.ndarray, q: np.ndarray) -> np.ndarray:
    """For two objectives: how much each point of `q` (n, 2) would add to the hypervolume of
    `front_points` (non-dominated, (k, 2)) up to `reference`; minus how far it is from adding
    any (the additive epsilon it would need) where it adds nothing.

    The part of q's box that the front already covers is the hypervolume of the front clipped
    to q (max(f, q) per point), which keeps the front's staircase order, so the whole batch is
    a few array operations.
    """
    q = np.atleast_2d(q)
    box = np.prod(np.clip(reference - q, 0.0, None), axis=1)
    if len(front_points) == 0:
        return box
    order = np.argsort(front_points[:, 0], kind="stable")
    f = front_points[order]
    clipped = np.maximum(f[None, :, :], q[:, None, :])  # (n, k, 2), still a staircase
    right = np.concatenate([clipped[:, 1:, 0], np.full((len(q), 1), reference[0])], axis=1)
    widths = np.clip(np.minimum(right, reference[0]) - clipped[:, :, 0], 0.0, None)
    heights = np.clip(reference[1] - clipped[:, :, 1], 0.0, None)
    gain = box - np.sum(widths * heights, axis=1)
    # Where q adds nothing: the smallest shift that would make it not dominated.
    epsilon = np.min(np.max(q[:, None, :] - f[None, :, :], axis=2), axis=1)
    return np.where(gain > 1e-12, gain, -np.maximum(epsilon, 0.0))
