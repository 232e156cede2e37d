"""`bounded(sampler, bounds)`: any Optuna sampler, with some parameters kept inside per-process bounds.

The study declares `batch_size` over the static range on every node; each process maps what its
sampler proposes into the bounds its GPU's plan allows. Everything else is delegated untouched,
so relative samplers (TPE multivariate, CMA-ES, QMC) keep their own state and their own logic;
they learn from the values that were really run, which are the mapped ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler

from samplers._pso import _check_bounds
from samplers._space import clip_to_bounds

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState


class BoundedSampler(BaseSampler):
    """Delegates to `sampler`; values of parameters named in `bounds` are moved into them."""

    def __init__(self, sampler: BaseSampler, bounds: Mapping[str, tuple[float, float]]) -> None:
        self._sampler = sampler
        self._bounds = _check_bounds(bounds)

    @property
    def sampler(self) -> BaseSampler:
        return self._sampler

    def __str__(self) -> str:
        return f"{self._sampler}(bounded {self._bounds})"

    def can_start_now(self, study: Study) -> bool:
        """The wrapped sampler's answer (run/trial/group.py asks it), True if it has none."""
        ready = getattr(self._sampler, "can_start_now", None)
        return ready is None or bool(ready(study))

    def _map(self, name: str, dist: BaseDistribution, value: Any) -> Any:
        if name not in self._bounds or isinstance(dist, CategoricalDistribution):
            return value
        return clip_to_bounds(dist, value, self._bounds[name])

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        params = self._sampler.sample_relative(study, trial, search_space)
        return {
            name: self._map(name, search_space[name], value) if name in search_space else value
            for name, value in params.items()
        }

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        value = self._sampler.sample_independent(study, trial, param_name, param_distribution)
        return self._map(param_name, param_distribution, value)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._sampler.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


def bounded(sampler: BaseSampler, bounds: Mapping[str, tuple[float, float]] | None) -> BaseSampler:
    """`sampler` with the parameters in `bounds` kept inside them; `sampler` itself when none."""
    if not bounds:
        return sampler
    return BoundedSampler(sampler, bounds)
