"""PSOSampler: particle-swarm optimisation over an Optuna study, shared by every worker.

The swarm has no home process. Each trial is one step of one particle, and the step is written
into that trial's system attributes; any process, on any node, rebuilds the swarm from the
storage when it samples, so a worker that starts cold continues the same swarm.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import TrialState

from orchestrator.record.store.optuna_private import (
    process_constraints_after_trial,
    storage_of,
    study_id_of,
    study_trials,
    trial_id_of,
)
from samplers._history import PARAM_KEY_PREFIX, RECORD_KEY, History, SwarmView
from samplers._lhs import name_key, start_size
from samplers._model.front_screen import front_move
from samplers._model.gp import one_blas_thread
from samplers._model.screen import screened_move
from samplers._moves import MEMORY_PARAMS as MEMORY_PARAMS  # re-exported beside the sampler
from samplers._moves import Swarm
from samplers._space import clip_to_bounds
from samplers._swarm import SwarmCoefficients

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial

TOPOLOGIES = ("global", "ring")
SEVERAL_MAX_VELOCITY = 0.5
# Grid points one step may cross on a small ordered grid (see samplers._swarm.dimension_clamp);
# chosen on docs/sampler.md's HPO tables with seeds other than the table's.
GRID_REACH = 2.5


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
        clamp = SwarmCoefficients.max_velocity if max_velocity is None else max_velocity
        # Several objectives: SMPSO's clamp at half of each range unless one is given. A swarm
        # that must cover a front, not close in on one point, needs the longer steps (measured
        # in docs/sampler.md).
        several = SEVERAL_MAX_VELOCITY if max_velocity is None else max_velocity
        if not (0 <= search_radius <= 1):
            raise ValueError(f"The `{search_radius=}` must be in [0, 1]: a fraction of each range.")
        if isinstance(grid_reach, bool) or not (
            isinstance(grid_reach, int | float) and math.isfinite(grid_reach) and grid_reach >= 0
        ):
            raise ValueError(f"The `{grid_reach=}` must be a finite number >= 0 (grid points).")
        checked_bounds = _check_bounds(bounds)
        if isinstance(archive_size, bool) or not isinstance(archive_size, int) or archive_size < 1:
            raise ValueError(f"The `{archive_size=}` must be a whole number of at least 1.")
        self._swarm = Swarm(
            size=swarm_size,
            coefficients=SwarmCoefficients(inertia, cognitive, social, clamp),
            several_coefficients=SwarmCoefficients(inertia, cognitive, social, several),
            search_radius=search_radius,
            grid_reach=float(grid_reach),
            topology=topology,
            bounds=checked_bounds,
            archive_size=archive_size,
        )
        self._seed = seed
        self._salt = 0  # set by reseed_rng
        self._independent_sampler = independent_sampler
        self._constraints_func = constraints_func
        self._local = threading.local()
        self._history = _HISTORY

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
        screened = None
        if trial.number >= start_size(len(names)):
            move = front_move if view.several else screened_move
            with _one_blas_thread():
                screened = move(self._swarm, view, entropy, trial.number, search_space)
        if screened is not None:
            params, moves = screened
        else:
            moves = {
                name: self._swarm.move(view, entropy, trial.number, name, search_space[name])
                for name in names
            }
            params = {
                name: self._swarm.value(name, search_space[name], moves[name].x) for name in names
            }
            params, moves = self._swarm.dedupe(
                view, entropy, trial.number, search_space, params, moves
            )
        record: dict[str, Any] = {
            "p": trial.number % self._swarm.size,
            "x": {name: [moves[name].x, moves[name].v] for name in names},
        }
        storage_of(study).set_trial_system_attr(trial_id_of(trial), RECORD_KEY, record)
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
        move = self._swarm.move(
            self._view(study), entropy, trial.number, param_name, param_distribution
        )
        storage_of(study).set_trial_system_attr(
            trial_id_of(trial),
            PARAM_KEY_PREFIX + param_name,
            [trial.number % self._swarm.size, move.x, move.v],
        )
        return self._swarm.value(param_name, param_distribution, move.x)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        # Remember whether the trial was enqueued while its system attributes are at hand
        # (later calls get a trial whose attributes are read from the storage on each access).
        self._enqueued_cache()[trial_id_of(trial)] = "fixed_params" in trial.system_attrs
        if self._independent_sampler is not None:
            self._independent_sampler.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._enqueued_cache().pop(trial_id_of(trial), None)
        if self._constraints_func is not None:
            # Stored under Optuna's own key, where NSGA-II, TPE and the swarm all read it.
            process_constraints_after_trial(self._constraints_func, study, trial, state)
        if self._independent_sampler is not None:
            self._independent_sampler.after_trial(study, trial, state, values)

    # -- helpers ----------------------------------------------------------------------------

    def _sample_open_parameter(
        self, study: Study, trial: FrozenTrial, entropy: int, name: str, dist: BaseDistribution
    ) -> Any:
        if self._independent_sampler is not None:
            value = self._independent_sampler.sample_independent(study, trial, name, dist)
            if name in self._swarm.bounds and not isinstance(dist, CategoricalDistribution):
                value = clip_to_bounds(dist, value, self._swarm.bounds[name])
            return value
        rng = np.random.default_rng([entropy, trial.number, name_key(name), 0x0E0E])
        return self._swarm.value(name, dist, float(rng.random()))

    def _is_enqueued(self, trial: FrozenTrial) -> bool:
        cache = self._enqueued_cache()
        if trial_id_of(trial) not in cache:
            cache[trial_id_of(trial)] = "fixed_params" in trial.system_attrs
        return cache[trial_id_of(trial)]

    def _enqueued_cache(self) -> dict[int, bool]:
        if not hasattr(self._local, "enqueued"):
            self._local.enqueued = {}
        return self._local.enqueued

    def _view(self, study: Study) -> SwarmView:
        trials = study_trials(study, use_cache=True)
        # One view per snapshot of the trials (Optuna refreshes that snapshot at every ask).
        key = (id(storage_of(study)), study_id_of(study), id(trials), len(trials))
        cached = getattr(self._local, "view", None)
        if cached is not None and cached[0] == key and cached[2] is trials:
            return cached[1]
        signs = tuple(-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in study.directions)
        sign = signs if len(signs) > 1 else signs[0]
        view = self._history.view(storage_of(study), study_id_of(study), trials, sign)
        self._local.view = (key, view, trials)
        return view

    def _entropy(self, study: Study) -> int:
        if self._seed is not None:
            entropy = self._seed
        else:
            text = f"{study.study_name}\0{study_id_of(study)}"
            entropy = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return entropy ^ (self._salt << 64) if self._salt else entropy


# Finished trials never change: their parsed records are shared by every sampler object of
# the process, so that a new object per trial (as trial processes make) reads each trial once.
_HISTORY = History()


def _one_blas_thread() -> Any:
    """The model's linear algebra on one thread. Its matrices are small (a few hundred rows),
    and a trial process shares its cores with the training beside it: with OpenBLAS's threads
    each small solve waited for a second core (a 100-trial study on a busy 2-core machine took
    177 s instead of 13). See samplers._model.gp.one_blas_thread."""
    return one_blas_thread()


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
