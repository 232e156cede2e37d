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

from orchestrator.record.trials.attr_names import BATCH_SIZE
from samplers._history import Record, SwarmView
from samplers._leaders import Archive, archive, leader, personal_best
from samplers._lhs import design_point, name_key, start_size
from samplers._space import clip_to_bounds, from_unit, grid_size, to_unit
from samplers._swarm import SwarmCoefficients, back_off, dimension_clamp, reflect, step

# Parameters whose value decides a trial's memory: an out-of-memory failure pushes them down.
MEMORY_PARAMS = (BATCH_SIZE,)
_DEDUPE_ATTEMPTS = 32


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
        if previous.oom and self.is_memory_param(name) and name in previous.params:
            x, v = self.backed_off(previous, name, x, v)
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

    def backed_off(self, previous: Record, name: str, x: float, v: float) -> tuple[float, float]:
        dist = previous.distributions[name]
        value = previous.params[name]
        half = max(dist.low, value / 2)
        return back_off(
            x, v, to_unit(dist, value), to_unit(dist, from_unit(dist, to_unit(dist, half)))
        )

    def is_memory_param(self, name: str) -> bool:
        return name in MEMORY_PARAMS or name in self.bounds
