"""A particle's candidate moves, and the climb that improves the best of them: pure arithmetic.

Four kinds of candidates, each a place the swarm has a reason to look: draws of the particle's
swarm update (its own momentum, pulled towards its personal best and the swarm's best, as the
plain swarm would step), neighbours of its personal best, neighbours of the study's best
trials, and a few points anywhere. `samplers._model.screen` ranks them with the model.

Everything here is pure: unit-cube positions and numbers in, positions out. `Space` turns a
relative search space into the model's columns; positions are the swarm's coordinates (log
ranges in log space, grids as cells, categorical choices as cells too, but only ever the centre
of one: a categorical parameter moves by switching choices, never along their declared order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import CategoricalDistribution

from samplers._space import grid_bounds, grid_size, to_unit, unit_edges
from samplers._swarm import SwarmCoefficients, dimension_clamp, reflect

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

# A grid of more values than this is searched as if continuous: a step of one value means
# nothing on 64..4096.
_GRID_MAX = 32
# Candidates of each kind per move; chosen on the HPO tables with seeds other than the table's
# (docs/sampler.md).
SWARM_DRAWS = 16
OWN_BEST_NEIGHBOURS = 8
BEST_NEIGHBOURS = 16
TOP_TRIALS = 5
TOP_NEIGHBOURS = 3
ANYWHERE = 12
_LOCAL_SCALES = np.array([0.02, 0.05, 0.1, 0.2])


@dataclass(frozen=True)
class Space:
    """The parameters the screen moves together, in a fixed order, as model columns."""

    names: tuple[str, ...]
    dists: tuple[BaseDistribution, ...]
    choices: np.ndarray  # per column: categorical choices (0 for a numeric parameter)
    grid: np.ndarray  # per column: ordered grid values (0 for continuous or a large grid)
    bounds: tuple[tuple[float, float] | None, ...]  # this process's bounds, on the grid

    @classmethod
    def of(
        cls,
        space: Mapping[str, BaseDistribution],
        bounds: Mapping[str, tuple[float, float]] | None = None,
    ) -> Space:
        names = tuple(sorted(space))
        dists = tuple(space[name] for name in names)
        choices = np.array(
            [len(d.choices) if isinstance(d, CategoricalDistribution) else 0 for d in dists]
        )
        grid = np.array([_small_grid(d) for d in dists])
        bounds = bounds or {}
        on_grid = tuple(
            grid_bounds(d, bounds[n]) if n in bounds and not k else None
            for n, d, k in zip(names, dists, choices, strict=True)
        )
        return cls(names, dists, choices, grid, on_grid)

    def holds(self, record: Any) -> bool:
        """Whether a trial is a point of this space: it ran every parameter with these very
        distributions (not with other choices or another range)."""
        return all(
            record.distributions.get(name) == dist
            for name, dist in zip(self.names, self.dists, strict=True)
        )

    @property
    def categorical(self) -> np.ndarray:
        return self.choices > 0

    def encode(self, params: Mapping[str, Any]) -> np.ndarray:
        """The model's input for values that ran: unit coordinates, choice indices."""
        return self.encode_many([params])[0]

    def encode_many(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """`encode` of many trials' values, a column at a time (a process that starts cold
        reads every finished trial: 10,000 of them in a few milliseconds)."""
        out = np.empty((len(rows), len(self.names)))
        for j, (name, dist) in enumerate(zip(self.names, self.dists, strict=True)):
            column = [row[name] for row in rows]
            if self.choices[j]:
                index = {choice: i for i, choice in enumerate(dist.choices)}
                out[:, j] = [index[value] for value in column]
                continue
            lo, hi, log = unit_edges(dist)
            position = np.asarray(column, dtype=float)
            position = np.log(position) if log else position
            out[:, j] = 0.5 if hi == lo else np.clip((position - lo) / (hi - lo), 0.0, 1.0)
        return out

    def encode_positions(self, u: np.ndarray) -> np.ndarray:
        """The model's input for the values at positions `u` (rows), column by column in
        numpy: what `encode(values_at(...))` gives, without a Python call per value."""
        u = np.clip(np.atleast_2d(u), 0.0, 1.0)
        out = np.empty_like(u)
        for j, dist in enumerate(self.dists):
            k = int(self.choices[j])
            if k:
                out[:, j] = np.minimum(np.floor(u[:, j] * k), k - 1)
            else:
                out[:, j] = _numeric_round_trip(dist, u[:, j], self.bounds[j])
        return out

    def position(self, params: Mapping[str, Any]) -> np.ndarray:
        """The unit coordinates of the cells of values that ran."""
        return np.array(
            [to_unit(d, params[n]) for n, d in zip(self.names, self.dists, strict=True)]
        )


def _numeric_round_trip(
    dist: BaseDistribution, u: np.ndarray, bounds: tuple[float, float] | None
) -> np.ndarray:
    """to_unit(clip_to_bounds(from_unit(dist, u))) for a column of coordinates: the unit
    coordinate of the value each position runs with (see samplers._space)."""
    lo, hi, log = unit_edges(dist)
    raw = lo + u * (hi - lo)
    if log:
        raw = np.exp(raw)
    step = getattr(dist, "step", None)
    if step is not None:
        raw = dist.low + np.round((raw - dist.low) / step) * step
    low, high = bounds if bounds is not None else (dist.low, dist.high)
    value = np.clip(raw, max(low, dist.low), min(high, dist.high))
    if hi == lo:
        return np.full_like(u, 0.5)
    position = np.log(value) if log else value
    return np.clip((position - lo) / (hi - lo), 0.0, 1.0)


def _small_grid(dist: BaseDistribution) -> int:
    size = grid_size(dist)
    return size if size is not None and size <= _GRID_MAX else 0


def snap_choices(space: Space, u: np.ndarray) -> np.ndarray:
    """Positions with each categorical coordinate moved to the centre of its choice's cell."""
    u = np.array(u, dtype=float)
    for j in np.flatnonzero(space.categorical):
        k = space.choices[j]
        u[..., j] = (np.minimum(np.floor(u[..., j] * k), k - 1) + 0.5) / k
    return u


@dataclass(frozen=True)
class Particle:
    """Where a particle is (its latest trial's position and velocity) and what guides it."""

    x: np.ndarray
    v: np.ndarray
    own_best: np.ndarray | None  # the position of its personal best, None before it has one
    holds_best: bool  # its latest trial is the swarm's best: it searches around it instead


def swarm_draws(
    space: Space,
    particle: Particle,
    best: np.ndarray,
    coefficients: SwarmCoefficients,
    grid_reach: float,
    search_radius: float,
    rng: np.random.Generator,
    n: int,
) -> np.ndarray:
    """`n` draws of the particle's swarm update (its random pulls drawn anew for each)."""
    d = len(space.names)
    c = coefficients
    own = particle.x if particle.own_best is None else particle.own_best
    r1, r2 = rng.random((n, d)), rng.random((n, d))
    jitter = search_radius * (2 * rng.random((n, d)) - 1) if particle.holds_best else 0.0
    velocity = (
        c.inertia * particle.v
        + c.cognitive * r1 * (own - particle.x)
        + c.social * r2 * (best - particle.x)
        + jitter
    )
    clamp = np.array(
        [
            dimension_clamp(c.max_velocity, int(g) or None, grid_reach)
            for g in np.where(space.categorical, 0, space.grid)
        ]
    )
    x, _ = reflect(particle.x + np.clip(velocity, -clamp, clamp), velocity)
    # A categorical parameter has no line to move along: it keeps its choice or takes its own
    # best's or the swarm best's, with the weights of the three terms of the update.
    for j in np.flatnonzero(space.categorical):
        weights = np.stack([np.full(n, c.inertia), c.cognitive * r1[:, j], c.social * r2[:, j]])
        pick = (weights / weights.sum(axis=0)).cumsum(axis=0) > rng.random(n)
        source = np.argmax(pick, axis=0)
        x[:, j] = np.choose(source, [particle.x[j], own[j], best[j]])
    return snap_choices(space, x)


def neighbours(space: Space, centre: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` positions near `centre`: a few of its coordinates moved a little.

    Each coordinate moves with probability 2 / d (at least one moves): a continuous one by a
    normal step of a scale drawn from 0.02 to 0.2 of its range, a grid one by one or two grid
    points, a categorical one to another choice.
    """
    d = len(space.names)
    out = np.repeat(centre[None, :], n, axis=0)
    moved = rng.random((n, d)) < min(1.0, 2.0 / d)
    moved[np.arange(n), rng.integers(d, size=n)] = True
    scales = _LOCAL_SCALES[rng.integers(len(_LOCAL_SCALES), size=(n, 1))]
    steps = rng.standard_normal((n, d)) * scales
    cells = np.where(space.categorical, space.choices, space.grid)
    for j in range(d):
        k = int(cells[j])
        rows = moved[:, j]
        if space.categorical[j]:
            current = min(int(centre[j] * k), k - 1)
            other = (current + rng.integers(1, k, size=n)) % k if k > 1 else np.zeros(n)
            out[rows, j] = (other[rows] + 0.5) / k
        elif k > 1:
            jump = rng.choice([-2, -1, 1, 2], p=[0.15, 0.35, 0.35, 0.15], size=n) / k
            out[rows, j] = _fold(centre[j] + jump[rows])
        else:
            out[rows, j] = _fold(centre[j] + steps[rows, j])
    return out


def _fold(x: np.ndarray) -> np.ndarray:
    x = np.where(x < 0, -x, x)
    return np.clip(np.where(x > 1, 2 - x, x), 0.0, 1.0)


def anywhere(space: Space, rng: np.random.Generator, n: int) -> np.ndarray:
    return snap_choices(space, rng.random((n, len(space.names))))


def values_at(space: Space, u: np.ndarray, value: Any) -> dict[str, Any]:
    """The parameter values of position `u`; `value(name, dist, x)` maps one coordinate."""
    return {
        name: value(name, dist, float(x))
        for name, dist, x in zip(space.names, space.dists, u, strict=True)
    }


def single_moves(space: Space, u: np.ndarray) -> np.ndarray:
    """Every position one coordinate away from `u`: another choice, one or two grid points
    either way, or a continuous step of 1, 3 or 10% of the range."""
    columns, coordinates = [], []
    cells = np.where(space.categorical, space.choices, space.grid)
    for j, k in enumerate(cells):
        k = int(k)
        if k > 1:
            here = min(int(u[j] * k), k - 1)
            if space.categorical[j]:
                targets = np.delete(np.arange(k), here)
            else:
                targets = here + np.array([-2, -1, 1, 2])
                targets = targets[(targets >= 0) & (targets < k)]
            values = (targets + 0.5) / k
        else:
            values = _fold(u[j] + np.array(_CLIMB_STEPS))
        columns.append(np.full(len(values), j))
        coordinates.append(values)
    if not columns:
        return np.empty((0, len(u)))
    column, coordinate = np.concatenate(columns), np.concatenate(coordinates)
    rows = np.repeat(u[None, :], len(column), axis=0)
    rows[np.arange(len(column)), column] = coordinate
    return rows


_CLIMB_STEPS = (-0.1, -0.03, -0.01, 0.01, 0.03, 0.1)
CLIMB_STARTS = 3
CLIMB_ROUNDS = 5


def climb(
    space: Space,
    start: np.ndarray,
    start_score: float,
    score: Callable[[np.ndarray], np.ndarray],
    rounds: int,
) -> tuple[np.ndarray, float]:
    """Hill-climb `score` from `start` one coordinate at a time (the model's cheap to ask)."""
    u, best = start, start_score
    for _ in range(rounds):
        moves = single_moves(space, u)
        if not len(moves):
            break
        scores = score(moves)
        i = int(np.argmax(scores))
        if not scores[i] > best:
            break
        u, best = moves[i], float(scores[i])
    return u, best
