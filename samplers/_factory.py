"""The samplers `run --sampler NAME` offers: one declaration each, and `make_sampler`.

A sampler's rules live in its declaration (`SamplerKind`): how it is made, whether a process
keeps one object or makes one per trial, how it is seeded, how many objectives it takes, what
`--swarm-size` counts for it, whether it needs checkpoints or a grid, its default pruner. The
commands and the trial process read the declaration (`sampler_kind`) and never test a name.
Optuna and the samplers load when a sampler is made, not when a declaration is read: `run --help`
offers `SAMPLER_NAMES` without loading Optuna. A new sampler is its module, its declaration
here, and its tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Asked:
    """What `make_sampler` was asked for, as a declaration's `make` takes it."""

    seed: int | None  # the study's seed (shared) or this process's (offset), as declared
    own_seed: int | None  # always this process's: for a fallback sampler of a shared one
    swarm_size: int | None  # None: the sampler's own default
    bounds: Mapping[str, tuple[float, float]] | None
    grid: Mapping[str, Sequence[Any]] | None


@dataclass(frozen=True)
class SamplerKind:
    """One sampler's rules: what every reader of a study's sampler asks of it."""

    name: str  # as `run --sampler` takes it
    make: Callable[[Asked], BaseSampler]
    # One object per process (a swarm whose state is in the storage, a shared walk of a grid),
    # brought up to date trial after trial; else one made anew for each trial, seeded by its
    # number (Optuna's own keep their random generator in the object).
    kept: bool = False
    # Every process gets the study's seed as it is (the sampler draws from (seed, trial number),
    # or from one shared sequence); else the seed is offset per process, or two would propose alike.
    shared_seed: bool = False
    # Processes agree only through the study's one seed, and the sampler cannot derive one: a
    # study stored without a seed derives it from the study (record/study/spec.load_spec).
    seed_from_study: bool = False
    several_objectives: bool = True
    swarm: tuple[str, str] | None = None  # what --swarm-size sizes, and what it counts
    # Settings of the study only this sampler reads: a resume that changes one is drift
    # (record/study/drift.py).
    settings: tuple[str, ...] = ()
    needs_checkpoints: bool = False  # it continues trials from their checkpoints
    needs_grid: bool = False  # it walks the values given for each parameter
    # It hands each trial its parameters from a plan of its own: a fused group fixes none of
    # them (run/trial/group.py), and its members of other shapes train in sub-groups.
    plans_params: bool = False
    default_pruner: str | None = None  # None: the study's default (StudySpec.pruner)


def _swarm(asked: Asked) -> BaseSampler:
    """The particle swarm: one class for one objective or several (the study's directions decide
    how it is led); it keeps the bounds itself."""
    sized = {} if asked.swarm_size is None else {"swarm_size": asked.swarm_size}
    return _pso.PSOSampler(seed=asked.seed, bounds=asked.bounds, **sized)


def _population(asked: Asked) -> BaseSampler:
    """Population-based training (`samplers._pbt`) of `swarm_size` members; like the swarm it
    draws from `seed` and the trial number, and keeps its population in the storage."""
    sized = {} if asked.swarm_size is None else {"population": asked.swarm_size}
    return _bounded.bounded(_pbt.PBTSampler(seed=asked.seed, **sized), asked.bounds)


def _tpe(asked: Asked) -> BaseSampler:
    # Constant liar, as Optuna advises for parallel workers; it works for several
    # objectives too (a running trial counts as the worst on every one).
    sampler = optuna.samplers.TPESampler(seed=asked.seed, constant_liar=True)
    return _bounded.bounded(sampler, asked.bounds)


def _random(asked: Asked) -> BaseSampler:
    return _bounded.bounded(optuna.samplers.RandomSampler(seed=asked.seed), asked.bounds)


def _qmc(asked: Asked) -> BaseSampler:
    # Scrambled (randomised) QMC needs one seed in every process: then all of them draw
    # from one sequence. `run` stores a seed with every study, so only a caller that gives
    # none gets the plain Sobol sequence, which every process shares without a seed.
    sampler = optuna.samplers.QMCSampler(
        seed=asked.seed,
        scramble=asked.seed is not None,
        independent_sampler=optuna.samplers.RandomSampler(seed=asked.own_seed),
    )
    return _bounded.bounded(sampler, asked.bounds)


def _cmaes(asked: Asked) -> BaseSampler:
    sampler = optuna.samplers.CmaEsSampler(
        seed=asked.seed,
        independent_sampler=optuna.samplers.RandomSampler(seed=asked.seed),
        warn_independent_sampling=False,
    )
    return _bounded.bounded(sampler, asked.bounds)


def _nsga2(asked: Asked) -> BaseSampler:
    return _bounded.bounded(optuna.samplers.NSGAIISampler(seed=asked.seed), asked.bounds)


def _grid(asked: Asked) -> BaseSampler:
    assert asked.grid is not None
    # The grid's seed only shuffles the order; every process must walk the same order.
    grid = {k: list(v) for k, v in asked.grid.items()}
    return _bounded.bounded(optuna.samplers.GridSampler(grid, seed=asked.seed), asked.bounds)


# Every sampler `make_sampler` knows, the default first (`run --sampler` offers them in this order).
SAMPLER_KINDS: dict[str, SamplerKind] = {
    kind.name: kind
    for kind in (
        SamplerKind(
            "pso",
            _swarm,
            kept=True,
            shared_seed=True,
            swarm=("swarm", "particles"),
            settings=("swarm_size",),
        ),
        SamplerKind("tpe", _tpe),
        SamplerKind("random", _random),
        SamplerKind("qmc", _qmc, shared_seed=True, seed_from_study=True, several_objectives=False),
        SamplerKind("cmaes", _cmaes, several_objectives=False),
        SamplerKind("nsga2", _nsga2),
        SamplerKind("grid", _grid, kept=True, shared_seed=True, needs_grid=True),
        SamplerKind(
            "pbt",
            _population,
            shared_seed=True,
            several_objectives=False,
            swarm=("population", "members"),
            needs_checkpoints=True,
            plans_params=True,
            # PBT replaces members itself: a pruner would stop segments about to be copied.
            default_pruner="none",
        ),
    )
}
SAMPLER_NAMES = tuple(SAMPLER_KINDS)
# The samplers that model a single objective only: asked for more, they refuse.
SINGLE_OBJECTIVE_ONLY = tuple(n for n, k in SAMPLER_KINDS.items() if not k.several_objectives)
# What a name no declaration has reads as: a user's own Optuna sampler (its class's name), or
# no --sampler typed (the stored or default one decides later). `make_sampler` refuses it.
UNDECLARED = SamplerKind("", lambda asked: _not_declared())


def sampler_kind(name: str | None) -> SamplerKind:
    """The declaration of the sampler called `name`, or `UNDECLARED` for a name none has."""
    return SAMPLER_KINDS.get(name or "", UNDECLARED)


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
    `process_seed(seed, independent_seed_offset)`, and each process must pass a different offset (its pid, or
    a slot counter). QMC is the exception: its points come from one shared (scrambled) sequence,
    so it keeps `seed` as it is and the offset only seeds its fallback. "grid" needs `grid`, the
    values of each parameter (Optuna's GridSampler, which every process walks without repeats).
    "pbt" is population-based training of `swarm_size` members, shared as the swarm is.
    """
    kind = _check(name, n_objectives, grid)
    own_seed = None if seed is None else process_seed(seed, independent_seed_offset)
    shared = seed if kind.shared_seed else own_seed
    return kind.make(Asked(shared, own_seed, swarm_size, bounds, grid))


def process_seed(seed: int, offset: int) -> int:
    """The seed of the sampler made with `offset` in a study seeded `seed`: `seed` itself at
    offset 0, else a hash of the pair. Not `seed + offset`: the study seeded 4 would draw
    exactly what the study seeded 3 draws one trial later."""
    if not offset:
        return seed % 2**32
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**32, offset % 2**32]).generate_state(1)[0])


def _not_declared() -> BaseSampler:
    raise ValueError(
        f"No sampler is declared by that name: choose one of {', '.join(SAMPLER_KINDS)}."
    )


def _check_known(name: str) -> SamplerKind:
    if name not in SAMPLER_KINDS:
        raise ValueError(f"Unknown sampler {name!r}: choose one of {', '.join(SAMPLER_KINDS)}.")
    return SAMPLER_KINDS[name]


def _check(name: str, n_objectives: int, grid: Mapping[str, Sequence[Any]] | None) -> SamplerKind:
    kind = _check_known(name)
    if isinstance(n_objectives, bool) or not isinstance(n_objectives, int) or n_objectives < 1:
        raise ValueError(f"The `{n_objectives=}` must be a whole number of at least 1.")
    if n_objectives > 1 and not kind.several_objectives:
        several = [
            k.name for k in SAMPLER_KINDS.values() if k.several_objectives and not k.needs_grid
        ]
        raise ValueError(
            f"The sampler {name!r} optimises one objective only, and this study has "
            f"{n_objectives}: choose one of {', '.join(several)}."
        )
    if kind.needs_grid:
        if not grid:
            raise ValueError(
                f"The sampler {name!r} needs the values to try for each parameter: pass "
                "grid={'name': [value, ...], ...}."
            )
        empty = sorted(k for k, v in grid.items() if isinstance(v, str) or not list(v))
        if empty:
            raise ValueError(
                f"The grid for {', '.join(map(repr, empty))} must be a non-empty list of values."
            )
    return kind
