"""The surrogate screen for two objectives: moves chosen by the hypervolume they may add.

One Gaussian process per objective (`samplers._model.gp`), fitted on every finished trial. The
front is the non-dominated set of the posterior means at the finished trials and at the
running ones (those as fantasies: they will be on it or not, and a move should not repeat
them). A candidate is scored by the hypervolume that its optimistic point, the posterior mean
less one standard deviation in each objective, would add to that front; a candidate that
would add none scores by how far it is from adding any. The guides are the swarm's own: the
leader is drawn from the front by a tournament on crowding distance, so the swarm spreads
along it, and the next candidates come from around other members of the front.

Studies with constraints or with more than two objectives step as the plain multi-objective
swarm does (`samplers._leaders`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from samplers._leaders import personal_best
from samplers._model.candidates import TOP_TRIALS, Space
from samplers._model.gp import GaussianProcess, cached_kernel, fit_kernel, standardise
from samplers._model.screen import (
    barrier,
    guided_candidates,
    moved_to,
    particle_state,
    pick,
    running_inputs,
)
from samplers._model.target import capped, fit_size
from samplers._pareto import crowding_distance, front, hypervolume_gain, tournament

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from samplers._history import Record, SwarmView
    from samplers._moves import Move, Swarm

# How optimistic a candidate's point is: the mean less this many standard deviations.
OPTIMISM = 0.3


def front_move(
    swarm: Swarm,
    view: SwarmView,
    entropy: int,
    number: int,
    space: Mapping[str, BaseDistribution],
) -> tuple[dict[str, Any], dict[str, Move]] | None:
    """Trial `number`'s values and moves for a study of two objectives; None where the plain
    swarm steps instead (constraints, another number of objectives, fewer than two trials)."""
    shape = Space.of(space, swarm.bounds)
    rng = np.random.default_rng([entropy, number, 0xF407])
    inputs, taken = view.encodings(shape)
    records = [r for r in view.complete() if r.number in inputs]
    if len(records) < 2 or len(records[0].values) != 2 or any(r.violation > 0 for r in records):
        return None
    x = np.array([inputs[r.number] for r in records])
    values = np.array([r.values for r in records], dtype=float)
    use = capped(np.sum(values, axis=1))
    gps = [_fitted(shape, records, x, values[:, j], use) for j in range(2)]
    pending_x = running_inputs(view, shape)
    means = np.column_stack([gp.mean(x[use]) for gp in gps])
    members = [int(use[i]) for i in front(means)]
    crowding = crowding_distance(means[front(means)])
    order = [members[i] for i in np.argsort(-crowding, kind="stable")]  # sparsest first
    leader = members[tournament(crowding, rng)]
    tops = [x_at(shape, records[leader])] + [x_at(shape, records[i]) for i in order if i != leader][
        :TOP_TRIALS
    ]
    particle = number % swarm.size
    own = personal_best([r for r in records if r.particle == particle], shape.names[0])
    own_best = None if own is None else x_at(shape, own)
    state = particle_state(swarm, view, particle, number, shape, own_best, records[leader].number)
    candidates = guided_candidates(swarm, view, shape, tops, state, own_best, rng)
    score = _scorer(swarm, view, shape, gps, means, pending_x, taken)
    return moved_to(swarm, shape, state, pick(shape, candidates, score), rng)


def x_at(shape: Space, record: Record) -> np.ndarray:
    return shape.position(record.params)


def _fitted(
    shape: Space, records: list[Record], x: np.ndarray, y: np.ndarray, use: np.ndarray
) -> GaussianProcess:
    fit = capped(y[: fit_size(len(y))])
    key = (shape.names, shape.dists, tuple(records[i].number for i in fit), y[fit].tobytes())
    kernel = cached_kernel(key, lambda: fit_kernel(x[fit], standardise(y[fit]), shape.categorical))
    return GaussianProcess(x[use], y[use], shape.categorical, kernel)


def _scorer(
    swarm: Swarm,
    view: SwarmView,
    shape: Space,
    gps: list[GaussianProcess],
    means: np.ndarray,
    pending_x: np.ndarray | None,
    taken: set[tuple],
) -> Callable[[np.ndarray], np.ndarray]:
    """The hypervolume a position's optimistic point adds; -inf where barred."""
    posteriors = [gp.given(pending_x) for gp in gps]
    points = means
    if pending_x is not None:
        points = np.vstack([means, np.column_stack([gp.mean(pending_x) for gp in gps])])
    spread = np.ptp(points, axis=0)
    reference = points.max(axis=0) + 0.1 * np.where(spread > 0, spread, 1.0)
    current = points[front(points)]
    barred = barrier(swarm, view, shape, taken, pending_x)

    def score(positions: np.ndarray) -> np.ndarray:
        encoded = shape.encode_positions(positions)
        optimistic = []
        for posterior in posteriors:
            mean, variance = posterior(encoded)
            optimistic.append(mean - OPTIMISM * np.sqrt(variance))
        gain = hypervolume_gain(current, reference, np.column_stack(optimistic))
        return np.where(barred(encoded), -np.inf, gain)

    return score
