"""The adapter a stored study names, loaded in this process from the study's settings.

A study's settings (`orchestrator.record.study.spec.StudySpec`) say which adapter it tunes: a
registered name, a `module:attribute` path, or a plain objective function. Loading it is the
plugins' work, so it lives here rather than with the stored settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import adapters

if TYPE_CHECKING:
    from orchestrator.record.study.spec import StudySpec


def resolve_adapter(spec: StudySpec) -> Any:
    """The adapter that the study of `spec` tunes, loaded in this process."""
    return adapters.resolve(
        spec.adapter,
        is_path=spec.adapter_path,
        objective=spec.objective,
        **_objective_settings(spec),
    )


def _objective_settings(spec: StudySpec) -> dict[str, Any]:
    """A plain objective's name, direction and metric; nothing for an adapter."""
    if not spec.objective:
        return {}
    name = spec.adapter.rpartition(":")[2]
    return {"name": name, "direction": spec.direction, "metric": spec.metric or "value"}
