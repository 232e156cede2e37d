"""PSOSampler: particle-swarm optimisation over an Optuna study, shared by every worker.

The swarm has no home process. Each trial is one step of one particle, and the step is written
into that trial's system attributes; any process, on any node, rebuilds the swarm from the
storage when it samples, so a worker that starts cold continues the same swarm.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.samplers._base import _process_constraints_after_trial
from optuna.study import StudyDirection
from optuna.trial import TrialState

from orchestrator.record.attr_names import BATCH_SIZE
from samplers._history import PARAM_KEY_PREFIX, RECORD_KEY, History, Record, SwarmView
from samplers._leaders import Archive, archive, leader, personal_best
from samplers._lhs import lhs_point, name_key
from samplers._space import clip_to_bounds, from_unit, grid_size, to_unit
from samplers._swarm import SwarmCoefficients, back_off, dimension_clamp, reflect, step

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial

# Parameters whose value decides a trial's memory: an out-of-memory failure pushes them down.
MEMORY_PARAMS = (BATCH_SIZE,)
TOPOLOGIES = ("global", "ring")
_DEDUPE_ATTEMPTS = 32
SEVERAL_MAX_VELOCITY = 0.5
# Grid points one step may cross on a small ordered grid (see samplers._swarm.dimension_clamp);
# chosen on docs/sampler.md's HPO tables with seeds other than the table's.
GRID_REACH = 2.5


@dataclass(frozen=True)
class _Move:
    """One parameter's step: from `base` (None for a fresh point) to `x` with velocity `v`."""

    base: float | None
    x: float
    v: float

    def nudged(self, delta: float, max_velocity: float) -> _Move:
        """The move with `delta` added to its velocity (clamped to `max_velocity`)."""
        if self.base is None:
            return _Move(None, float(np.clip(self.x + delta, 0.0, 1.0)), self.v)
        v = float(np.clip(self.v + delta, -max_velocity, max_velocity))
        x, bounced = reflect(np.array([self.base + v]), np.array([v]))
        return _Move(self.base, float(x[0]), float(bounced[0]))


class PSOSampler(BaseSampler):
    """Particle-swarm optimisation with a Latin-hypercube start, for many workers at once.

    **Particles and trials.** Trial number ``n`` moves particle ``n % swarm_size``; its
    generation is ``n // swarm_size``. Trial numbers are unique across every process on every
    node, so two workers asking at once never step the same particle the same way, and no
    counter has to be shared. All randomness of a trial comes from ``(seed, n, parameter)``, so
    the same seed gives the same sequence in any process.

    **Start.** A particle with no earlier trial, or a study with no complete trial yet, takes
    point ``n % swarm_size`` of Latin hypercube design number ``n // swarm_size`` (design 0 is the
    swarm's start). A design's columns are keyed by parameter name, so every process agrees on it
    before anyone knows the whole search space, and the first wave of workers, which all ask
    before any trial finished, fills the space instead of duplicating each other.

    **Step.** Otherwise the particle steps from its latest trial (finished or still running: a
    running trial is not waited for), pulled towards its personal best and the best of its
    neighbourhood (all particles for ``topology="global"``, itself and the two next to it for
    ``"ring"``), with a clamped velocity and reflection at the edges (see ``samplers._swarm``).
    Every parameter is stepped on its own unit coordinate, so conditional parameters are
    handled by the same rule: the bests for a parameter are the best trials that have it.
    Positions are kept unclamped by ``bounds``; bests are the values that were really run.

    **Outcomes.** Only COMPLETE trials become personal or neighbourhood bests. A FAIL or PRUNED
    trial still moves its particle (its position is the particle's new place), so the pulls of the
    bests bring it back from a bad region. A trial that failed with the user attribute
    ``oom=True`` also pushes its particle's memory parameters (``batch_size`` and any parameter in
    ``bounds``) down to half the size that ran out of memory and removes their upward speed, so
    the swarm does not keep proposing a batch size that did not fit.

    **Enqueued trials** (``study.enqueue_trial``, re-runs of failed trials) are evaluated as
    given: they move no particle; a parameter they leave open is drawn at random from the
    trial's own stream, or by ``independent_sampler`` when one is given. Their results count as
    bests like any other trial's.

    **Bounds.** ``bounds={"batch_size": (lo, hi)}`` maps every value this process proposes for
    that parameter into ``[lo, hi]`` (keeping the distribution's log and step), while the study's
    search space stays the same on every node.

    **Several objectives.** The same swarm, guided by Pareto dominance (MOPSO, as SMPSO and
    OMOPSO): the leader is drawn from the archive of the study's non-dominated trials by a
    binary tournament on crowding distance, and a particle's personal best is its latest trial
    that its others do not dominate (see ``samplers._leaders``). Constraints follow Optuna's
    convention (the ``constraints`` system attribute, set by ``constraints_func``): a feasible
    trial beats an infeasible one, and of two infeasible ones the smaller violation wins.

    Duplicates: before a relative sample is returned it is checked against every trial in the
    storage and nudged if it repeats one (integer and categorical spaces can collide).

    Args:
        swarm_size: particles in the swarm (at least 2).
        inertia, cognitive, social: the step's coefficients (0.6, 1.2, 1.2 by default: set for
            runs of about ten generations, see ``samplers._swarm``; Clerc and Kennedy's
            constriction values 0.7298, 1.49618, 1.49618 suit long runs).
        max_velocity: the velocity clamp as a fraction of each parameter's range, in (0, 1];
            ``None``: 0.15 for one objective, 0.5 for several.
        grid_reach: on an ordered grid (ints, stepped floats) of ``k`` values the clamp is
            widened to ``grid_reach / k`` where that is longer, so one step can cross that many
            grid points (2.5 by default; 0 keeps ``max_velocity`` everywhere). Continuous and
            log ranges and categorical choices keep ``max_velocity``, and so does every
            parameter of a study with several objectives.
        search_radius: how far the particle that holds the best searches around it, as a
            fraction of each range (it has no pull of its own, so it would otherwise stop).
        topology: ``"global"`` or ``"ring"``.
        bounds: per-parameter ``(low, high)`` for this process, such as the planner's batch
            size bounds; ``None`` for none.
        seed: the swarm's seed. ``None`` derives it from the study's name and id, so the workers
            of one study still agree with each other (give a seed to vary it between studies
            of the same name).
        independent_sampler: draws the open parameters of enqueued trials; ``None`` draws them
            uniformly from the trial's own random stream.
        archive_size: the most non-dominated trials kept as leaders (several objectives).
        constraints_func: a trial's constraint values (<= 0 is satisfied), stored as Optuna's
            samplers store them; infeasible trials never lead while a feasible one exists.
    """

    def __init__(
        self,
        *,
        swarm_size: int = 20,
        inertia: float = SwarmCoefficients.inertia,
        cognitive: float = SwarmCoefficients.cognitive,
        social: float = SwarmCoefficients.social,
        max_velocity: float | None = None,
        search_radius: float = 0.05,
        grid_reach: float = GRID_REACH,
        topology: str = "global",
        bounds: Mapping[str, tuple[float, float]] | None = None,
        seed: int | None = None,
        independent_sampler: BaseSampler | None = None,
        archive_size: int = 100,
        constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
    ) -> None:
        if isinstance(swarm_size, bool) or not isinstance(swarm_size, int) or swarm_size < 2:
            raise ValueError(f"The `{swarm_size=}` must be a whole number of at least 2.")
        if topology not in TOPOLOGIES:
            raise ValueError(
                f"The `{topology=}` is invalid. Choose one of {', '.join(TOPOLOGIES)}."
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"The `{seed=}` must be a whole number >= 0 or None.")
        self._swarm_size = swarm_size
        clamp = SwarmCoefficients.max_velocity if max_velocity is None else max_velocity
        self._coefficients = SwarmCoefficients(inertia, cognitive, social, clamp)
        # Several objectives: SMPSO's clamp at half of each range unless one is given. A swarm
        # that must cover a front, not close in on one point, needs the longer steps (measured
        # in docs/sampler.md).
        several = SEVERAL_MAX_VELOCITY if max_velocity is None else max_velocity
        self._several_coefficients = SwarmCoefficients(inertia, cognitive, social, several)
        if not (0 <= search_radius <= 1):
            raise ValueError(f"The `{search_radius=}` must be in [0, 1]: a fraction of each range.")
        self._search_radius = search_radius
        if isinstance(grid_reach, bool) or not (
            isinstance(grid_reach, int | float) and math.isfinite(grid_reach) and grid_reach >= 0
        ):
            raise ValueError(f"The `{grid_reach=}` must be a finite number >= 0 (grid points).")
        self._grid_reach = float(grid_reach)
        self._topology = topology
        self._bounds = _check_bounds(bounds)
        self._seed = seed
        self._salt = 0  # set by reseed_rng
        self._independent_sampler = independent_sampler
        if isinstance(archive_size, bool) or not isinstance(archive_size, int) or archive_size < 1:
            raise ValueError(f"The `{archive_size=}` must be a whole number of at least 1.")
        self._archive_size = archive_size
        self._constraints_func = constraints_func
        self._local = threading.local()
        self._history = History()

    # -- Optuna's sampler interface -------------------------------------------------------

    def reseed_rng(self) -> None:
        """Sample differently from now on, as Optuna expects of a sampler it replicates.

        The swarm's randomness comes from (seed, trial number), so a fresh random salt is mixed
        into that seed. Workers of one study never call this (they must agree); Optuna does, in
        each thread of `optimize(n_jobs=...)`, where a replica must not repeat the others."""
        self._salt = secrets.randbits(64)
        if self._independent_sampler is not None:
            self._independent_sampler.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._view(study).relative_space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or self._is_enqueued(trial):
            return {}
        view = self._view(study)
        entropy = self._entropy(study)
        names = sorted(name for name, dist in search_space.items() if not dist.single())
        if not names:
            return {}
        moves = {
            name: self._move(view, entropy, trial.number, name, search_space[name])
            for name in names
        }
        params = {name: self._value(name, search_space[name], moves[name].x) for name in names}
        params, moves = self._dedupe(view, entropy, trial.number, search_space, params, moves)
        record: dict[str, Any] = {
            "p": trial.number % self._swarm_size,
            "x": {name: [moves[name].x, moves[name].v] for name in names},
        }
        study._storage.set_trial_system_attr(trial._trial_id, RECORD_KEY, record)
        return params

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        entropy = self._entropy(study)
        if self._is_enqueued(trial):
            return self._sample_open_parameter(
                study, trial, entropy, param_name, param_distribution
            )
        move = self._move(self._view(study), entropy, trial.number, param_name, param_distribution)
        study._storage.set_trial_system_attr(
            trial._trial_id,
            PARAM_KEY_PREFIX + param_name,
            [trial.number % self._swarm_size, move.x, move.v],
        )
        return self._value(param_name, param_distribution, move.x)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        # Remember whether the trial was enqueued while its system attributes are at hand
        # (later calls get a trial whose attributes are read from the storage on each access).
        self._enqueued_cache()[trial._trial_id] = "fixed_params" in trial.system_attrs
        if self._independent_sampler is not None:
            self._independent_sampler.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._enqueued_cache().pop(trial._trial_id, None)
        if self._constraints_func is not None:
            # Stored under Optuna's own key, where NSGA-II, TPE and the swarm all read it.
            _process_constraints_after_trial(self._constraints_func, study, trial, state)
        if self._independent_sampler is not None:
            self._independent_sampler.after_trial(study, trial, state, values)

    # -- the swarm --------------------------------------------------------------------------

    def _move(
        self, view: SwarmView, entropy: int, number: int, name: str, dist: BaseDistribution
    ) -> _Move:
        """Where trial `number`'s particle goes for parameter `name`, and from where."""
        particle, generation = number % self._swarm_size, number // self._swarm_size
        previous = self._previous(view, particle, number, name)
        guides = None if previous is None else self._guides(view, entropy, number, name, previous)
        if previous is None or guides is None:
            return _Move(
                None, lhs_point(entropy, generation, particle, name, self._swarm_size), 0.0
            )
        if name in previous.moves:
            x, v = previous.moves[name]
        else:  # the value came from elsewhere (an enqueued value): start there at rest
            x, v = previous.evaluated(name), 0.0
        if previous.oom and self._is_memory_param(name) and name in previous.params:
            x, v = self._back_off(previous, name, x, v)
        personal_best, neighbourhood_best, holds_best = guides
        rng = np.random.default_rng([entropy, number, name_key(name)])
        r1, r2, r3 = rng.random(3)
        coefficients = self._several_coefficients if view.several else self._coefficients
        if not view.several:
            # Several objectives: the clamp of half the range already crosses five of ten
            # points, and grid_reach was not measured to help there (docs/sampler.md).
            clamp = dimension_clamp(coefficients.max_velocity, grid_size(dist), self._grid_reach)
            coefficients = dataclasses.replace(coefficients, max_velocity=clamp)
        new_x, new_v = step(
            np.array([x]),
            np.array([v]),
            np.array([x if personal_best is None else personal_best]),
            np.array([neighbourhood_best]),
            np.array([r1]),
            np.array([r2]),
            coefficients,
            jitter=np.array([self._search_radius * (2 * r3 - 1) if holds_best else 0.0]),
        )
        return _Move(x, float(new_x[0]), float(new_v[0]))

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
        particle = number % self._swarm_size
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
            cached = (view, archive(view.complete(), self._archive_size))
            self._local.archive = cached
        return cached[1]

    def _neighbourhood_best(self, view: SwarmView, particle: int, name: str) -> float | None:
        if self._topology == "ring":
            size = self._swarm_size
            members = {(particle - 1) % size, particle, (particle + 1) % size}
        for record in view.ranked:
            if name not in record.params:
                continue
            # Trials that move no particle (enqueued ones) belong to every neighbourhood.
            if (
                self._topology == "ring"
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
        return name in MEMORY_PARAMS or name in self._bounds

    def _dedupe(
        self,
        view: SwarmView,
        entropy: int,
        number: int,
        space: Mapping[str, BaseDistribution],
        params: dict[str, Any],
        moves: dict[str, _Move],
    ) -> tuple[dict[str, Any], dict[str, _Move]]:
        """Nudge a proposal that repeats a trial already in the storage, in growing circles.

        A step is nudged through its velocity, so position = previous position + velocity
        still holds for every recorded step.
        """
        names = sorted(params)
        seen = view.seen(tuple(names))
        rng = np.random.default_rng([entropy, number, 0xD0D0])
        radius = 1.0 / self._swarm_size
        for _ in range(_DEDUPE_ATTEMPTS):
            if tuple(params[name] for name in names) not in seen:
                break
            moves = {
                # Once the clamp's reach is exhausted (a small discrete space), jump further.
                name: moves[name].nudged(
                    rng.uniform(-radius, radius), max(radius, self._coefficients.max_velocity)
                )
                for name in names
            }
            params = {name: self._value(name, space[name], moves[name].x) for name in names}
            radius = min(1.0, radius * 2)
        return params, moves

    # -- helpers ----------------------------------------------------------------------------

    def _value(self, name: str, dist: BaseDistribution, x: float) -> Any:
        value = from_unit(dist, x)
        if name in self._bounds and not isinstance(dist, CategoricalDistribution):
            value = clip_to_bounds(dist, value, self._bounds[name])
        return value

    def _sample_open_parameter(
        self, study: Study, trial: FrozenTrial, entropy: int, name: str, dist: BaseDistribution
    ) -> Any:
        if self._independent_sampler is not None:
            value = self._independent_sampler.sample_independent(study, trial, name, dist)
            if name in self._bounds and not isinstance(dist, CategoricalDistribution):
                value = clip_to_bounds(dist, value, self._bounds[name])
            return value
        rng = np.random.default_rng([entropy, trial.number, name_key(name), 0x0E0E])
        return self._value(name, dist, float(rng.random()))

    def _is_enqueued(self, trial: FrozenTrial) -> bool:
        cache = self._enqueued_cache()
        if trial._trial_id not in cache:
            cache[trial._trial_id] = "fixed_params" in trial.system_attrs
        return cache[trial._trial_id]

    def _enqueued_cache(self) -> dict[int, bool]:
        if not hasattr(self._local, "enqueued"):
            self._local.enqueued = {}
        return self._local.enqueued

    def _view(self, study: Study) -> SwarmView:
        trials = study._get_trials(deepcopy=False, use_cache=True)
        # One view per snapshot of the trials (Optuna refreshes that snapshot at every ask).
        key = (id(study._storage), study._study_id, id(trials), len(trials))
        cached = getattr(self._local, "view", None)
        if cached is not None and cached[0] == key and cached[2] is trials:
            return cached[1]
        signs = tuple(-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in study.directions)
        sign = signs if len(signs) > 1 else signs[0]
        view = self._history.view(study._storage, study._study_id, trials, sign)
        self._local.view = (key, view, trials)
        return view

    def _entropy(self, study: Study) -> int:
        if self._seed is not None:
            entropy = self._seed
        else:
            text = f"{study.study_name}\0{study._study_id}"
            entropy = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return entropy ^ (self._salt << 64) if self._salt else entropy


def _check_bounds(
    bounds: Mapping[str, tuple[float, float]] | None,
) -> dict[str, tuple[float, float]]:
    if bounds is None:
        return {}
    checked = {}
    for name, pair in bounds.items():
        try:
            low, high = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise ValueError(
                f"The bounds for {name!r} must be a pair (low, high), got {pair!r}."
            ) from None
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise ValueError(
                f"The bounds for {name!r} must be finite with low <= high, got {pair!r}."
            )
        checked[name] = (low, high)
    return checked


__all__ = ["PSOSampler"]
