"""The particle-swarm step, pure numpy: no Optuna, no storage.

Positions live in the unit cube [0, 1]^d. One step of one particle:

    v' = clip(w v + c1 r1 (p - x) + c2 r2 (g - x), -v_max, v_max)
    x' = x + v'   reflected back into [0, 1], with that velocity component reversed

where p is the particle's personal best, g the best of its neighbourhood, and r1, r2 are
uniform in [0, 1) per coordinate.

The defaults (w = 0.6, c1 = c2 = 1.2, v_max = 0.15) are set for short runs. A hyperparameter
study affords about ten generations of a 20-particle swarm, while the textbook constriction
values (w = 0.7298, c1 = c2 = 1.49618, Clerc and Kennedy) are made for thousands of steps and
spend the first generations oscillating across the space. Lower inertia and pulls with a tighter
clamp settle sooner; they stay inside the region where the swarm provably converges
(c1 + c2 < 24 (1 - w^2) / (7 - 5 w), Poli 2009: 2.4 < 3.84). They were chosen on
benchmarks/bench_samplers.py with seeds other than the ones its published table uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SwarmCoefficients:
    inertia: float = 0.6
    cognitive: float = 1.2
    social: float = 1.2
    max_velocity: float = 0.15  # as a fraction of each parameter's range

    def __post_init__(self) -> None:
        for name in ("inertia", "cognitive", "social"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"The `{name}={value}` must be a finite number >= 0.")
        if not (0 < self.max_velocity <= 1):
            raise ValueError(
                f"The `max_velocity={self.max_velocity}` must be in (0, 1]: it is a fraction "
                "of each parameter's range."
            )


def dimension_clamp(max_velocity: float, values: int | None, reach: float) -> float:
    """The velocity clamp of one parameter: `max_velocity`, or longer for a small grid.

    A parameter with `values` grid points (None: continuous) is a line of cells 1/values wide.
    With a clamp of 0.15 a particle crosses one or two of ten cells per step, and a study of
    about five generations cannot bring a particle across the grid to the best: the clamp is
    widened so that one step can cross `reach` cells (at most the whole range).
    """
    if not values:
        return max_velocity
    return min(1.0, max(max_velocity, reach / values))


def reflect(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fold positions back into [0, 1], reversing the velocity of each coordinate that bounced."""
    x = np.asarray(x, dtype=float).copy()
    v = np.asarray(v, dtype=float).copy()
    low, high = x < 0, x > 1
    x[low], x[high] = -x[low], 2 - x[high]
    v[low | high] = -v[low | high]
    # A step longer than the whole range (not possible with max_velocity <= 1) would still land.
    return np.clip(x, 0.0, 1.0), v


def step(
    x: np.ndarray,
    v: np.ndarray,
    personal_best: np.ndarray,
    neighbourhood_best: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    coefficients: SwarmCoefficients = SwarmCoefficients(),  # frozen: one shared default is safe
    jitter: np.ndarray | float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One particle's next (position, velocity); all arrays have the same shape.

    `jitter` is added to the velocity before the clamp: the random search of the particle that
    holds the best, which the two pulls cannot move.
    """
    c = coefficients
    x = np.asarray(x, dtype=float)
    velocity = (
        c.inertia * np.asarray(v, dtype=float)
        + c.cognitive * np.asarray(r1) * (np.asarray(personal_best) - x)
        + c.social * np.asarray(r2) * (np.asarray(neighbourhood_best) - x)
        + jitter
    )
    velocity = np.clip(velocity, -c.max_velocity, c.max_velocity)
    return reflect(x + velocity, velocity)


def back_off(x: float, v: float, evaluated: float, halved: float) -> tuple[float, float]:
    """Where a particle restarts after its trial ran out of memory at coordinate `evaluated`.

    It moves to `halved` (the coordinate of half that batch size) unless it already sits lower,
    and loses any upward speed, so the next step cannot carry it back over the failing size
    except by the pull of a best that did fit.
    """
    return min(x, evaluated, halved), min(v, 0.0)
