"""Known-good parameters first: the adapter's `default_params` and the user's own, as queued trials.

`run --enqueue-defaults` and `run --enqueue params.yaml` (one mapping, or a list of them) put
these parameter sets in the study's queue before any trial is asked for, so the first trials
run them. Each set is queued once per study: a resumed run, or the same file again, adds nothing.
Everything is checked against the adapter's search space before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import distribution_contains

if TYPE_CHECKING:
    import optuna
    import yaml
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial
else:
    optuna = LazyImport("optuna")
    yaml = LazyImport("yaml")

ENQUEUED_ATTR = "enqueued_from"  # trial user attribute: where its parameters came from
DEFAULTS_ORIGIN = "adapter defaults"
_SPACE_DRAWS = 8  # draws of the search space, so that conditional parameters show up too


@dataclass(frozen=True)
class Queued:
    params: dict[str, Any]
    origin: str  # DEFAULTS_ORIGIN or the file it was read from


def read_params_file(path: str) -> list[dict[str, Any]]:
    """A YAML (or JSON) file holding one mapping of parameters, or a list of them."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read --enqueue {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UserError(
            f"--enqueue {path} is not a text file: give a YAML file of parameters"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise UserError(f"--enqueue {path} is not valid YAML: {reason}") from None
    entries = [data] if isinstance(data, Mapping) else data
    if not isinstance(entries, list) or not entries:
        raise UserError(
            f"--enqueue {path} must hold a mapping of parameter names to values, or a list of them"
        )
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, Mapping) or not entry:
            raise UserError(f"--enqueue {path}: entry {i} is not a mapping of parameters")
    return [dict(entry) for entry in entries]


def search_space(adapter: Any, options: Mapping[str, Any]) -> dict[str, BaseDistribution]:
    """The parameters `suggest` declares, with their distributions (drawn in memory, no training)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space: dict[str, BaseDistribution] = {}
    for _ in range(_SPACE_DRAWS):
        trial = study.ask()
        adapter.suggest(trial, options)
        space.update(trial.distributions)
    return space


def checked_params(
    params: Mapping[str, Any], space: Mapping[str, BaseDistribution], where: str
) -> dict[str, Any]:
    """The parameters, each inside its distribution (an int as an int); else one UserError."""
    checked: dict[str, Any] = {}
    for name, value in params.items():
        dist = space.get(str(name))
        if dist is None:
            known = ", ".join(space) or "none"
            raise UserError(f"{where}: no parameter {name!r}; the adapter's parameters: {known}")
        if (
            isinstance(dist, optuna.distributions.IntDistribution)
            and isinstance(value, float)
            and value.is_integer()
        ):
            value = int(value)
        if not _contains(dist, value):
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                allowed = "one of " + ", ".join(repr(c) for c in dist.choices)
            else:
                allowed = f"within {dist.low:g}..{dist.high:g}"
            raise UserError(f"{where}: {name} = {value!r} must be {allowed}")
        checked[str(name)] = value
    return checked


def _contains(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return value in dist.choices
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return distribution_contains(dist, value)  # optuna's own range check
    except (TypeError, ValueError):
        return False


def planned_queue(
    adapter: Any, options: Mapping[str, Any], *, defaults: bool, path: str | None
) -> list[Queued]:
    """What `--enqueue-defaults` and `--enqueue FILE` ask for, checked, in the order to run."""
    if not defaults and path is None:
        return []
    space = search_space(adapter, options)
    queue: list[Queued] = []
    if defaults:
        known_good = dict(getattr(adapter, "default_params", {}) or {})
        if not known_good:
            raise UserError(
                f"adapter {adapter.name!r} has no default_params to enqueue: "
                "give your own with --enqueue params.yaml"
            )
        # Defaults may hold settings that are not searched (calibration uses them all).
        inside = {k: v for k, v in known_good.items() if k in space}
        where = f"adapter {adapter.name!r} default_params"
        queue.append(Queued(checked_params(inside, space, where), DEFAULTS_ORIGIN))
    if path is not None:
        for i, entry in enumerate(read_params_file(path), 1):
            where = f"--enqueue {path}: entry {i}"
            queue.append(Queued(checked_params(entry, space, where), str(path)))
    return queue


def not_yet_queued(queue: Iterable[Queued], trials: Iterable[FrozenTrial]) -> list[Queued]:
    """The sets no trial of the study was ever queued with (nor twice in this queue)."""
    seen = [t.system_attrs["fixed_params"] for t in trials if "fixed_params" in t.system_attrs]
    fresh: list[Queued] = []
    for item in queue:
        if not any(_same(item.params, old) for old in seen):
            fresh.append(item)
            seen.append(item.params)
    return fresh


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, float | int) and isinstance(other, float | int):
            if not math.isclose(float(value), float(other), rel_tol=1e-12, abs_tol=0.0):
                return False
        elif value != other:
            return False
    return True


def enqueue(study: optuna.Study, queue: Iterable[Queued]) -> int:
    """Queue each set as a trial; its user attributes say where it came from. How many queued."""
    count = 0
    for item in queue:
        study.enqueue_trial(item.params, user_attrs={ENQUEUED_ATTR: item.origin})
        count += 1
    return count
