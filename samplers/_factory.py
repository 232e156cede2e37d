"""make_sampler: a sampler by name, as `run --sampler NAME` asks for it.

Optuna and the samplers load when a sampler is made, not when its name is read: `run --help`
offers `SAMPLER_NAMES` without loading Optuna. A new sampler is its module, its name and branch
here, and its tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import optuna
    from optuna.samplers import BaseSampler

    from samplers import _bounded, _pbt, _pso
else:
    optuna = LazyImport("optuna")
    _bounded = LazyImport("samplers._bounded")
    _pbt = LazyImport("samplers._pbt")
    _pso = LazyImport("samplers._pso")

# Every name `make_sampler` knows, the default first: the one list (`run --sampler` offers it).
SAMPLER_NAMES = ("pso", "tpe", "random", "qmc", "cmaes", "nsga2", "grid", "pbt")
# The samplers that model a single objective only: asked for more, they refuse.
SINGLE_OBJECTIVE_ONLY = ("qmc", "cmaes", "pbt")


def make_sampler(
    name: str,
    *,
    seed: int | None,
    swarm_size: int | None = None,  # None: the swarm's own default
    bounds: Mapping[str, tuple[float, float]] | None = None,
    independent_seed_offset: int = 0,
    n_objectives: int = 1,
    grid: Mapping[str, Sequence[Any]] | None = None,
) -> BaseSampler:
    """The sampler called `name`, for a study of `n_objectives` objectives, with `bounds` applied.

    The particle swarm ("pso") draws its randomness from (seed, trial number), so every process
    gets the same `seed` and still makes different steps; with several objectives it is the
    multi-objective swarm. Optuna's own samplers draw from a random generator inside the
    sampler object: two processes seeded alike propose the same points. So for them the seed is
    `seed + independent_seed_offset`, and each process must pass a different offset (its pid, or
    a slot counter). QMC is the exception: its points come from one shared (scrambled) sequence,
    so it keeps `seed` as it is and the offset only seeds its fallback. "grid" needs `grid`, the
    values of each parameter (Optuna's GridSampler, which every process walks without repeats).
    "pbt" is population-based training of `swarm_size` members, shared as the swarm is.
    """
    _check(name, n_objectives, grid)
    if name == "pso":
        return _swarm(seed, swarm_size, bounds)
    if name == "pbt":
        return _bounded.bounded(_population(seed, swarm_size), bounds)
    own_seed = None if seed is None else (seed + independent_seed_offset) % 2**32
    if name == "tpe":
        # Constant liar, as Optuna advises for parallel workers; it works for several
        # objectives too (a running trial counts as the worst on every one).
        sampler: BaseSampler = optuna.samplers.TPESampler(seed=own_seed, constant_liar=True)
    elif name == "random":
        sampler = optuna.samplers.RandomSampler(seed=own_seed)
    elif name == "nsga2":
        sampler = optuna.samplers.NSGAIISampler(seed=own_seed)
    elif name == "grid":
        assert grid is not None
        # The grid's seed only shuffles the order; every process must walk the same order.
        sampler = optuna.samplers.GridSampler({k: list(v) for k, v in grid.items()}, seed=seed)
    elif name == "qmc":
        # Scrambled (randomised) QMC needs one seed in every process: then all of them draw
        # from one sequence. `run` stores a seed with every study, so only a caller that gives
        # none gets the plain Sobol sequence, which every process shares without a seed.
        sampler = optuna.samplers.QMCSampler(
            seed=seed,
            scramble=seed is not None,
            independent_sampler=optuna.samplers.RandomSampler(seed=own_seed),
        )
    else:
        sampler = optuna.samplers.CmaEsSampler(
            seed=own_seed,
            independent_sampler=optuna.samplers.RandomSampler(seed=own_seed),
            warn_independent_sampling=False,
        )
    return _bounded.bounded(sampler, bounds)


def _swarm(
    seed: int | None, swarm_size: int | None, bounds: Mapping[str, tuple[float, float]] | None
) -> BaseSampler:
    """The particle swarm: one class for one objective or several (the study's directions decide
    how it is led); `swarm_size` None takes the swarm's own default."""
    sized = {} if swarm_size is None else {"swarm_size": swarm_size}
    return _pso.PSOSampler(seed=seed, bounds=bounds, **sized)


def _population(seed: int | None, swarm_size: int | None) -> BaseSampler:
    """Population-based training (`samplers._pbt`) of `swarm_size` members; like the swarm it
    draws from `seed` and the trial number, and keeps its population in the storage."""
    sized = {} if swarm_size is None else {"population": swarm_size}
    return _pbt.PBTSampler(seed=seed, **sized)


def _check(name: str, n_objectives: int, grid: Mapping[str, Sequence[Any]] | None) -> None:
    if name not in SAMPLER_NAMES:
        raise ValueError(f"Unknown sampler {name!r}: choose one of {', '.join(SAMPLER_NAMES)}.")
    if isinstance(n_objectives, bool) or not isinstance(n_objectives, int) or n_objectives < 1:
        raise ValueError(f"The `{n_objectives=}` must be a whole number of at least 1.")
    if n_objectives > 1 and name in SINGLE_OBJECTIVE_ONLY:
        several = [n for n in SAMPLER_NAMES if n not in SINGLE_OBJECTIVE_ONLY and n != "grid"]
        raise ValueError(
            f"The sampler {name!r} optimises one objective only, and this study has "
            f"{n_objectives}: choose one of {', '.join(several)}."
        )
    if name == "grid":
        if not grid:
            raise ValueError(
                "The sampler 'grid' needs the values to try for each parameter: pass "
                "grid={'name': [value, ...], ...}."
            )
        empty = sorted(k for k, v in grid.items() if isinstance(v, str) or not list(v))
        if empty:
            raise ValueError(
                f"The grid for {', '.join(map(repr, empty))} must be a non-empty list of values."
            )
