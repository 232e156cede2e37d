"""Adapters make models tunable. `get(name)` returns one; `available()` names every installed one.

Built-in adapters are listed here; users add theirs through the entry-point group
`orchestrator.adapters` in their own package, or with `--adapter-path module:attribute`.
A broken third-party adapter is reported by name and never stops the others.
"""

from __future__ import annotations

# Marks this package as gpu-study-orchestrator's (see orchestrator.imports).
__gpu_study_orchestrator__ = True


import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.base import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    Adapter,
    BaseAdapter,
    MemoryModel,
    memory_model_of,
    parse_options,
    problems_with,
)
from adapters.objective import ObjectiveAdapter, load_objective
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    from importlib import metadata
else:
    # Read only to list the adapters: with its email parsing it is a tenth of `--help`'s imports.
    metadata = LazyImport("importlib.metadata")

__all__ = [
    "BATCH_SIZE_MAX",
    "BATCH_SIZE_MIN",
    "Adapter",
    "AdapterEntry",
    "BaseAdapter",
    "MemoryModel",
    "available",
    "discover",
    "get",
    "load_path",
    "memory_model_of",
    "parse_options",
]

ENTRY_POINT_GROUP = "orchestrator.adapters"

# name -> "module:attribute"; imported only when asked for, so `--help` stays instant.
BUILTIN: dict[str, str] = {
    "synthetic": "adapters.synthetic:adapter",
    "dqn": "adapters.dqn:adapter",
    "ppo": "adapters.ppo:adapter",
    "tft": "adapters.tft:adapter",
}


@dataclass(frozen=True)
class AdapterEntry:
    """One adapter as found: loaded, or with the one-line reason it could not be."""

    name: str
    origin: str  # "built-in", "entry point <dist>", or "path <module:attribute>"
    target: str  # module:attribute
    adapter: Any | None = None
    error: str | None = None


def _load_target(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{target!r} is not module:attribute")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()  # a class is instantiated with no arguments
    return obj


def _entry(name: str, origin: str, target: str) -> AdapterEntry:
    try:
        adapter = _load_target(target)
    except Exception as error:  # a third party's import may raise anything
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return AdapterEntry(name, origin, target, error=f"{type(error).__name__}: {reason}")
    problems = problems_with(adapter)
    if problems:
        return AdapterEntry(name, origin, target, error="missing " + ", ".join(problems))
    return AdapterEntry(name, origin, target, adapter=adapter)


def _declared() -> list[tuple[str, str, str]]:
    found = [(name, "built-in", target) for name, target in BUILTIN.items()]
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BUILTIN and point.value == BUILTIN[point.name]:
            continue  # our own distribution declares the built-ins too
        dist = getattr(point.dist, "name", None) or "unknown package"
        found.append((point.name, f"entry point ({dist})", point.value))
    return found


def discover() -> list[AdapterEntry]:
    """Every declared adapter, each loaded or with its error."""
    return [_entry(name, origin, target) for name, origin, target in _declared()]


def available() -> list[str]:
    """The names of every installed adapter (built-in and entry points), whether or not it loads."""
    return sorted({name for name, _, _ in _declared()})


def get(name: str) -> Any:
    """The adapter called `name`; an unknown or broken one is a UserError naming what to do."""
    for declared_name, origin, target in _declared():
        if declared_name != name:
            continue
        entry = _entry(declared_name, origin, target)
        if entry.error:
            raise UserError(f"adapter {name!r} ({origin}, {target}) cannot be used: {entry.error}")
        return entry.adapter
    raise UserError(
        f"unknown adapter {name!r}: choose one of {', '.join(available())}, "
        "or load your own with --adapter-path module:attribute"
    )


def load_path(target: str) -> Any:
    """An adapter from `module:attribute` (the `--adapter-path` route)."""
    entry = _entry(target.partition(":")[2] or target, f"path {target}", target)
    if entry.error:
        raise UserError(f"--adapter-path {target!r} cannot be used: {entry.error}")
    return entry.adapter


def resolve(ref: str, *, is_path: bool, objective: bool = False, **settings: Any) -> Any:
    """The adapter a study names: a registered name, `module:attribute` when `is_path`, or a plain
    objective function `module:qualname` when `objective` (with its name, direction and metric
    in `settings`)."""
    if objective:
        try:
            function = load_objective(ref)
        except (ImportError, AttributeError, ValueError) as error:
            raise UserError(
                f"the objective {ref!r} cannot be imported here ({error}): it must be a "
                "module-level function of a module every node can import"
            ) from None
        return ObjectiveAdapter(function, **settings)
    return load_path(ref) if is_path else get(ref)


def metric_name(adapter: Any, options: Mapping[str, Any]) -> str:
    """What the objective's value is, in the user's words (it may depend on the options)."""
    metric_for = getattr(adapter, "metric_for", None)
    if callable(metric_for):
        return str(metric_for(options))
    return str(getattr(adapter, "metric", "value"))
