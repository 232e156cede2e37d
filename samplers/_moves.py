"""Where one particle goes for one parameter: from its latest trial, pulled by the bests.

`Swarm` is the swarm as `PSOSampler` was given it: its size, its step's coefficients, its
topology, how far the particle that holds the best searches, and the bounds of this process.
`Swarm.move` is one particle's step for one parameter, read from a `SwarmView` of the study's
trials; `Swarm.dedupe` nudges a proposal that repeats a trial already in the storage. The
step's arithmetic is in `_swarm`, the leaders of several objectives in `_leaders`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution

from orchestrator.record.attr_names import BATCH_SIZE
from samplers._gp import (
    GaussianProcess,
    cached_kernel,
    fit_kernel,
    log_expected_improvement,
    standardise,
)
from samplers._history import Record, SwarmView, rounded
from samplers._leaders import Archive, archive, leader, personal_best
from samplers._lhs import design_point, name_key, start_size
from samplers._screen import (
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
from samplers._space import clip_to_bounds, from_unit, grid_size, to_unit
from samplers._swarm import SwarmCoefficients, back_off, dimension_clamp, reflect, step
from samplers._target import capped, fit_size, model_data

# Parameters whose value decides a trial's memory: an out-of-memory failure pushes them down.
MEMORY_PARAMS = (BATCH_SIZE,)
_DEDUPE_ATTEMPTS = 32
OBSERVED_BEST = False


@dataclass(frozen=True)
class Move:
    """One parameter's step: from `base` (None for a fresh point) to `x` with velocity `v`."""

    base: float | None
    x: float
    v: float

    def nudged(self, delta: float, max_velocity: float) -> Move:
        """The move with `delta` added to its velocity (clamped to `max_velocity`)."""
        if self.base is None:
            return Move(None, float(np.clip(self.x + delta, 0.0, 1.0)), self.v)
        v = float(np.clip(self.v + delta, -max_velocity, max_velocity))
        x, bounced = reflect(np.array([self.base + v]), np.array([v]))
        return Move(self.base, float(x[0]), float(bounced[0]))


@dataclass(frozen=True)
class Swarm:
    """The swarm's shape and step rules: what every particle's move depends on besides the trials.

    `bounds` map this process's proposals into `(low, high)` per parameter (and mark memory
    parameters, as `MEMORY_PARAMS` does); `archive_size` is the most non-dominated trials kept
    as leaders when the study has several objectives.
    """

    size: int
    coefficients: SwarmCoefficients
    several_coefficients: SwarmCoefficients  # the clamp for several objectives
    search_radius: float
    grid_reach: float
    topology: str
    bounds: Mapping[str, tuple[float, float]]
    archive_size: int
    # One archive per view, per thread (Optuna may sample from several threads at once).
    _local: threading.local = dataclasses.field(
        default_factory=threading.local, init=False, repr=False, compare=False
    )

    def move(
        self, view: SwarmView, entropy: int, number: int, name: str, dist: BaseDistribution
    ) -> Move:
        """Where trial `number`'s particle goes for parameter `name`, and from where."""
        particle = number % self.size
        previous = self._previous(view, particle, number, name)
        guides = None if previous is None else self._guides(view, entropy, number, name, previous)
        if previous is None or guides is None or number < start_size(len(view.relative_space)):
            return Move(None, design_point(entropy, number, name), 0.0)
        if name in previous.moves:
            x, v = previous.moves[name]
        else:  # the value came from elsewhere (an enqueued value): start there at rest
            x, v = previous.evaluated(name), 0.0
        if previous.oom and self._is_memory_param(name) and name in previous.params:
            x, v = self._back_off(previous, name, x, v)
        personal_best, neighbourhood_best, holds_best = guides
        rng = np.random.default_rng([entropy, number, name_key(name)])
        r1, r2, r3 = rng.random(3)
        coefficients = self.several_coefficients if view.several else self.coefficients
        if not view.several:
            # Several objectives: the clamp of half the range already crosses five of ten
            # points, and grid_reach was not measured to help there (docs/sampler.md).
            clamp = dimension_clamp(coefficients.max_velocity, grid_size(dist), self.grid_reach)
            coefficients = dataclasses.replace(coefficients, max_velocity=clamp)
        new_x, new_v = step(
            np.array([x]),
            np.array([v]),
            np.array([x if personal_best is None else personal_best]),
            np.array([neighbourhood_best]),
            np.array([r1]),
            np.array([r2]),
            coefficients,
            jitter=np.array([self.search_radius * (2 * r3 - 1) if holds_best else 0.0]),
        )
        return Move(x, float(new_x[0]), float(new_v[0]))

    def screen(
        self,
        view: SwarmView,
        entropy: int,
        number: int,
        space: Mapping[str, BaseDistribution],
    ) -> tuple[dict[str, Any], dict[str, Move]] | None:
        """Trial `number`'s particle's move, chosen among candidates by the model (see _screen).

        None while no model can be fitted (fewer than two finished trials with these
        parameters): the caller steps as the plain swarm does.
        """
        shape = Space.of(space, self.bounds)
        rng = np.random.default_rng([entropy, number, 0x5C2E])
        inputs, taken = view.encodings(shape)
        data = model_data(view, inputs, rng)
        if data is None:
            return None
        records, y = data
        x = np.array([inputs[r.number] for r in records])
        fit = capped(y[: fit_size(len(y))])
        key = (shape.names, shape.dists, tuple(records[i].number for i in fit), y[fit].tobytes())
        kernel = cached_kernel(
            key, lambda: fit_kernel(x[fit], standardise(y[fit]), shape.categorical)
        )
        use = capped(y)
        records, x = [records[i] for i in use], x[use]
        gp = GaussianProcess(x, y[use], shape.categorical, kernel)
        means = gp.mean(x)
        ranked = np.argsort(means, kind="stable")  # bests by the model, not by one draw
        best = records[int(ranked[0])]
        best_at = shape.position(best.params)
        particle = number % self.size
        parts = [neighbours(shape, best_at, rng, BEST_NEIGHBOURS), anywhere(shape, rng, ANYWHERE)]
        for i in ranked[1 : 1 + TOP_TRIALS]:
            parts.append(neighbours(shape, shape.position(records[i].params), rng, TOP_NEIGHBOURS))
        mine = [i for i in ranked if records[i].particle == particle]
        own_best = shape.position(records[mine[0]].params) if mine else None
        if own_best is not None:
            parts.append(neighbours(shape, own_best, rng, OWN_BEST_NEIGHBOURS))
        state = self._particle(view, particle, number, shape, own_best, best.number)
        if state is not None:
            coefficients = self.several_coefficients if view.several else self.coefficients
            parts.append(
                swarm_draws(
                    shape,
                    state,
                    best_at,
                    coefficients,
                    self.grid_reach,
                    self.search_radius,
                    rng,
                    SWARM_DRAWS,
                )
            )
        candidates = np.vstack(parts)
        pending = [r for r in view.running() if shape.holds(r)]
        pending_x = np.array([shape.encode(r.params) for r in pending]) if pending else None
        posterior = gp.given(pending_x)
        incumbent = float(means[ranked[0]]) if not OBSERVED_BEST else float(np.min(gp.y))
        if pending_x is not None:
            taken.update(rounded(row) for row in pending_x)
        caps = self._memory_caps(view, shape)

        def score(positions: np.ndarray) -> np.ndarray:
            # log EI at each position's values; -inf for values already run or running, and
            # for memory parameters above half of a size that ran out of memory.
            encoded = shape.encode_positions(positions)
            ei = log_expected_improvement(*posterior(encoded), incumbent)
            rows = map(tuple, np.round(encoded, 9).tolist())  # as `rounded` makes them
            barred = np.array([row in taken for row in rows], dtype=bool)
            for j, cap in caps.items():
                barred |= encoded[:, j] > cap + 1e-9
            return np.where(barred, -np.inf, ei)

        scores = score(candidates)
        best_u, best_score = None, -np.inf
        for i in np.argsort(-scores, kind="stable")[:CLIMB_STARTS]:
            if not np.isfinite(scores[i]):
                break
            u, value = climb(shape, candidates[i], float(scores[i]), score, CLIMB_ROUNDS)
            if value > best_score:
                best_u, best_score = u, value
        if best_u is None:
            return None
        u = best_u
        moves = {
            name: Move(None, float(u[j]), 0.0)
            if state is None
            else Move(float(state.x[j]), float(u[j]), float(u[j] - state.x[j]))
            for j, name in enumerate(shape.names)
        }
        return values_at(shape, u, self.value), moves

    def _memory_caps(self, view: SwarmView, shape: Space) -> dict[int, float]:
        """Per memory parameter (by column): the coordinate of half the smallest value that ran
        out of memory, the most a candidate may propose (the plain swarm's back-off, for the
        whole swarm: the model sees no failed trial)."""
        caps: dict[int, float] = {}
        for j, name in enumerate(shape.names):
            dist = shape.dists[j]
            if not self._is_memory_param(name) or shape.choices[j]:
                continue
            failed = [r.params[name] for r in view.out_of_memory() if name in r.params]
            if failed:
                half = max(dist.low, min(failed) / 2)
                caps[j] = to_unit(dist, from_unit(dist, to_unit(dist, half)))
        return caps

    def _particle(
        self,
        view: SwarmView,
        particle: int,
        number: int,
        shape: Space,
        own_best: np.ndarray | None,
        best_number: int,
    ) -> Particle | None:
        """The particle's place (its latest trial before `number`) and guides; None if new."""
        previous = None
        for record in reversed(view.particle_records(particle)):
            if record.number < number and all(
                n in record.moves or n in record.params for n in shape.names
            ):
                previous = record
                break
        if previous is None:
            return None
        x, v = np.empty(len(shape.names)), np.zeros(len(shape.names))
        for j, name in enumerate(shape.names):
            if name in previous.moves:
                x[j], v[j] = previous.moves[name]
            else:  # the value came from elsewhere (an enqueued value): start there at rest
                x[j] = previous.evaluated(name)
            if previous.oom and self._is_memory_param(name) and name in previous.params:
                x[j], v[j] = self._back_off(previous, name, x[j], v[j])
        x = snap_choices(shape, x)
        return Particle(x, v, own_best, previous.number == best_number)

    def dedupe(
        self,
        view: SwarmView,
        entropy: int,
        number: int,
        space: Mapping[str, BaseDistribution],
        params: dict[str, Any],
        moves: dict[str, Move],
    ) -> tuple[dict[str, Any], dict[str, Move]]:
        """Nudge a proposal that repeats a trial already in the storage, in growing circles.

        A step is nudged through its velocity, so position = previous position + velocity
        still holds for every recorded step.
        """
        names = sorted(params)
        seen = view.seen(tuple(names))
        rng = np.random.default_rng([entropy, number, 0xD0D0])
        radius = 1.0 / self.size
        for _ in range(_DEDUPE_ATTEMPTS):
            if tuple(params[name] for name in names) not in seen:
                break
            moves = {
                # Once the clamp's reach is exhausted (a small discrete space), jump further.
                name: moves[name].nudged(
                    rng.uniform(-radius, radius), max(radius, self.coefficients.max_velocity)
                )
                for name in names
            }
            params = {name: self.value(name, space[name], moves[name].x) for name in names}
            radius = min(1.0, radius * 2)
        return params, moves

    def value(self, name: str, dist: BaseDistribution, x: float) -> Any:
        """The value of parameter `name` at unit coordinate `x`, inside this process's bounds."""
        value = from_unit(dist, x)
        if name in self.bounds and not isinstance(dist, CategoricalDistribution):
            value = clip_to_bounds(dist, value, self.bounds[name])
        return value

    def _previous(self, view: SwarmView, particle: int, number: int, name: str) -> Record | None:
        for record in reversed(view.particle_records(particle)):
            if record.number < number and (name in record.moves or name in record.params):
                return record
        return None

    def _guides(
        self, view: SwarmView, entropy: int, number: int, name: str, previous: Record
    ) -> tuple[float | None, float, bool] | None:
        """(personal best, neighbourhood best or leader, whether `previous` is that best).

        None while there is no best yet. The particle that holds the best is pulled nowhere;
        it searches around it instead (guaranteed-convergence PSO), or it would stand still.
        """
        particle = number % self.size
        if view.several:
            members = self._archive(view)
            lead = leader(members, name, np.random.default_rng([entropy, number, 0x1EAD]))
            if lead is None:
                return None
            own = personal_best(view.particle_records(particle), name)
            own_x = None if own is None else own.evaluated(name)
            return own_x, lead.evaluated(name), lead.number == previous.number
        best = self._neighbourhood_best(view, particle, name)
        if best is None:
            return None
        own = view.personal_best(particle, name)
        own_x = None if own is None else own.evaluated(name)
        return own_x, best, view.best_number(name) == previous.number

    def _archive(self, view: SwarmView) -> Archive:
        # One archive per view (a view is one snapshot of the study's trials).
        cached = getattr(self._local, "archive", None)
        if cached is None or cached[0] is not view:
            cached = (view, archive(view.complete(), self.archive_size))
            self._local.archive = cached
        return cached[1]

    def _neighbourhood_best(self, view: SwarmView, particle: int, name: str) -> float | None:
        if self.topology == "ring":
            size = self.size
            members = {(particle - 1) % size, particle, (particle + 1) % size}
        for record in view.ranked:
            if name not in record.params:
                continue
            # Trials that move no particle (enqueued ones) belong to every neighbourhood.
            if (
                self.topology == "ring"
                and record.particle is not None
                and record.particle not in members
            ):
                continue
            return record.evaluated(name)
        return None

    def _back_off(self, previous: Record, name: str, x: float, v: float) -> tuple[float, float]:
        dist = previous.distributions[name]
        value = previous.params[name]
        half = max(dist.low, value / 2)
        return back_off(
            x, v, to_unit(dist, value), to_unit(dist, from_unit(dist, to_unit(dist, half)))
        )

    def _is_memory_param(self, name: str) -> bool:
        return name in MEMORY_PARAMS or name in self.bounds
