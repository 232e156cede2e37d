"""The surrogate screen: a particle's next position, chosen among candidates by a model.

The model is the Gaussian process of `samplers._model.gp`, fitted on every finished trial (as
`samplers._model.target` says: one objective, or several scalarised). It judges the bests (the
swarm's and the particle's: the trials of lowest posterior mean, not the luckiest draws),
and it ranks the candidates of `samplers._model.candidates` by log expected improvement over the
best posterior mean, with the running trials as fantasies. Candidates that repeat a trial
already run or running are barred before ranking, and so are memory parameters above half
of a size that ran out of memory. The best few are climbed one coordinate at a time.

Everything the screen reads comes from the storage (through the `SwarmView`) and from
(seed, trial number), so every process on every node makes the same move for a trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from samplers._history import rounded
from samplers._model.candidates import (
    ANYWHERE,
    BEST_NEIGHBOURS,
    CLIMB_ROUNDS,
    CLIMB_STARTS,
    OWN_BEST_NEIGHBOURS,
    SWARM_DRAWS,
    TOP_NEIGHBOURS,
    TOP_TRIALS,
    Particle,
    Space,
    anywhere,
    climb,
    neighbours,
    snap_choices,
    swarm_draws,
    values_at,
)
from samplers._model.gp import (
    GaussianProcess,
    cached_kernel,
    fit_kernel,
    log_expected_improvement,
    standardise,
)
from samplers._model.target import capped, fit_size, model_data
from samplers._moves import Move, Swarm
from samplers._space import from_unit, to_unit

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from samplers._history import Record, SwarmView


@dataclass(frozen=True)
class Fitted:
    """The model of one ask: the trials it holds, their inputs, and its posterior means there."""

    gp: GaussianProcess
    records: list[Record]
    x: np.ndarray
    means: np.ndarray  # the posterior mean at each of `records`
    ranked: np.ndarray  # indices of `records`, lowest posterior mean first

    @property
    def best(self) -> Record:
        return self.records[int(self.ranked[0])]


def screened_move(
    swarm: Swarm,
    view: SwarmView,
    entropy: int,
    number: int,
    space: Mapping[str, BaseDistribution],
) -> tuple[dict[str, Any], dict[str, Move]] | None:
    """Trial `number`'s values and its particle's moves; None while no model can be fitted
    (fewer than two finished trials in this space) or every candidate is barred: the caller
    then steps as the plain swarm does."""
    shape = Space.of(space, swarm.bounds)
    rng = np.random.default_rng([entropy, number, 0x5C2E])
    inputs, taken = view.encodings(shape)
    fitted = _fit(view, shape, inputs, rng)
    if fitted is None:
        return None
    particle = number % swarm.size
    mine = [i for i in fitted.ranked if fitted.records[i].particle == particle]
    own_best = shape.position(fitted.records[mine[0]].params) if mine else None
    state = particle_state(swarm, view, particle, number, shape, own_best, fitted.best.number)
    tops = [shape.position(fitted.records[i].params) for i in fitted.ranked[: 1 + TOP_TRIALS]]
    candidates = guided_candidates(swarm, view, shape, tops, state, own_best, rng)
    score = _scorer(swarm, view, shape, fitted, taken)
    return moved_to(swarm, shape, state, pick(shape, candidates, score), rng)


def moved_to(
    swarm: Swarm,
    shape: Space,
    state: Particle | None,
    u: np.ndarray | None,
    rng: np.random.Generator,
) -> tuple[dict[str, Any], dict[str, Move]] | None:
    """The values at position `u` and the moves that take the particle there.

    Each continuous coordinate moves by the trial's own offset of at most 0.001 of its range:
    two workers asking at the same moment see the same trials, and may climb to the same point
    before either's values are stored (a neighbour of the best that switched one choice keeps
    the best's floats); with the offset they still run different configurations.
    """
    if u is None:
        return None
    continuous = (shape.choices == 0) & (shape.grid == 0)
    u = np.where(continuous, np.clip(u + rng.uniform(-1e-3, 1e-3, len(u)), 0.0, 1.0), u)
    moves = {
        name: Move(None, float(u[j]), 0.0)
        if state is None
        else Move(float(state.x[j]), float(u[j]), float(u[j] - state.x[j]))
        for j, name in enumerate(shape.names)
    }
    return values_at(shape, u, swarm.value), moves


def _fit(
    view: SwarmView, shape: Space, inputs: dict[int, np.ndarray], rng: np.random.Generator
) -> Fitted | None:
    data = model_data(view, inputs, rng)
    if data is None:
        return None
    records, y = data
    x = np.array([inputs[r.number] for r in records])
    fit = capped(y[: fit_size(len(y))])
    key = (shape.names, shape.dists, tuple(records[i].number for i in fit), y[fit].tobytes())
    kernel = cached_kernel(key, lambda: fit_kernel(x[fit], standardise(y[fit]), shape.categorical))
    use = capped(y)
    gp = GaussianProcess(x[use], y[use], shape.categorical, kernel)
    means = gp.mean(x[use])
    ranked = np.argsort(means, kind="stable")  # bests by the model, not by one draw
    return Fitted(gp, [records[i] for i in use], x[use], means, ranked)


def guided_candidates(
    swarm: Swarm,
    view: SwarmView,
    shape: Space,
    tops: list[np.ndarray],
    state: Particle | None,
    own_best: np.ndarray | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Every kind of candidate: near the best (`tops[0]`), anywhere, near the next tops, near
    the particle's own best, and draws of its swarm update towards the best."""
    parts = [neighbours(shape, tops[0], rng, BEST_NEIGHBOURS), anywhere(shape, rng, ANYWHERE)]
    parts += [neighbours(shape, at, rng, TOP_NEIGHBOURS) for at in tops[1:]]
    if own_best is not None:
        parts.append(neighbours(shape, own_best, rng, OWN_BEST_NEIGHBOURS))
    if state is not None:
        coefficients = swarm.several_coefficients if view.several else swarm.coefficients
        parts.append(
            swarm_draws(
                shape,
                state,
                tops[0],
                coefficients,
                swarm.grid_reach,
                swarm.search_radius,
                rng,
                SWARM_DRAWS,
            )
        )
    return np.vstack(parts)


def _scorer(
    swarm: Swarm, view: SwarmView, shape: Space, fitted: Fitted, taken: set[tuple]
) -> Callable[[np.ndarray], np.ndarray]:
    """log EI at positions; -inf where barred (a repeat, or memory above an OOM's half)."""
    pending_x = running_inputs(view, shape)
    posterior = fitted.gp.given(pending_x)
    # Improvement over the best posterior mean, not over the luckiest draw (docs/sampler.md:
    # the luckiest draw as the incumbent was worse on 10 of the 15 tables).
    incumbent = float(fitted.means[fitted.ranked[0]])
    barred = barrier(swarm, view, shape, taken, pending_x)

    def score(positions: np.ndarray) -> np.ndarray:
        encoded = shape.encode_positions(positions)
        ei = log_expected_improvement(*posterior(encoded), incumbent)
        return np.where(barred(encoded), -np.inf, ei)

    return score


def running_inputs(view: SwarmView, shape: Space) -> np.ndarray | None:
    """The model inputs of the running trials of this space (None when there are none)."""
    pending = [r for r in view.running() if shape.holds(r)]
    return np.array([shape.encode(r.params) for r in pending]) if pending else None


def barrier(
    swarm: Swarm,
    view: SwarmView,
    shape: Space,
    taken: set[tuple],
    pending_x: np.ndarray | None,
) -> Callable[[np.ndarray], np.ndarray]:
    """Which model inputs a move may not take: a trial run or running, or a memory parameter
    above half of a size that ran out of memory."""
    if pending_x is not None:
        taken = taken | {rounded(row) for row in pending_x}
    caps = _memory_caps(swarm, view, shape)

    def barred(encoded: np.ndarray) -> np.ndarray:
        rows = map(tuple, np.round(encoded, 9).tolist())  # as `rounded` makes them
        out = np.array([row in taken for row in rows], dtype=bool)
        for j, cap in caps.items():
            out |= encoded[:, j] > cap + 1e-9
        return out

    return barred


def pick(
    shape: Space, candidates: np.ndarray, score: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray | None:
    """The best position reached by climbing from the best few candidates; None if all barred."""
    scores = score(candidates)
    best_u, best_score = None, -np.inf
    for i in np.argsort(-scores, kind="stable")[:CLIMB_STARTS]:
        if not np.isfinite(scores[i]):
            break
        u, value = climb(shape, candidates[i], float(scores[i]), score, CLIMB_ROUNDS)
        if value > best_score:
            best_u, best_score = u, value
    return best_u


def _memory_caps(swarm: Swarm, view: SwarmView, shape: Space) -> dict[int, float]:
    """Per memory parameter (by column): the coordinate of half the smallest value that ran out
    of memory, the most a candidate may propose (the plain swarm's back-off, for the whole
    swarm: the model sees no failed trial)."""
    caps: dict[int, float] = {}
    for j, name in enumerate(shape.names):
        dist = shape.dists[j]
        if not swarm.is_memory_param(name) or shape.choices[j]:
            continue
        failed = [r.params[name] for r in view.out_of_memory() if name in r.params]
        if failed:
            half = max(dist.low, min(failed) / 2)
            caps[j] = to_unit(dist, from_unit(dist, to_unit(dist, half)))
    return caps


def particle_state(
    swarm: Swarm,
    view: SwarmView,
    particle: int,
    number: int,
    shape: Space,
    own_best: np.ndarray | None,
    best_number: int,
) -> Particle | None:
    """The particle's place (its latest trial before `number`) and guides; None if it has none."""
    previous = next(
        (
            r
            for r in reversed(view.particle_records(particle))
            if r.number < number and all(n in r.moves or n in r.params for n in shape.names)
        ),
        None,
    )
    if previous is None:
        return None
    x, v = np.empty(len(shape.names)), np.zeros(len(shape.names))
    for j, name in enumerate(shape.names):
        if name in previous.moves:
            x[j], v[j] = previous.moves[name]
        else:  # the value came from elsewhere (an enqueued value): start there at rest
            x[j] = previous.evaluated(name)
        if previous.oom and swarm.is_memory_param(name) and name in previous.params:
            x[j], v[j] = swarm.backed_off(previous, name, x[j], v[j])
    return Particle(snap_choices(shape, x), v, own_best, previous.number == best_number)
