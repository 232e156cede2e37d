"""make_sampler: a sampler by name, as `run --sampler NAME` asks for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

# Every name `make_sampler` knows, the default first: the one list (`run --sampler` offers it).
SAMPLER_NAMES = ("pso", "tpe", "random", "qmc", "cmaes")


def make_sampler(
    name: str,
    *,
    seed: int | None,
    swarm_size: int = 20,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    independent_seed_offset: int = 0,
) -> BaseSampler:
    """The sampler called `name`, with `bounds` applied to what it proposes.

    The particle swarm ("pso") draws its randomness from (seed, trial number), so every process
    gets the same `seed` and still makes different steps. Optuna's own samplers draw from a
    random generator inside the sampler object: two processes seeded alike propose the same
    points. So for them the seed is `seed + independent_seed_offset`, and each process must pass
    a different offset (its pid, or a slot counter). QMC is the exception: its points come from
    one shared (scrambled) sequence, so it keeps `seed` as it is and the offset only seeds its
    fallback.
    """
    import optuna

    from samplers._bounded import bounded
    from samplers._pso import PSOSampler

    if name not in SAMPLER_NAMES:
        raise ValueError(f"Unknown sampler {name!r}: choose one of {', '.join(SAMPLER_NAMES)}.")
    if name == "pso":
        return PSOSampler(swarm_size=swarm_size, seed=seed, bounds=bounds)
    own_seed = None if seed is None else (seed + independent_seed_offset) % 2**32
    if name == "tpe":
        sampler: BaseSampler = optuna.samplers.TPESampler(seed=own_seed, constant_liar=True)
    elif name == "random":
        sampler = optuna.samplers.RandomSampler(seed=own_seed)
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
    return bounded(sampler, bounds)
