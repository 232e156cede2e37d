"""Adopting a study that plain Optuna made: what must match before its trials join ours.

A user who tuned with `optuna.create_study(study_name="mlp", storage=...)` and then switches to
`orchestrator.optimize(..., study_name="mlp")` keeps the trials done: they feed the sampler like
any other. That is only sound when the study optimises the same way and its trials drew the
parameters the orchestrator draws (the batch size, which admission sizes a trial by) from the
same distribution; otherwise Optuna would refuse every new trial with a message about log
configurations. The check is pure over the study's directions and its trials' distributions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
else:
    optuna = LazyImport("optuna")


def adoption_problem(study: optuna.Study, spec: StudySpec) -> str | None:
    """What differs between a plain Optuna study and this spec, in words; None: it can be adopted."""
    directions = [d.name.lower() for d in study.directions]
    if directions != spec.all_directions:
        return (
            f"it was created with directions {', '.join(directions)}, this call has "
            f"{', '.join(spec.all_directions)}: pass direction(s) to match it"
        )
    return batch_size_problem(_distributions(study), spec.options)


def batch_size_problem(distributions: dict[str, Any], options: dict[str, Any]) -> str | None:
    """Does the stored batch size's distribution match what `batch_sizes=` draws?"""
    stored = distributions.get(names.BATCH_SIZE)
    low, high = int(options.get("batch_size_min", 0)), int(options.get("batch_size_max", 0))
    if stored is None:
        return None
    if high <= 0:
        return (
            f"its trials draw batch_size ({stored}); pass batch_sizes=({_low(stored)}, "
            f"{_high(stored)}) so each trial is admitted by its batch"
        )
    wanted = optuna.distributions.IntDistribution(low, high, log=True)
    if stored != wanted:
        return (
            f"its trials draw batch_size as {_describe(stored)}, batch_sizes=({low}, {high}) "
            f"draws it as {_describe(wanted)}: pass batch_sizes=({_low(stored)}, {_high(stored)})"
            " and draw it with log=True"
        )
    return None


def _distributions(study: optuna.Study) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        found.update(trial.distributions)
    return found


def _low(dist: Any) -> Any:
    return getattr(dist, "low", None) if hasattr(dist, "low") else min(dist.choices)


def _high(dist: Any) -> Any:
    return getattr(dist, "high", None) if hasattr(dist, "high") else max(dist.choices)


def _describe(dist: Any) -> str:
    if hasattr(dist, "choices"):
        return f"one of {list(dist.choices)}"
    scale = ", log scale" if getattr(dist, "log", False) else ""
    return f"an integer {dist.low}..{dist.high}{scale}"
