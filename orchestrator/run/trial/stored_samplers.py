"""The samplers a study stores, made into objects for one GPU's batch bounds.

Two kinds are stored rather than named: an Optuna sampler object given to `optimize` (pickled
with the study's settings, `orchestrator.record.store.optuna_objects`) and the grid of `--sampler grid`
(`orchestrator.record.study.grid`). A trial process makes each one here, bounded to its GPU's batch
sizes; the record layer only stores and reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_objects import unpickled

if TYPE_CHECKING:
    import samplers
else:
    # Loads Optuna: a spawned trial process imports this module before its signal handlers are
    # set, and a Ctrl-C then would be a traceback; it loads when a trial makes its sampler.
    samplers = LazyImport("samplers")


def user_sampler(text: str, bounds: tuple[int, int]) -> Any:
    """The study's sampler object for a GPU's batch bounds, its generator reseeded for this process."""

    sampler = unpickled(text)
    sampler.reseed_rng()
    return samplers.bounded(sampler, {"batch_size": bounds})


def walked_once(sampler: Any, bounds: tuple[int, int]) -> Any:
    """`sampler` (a GridSampler, bounded), except that its request to stop the study once the
    grid is walked is dropped: `study.stop()` only works inside `study.optimize`, and raises in
    a trial process; here the study's budget, one walk of the grid, ends it instead."""

    class WalkedOnce(samplers.BoundedSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            try:
                super().after_trial(study, trial, state, values)
            except RuntimeError as error:
                if "Study.stop" not in str(error):
                    raise

    return WalkedOnce(sampler, {"batch_size": bounds})
