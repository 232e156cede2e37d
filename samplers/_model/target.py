"""What the swarm's model is fitted on: the finished trials and one number each to minimise.

One objective: the trial's value (signed so that lower is better). Several: ParEGO's
augmented Chebyshev scalarisation (Knowles 2006) with weights drawn for each trial, so that
each move looks for a different part of the front and the moves of a study cover it all.
Objectives are scaled to [0, 1] by the range the study has seen; a trial that breaks its
constraints (Optuna's convention: values > 0) scores above every feasible one, by how much it
breaks them, so the model leads towards feasibility first.

The kernel's hyperparameters are fitted on the first trials by number (`fit_size`), so that
they change in steps and are fitted once per step; the posterior takes in every trial, at most
`MAX_POINTS` of them (`capped`).
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

import numpy as np

from samplers._model.gp import MAX_POINTS

if TYPE_CHECKING:
    from samplers._history import Record, SwarmView

# ParEGO's weight of the sum beside the maximum: it keeps weakly dominated points behind.
_AUGMENT = 0.05


def model_data(
    view: SwarmView, points: Container[int], rng: np.random.Generator
) -> tuple[list[Record], np.ndarray] | None:
    """The finished trials whose numbers are in `points` (those of the screen's space), by
    trial number, and one value each to minimise; None if fewer than two. `rng` draws the
    scalarisation's weights of a study of several objectives."""
    if view.several:
        records = [r for r in view.complete() if r.number in points]
        if len(records) < 2:
            return None
        values = np.array([r.values for r in records], dtype=float)
        violations = np.array([r.violation for r in records], dtype=float)
        return records, scalarise(values, violations, rng.dirichlet(np.ones(values.shape[1])))
    records = sorted((r for r in view.ranked if r.number in points), key=lambda r: r.number)
    if len(records) < 2:
        return None
    return records, np.array([r.score for r in records], dtype=float)


def fit_size(n: int) -> int:
    """How many trials (the first, by number) the kernel is fitted on when `n` have finished.

    Every count up to 16, then steps of an eighth: between steps the kernel is the same and
    only the posterior takes in the newer trials, so any process (each finds the same first
    trials in the storage) fits it once per step instead of at every ask.
    """
    m = min(n, 16)
    while m >= 16 and m + m // 8 <= n:
        m += m // 8
    return m


def capped(y: np.ndarray) -> np.ndarray:
    """Indices of at most `MAX_POINTS` of the values `y` (in trial-number order): the best half
    and an even spread of the rest."""
    if len(y) <= MAX_POINTS:
        return np.arange(len(y))
    order = np.argsort(y, kind="stable")
    half = MAX_POINTS // 2
    rest = np.sort(order[half:])
    spread = np.linspace(0, len(rest) - 1, MAX_POINTS - half).round().astype(int)
    return np.sort(np.concatenate([order[:half], rest[spread]]))


def scalarise(values: np.ndarray, violations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Augmented Chebyshev values of (n, m) objectives to minimise; infeasible ones above."""
    feasible = violations <= 0
    basis = values[feasible] if feasible.any() else values
    low, high = basis.min(axis=0), basis.max(axis=0)
    scaled = (values - low) / np.where(high > low, high - low, 1.0)
    y = np.max(weights * scaled, axis=1) + _AUGMENT * np.sum(weights * scaled, axis=1)
    if not feasible.all():
        top = y[feasible].max() if feasible.any() else 0.0
        y = np.where(feasible, y, top + 1.0 + violations / max(violations.max(), 1e-12))
    return y
