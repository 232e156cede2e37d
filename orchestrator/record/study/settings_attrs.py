"""The study's settings as optuna-dashboard shows them: one user attribute per setting.

The settings are stored whole as one JSON value (`study.SPEC_ATTR`, what every process reads
back), which optuna-dashboard draws as one long JSON string. So each setting is also a user
attribute of its own, in a table a person reads at a glance: `setting: epochs` = 8,
`option: trial_seconds` = 0.5, `grid: lr` = "0.001, 0.01". They are written with the spec and
never read back: the spec stays the one source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec


def readable_settings(spec: StudySpec) -> dict[str, Any]:
    """The attributes to show: each setting that is set, each adapter option, each grid line."""
    values = spec.to_attr()
    options = values.pop("options", None) or {}
    grid = values.pop("grid", None) or {}
    shown: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value == []:
            continue
        shown[f"setting: {name}"] = ", ".join(map(str, value)) if isinstance(value, list) else value
    for name, value in options.items():
        shown[f"option: {name}"] = value
    for name, points in grid.items():
        shown[f"grid: {name}"] = ", ".join(map(str, points))
    return shown


def show_settings(study: optuna.Study, spec: StudySpec) -> None:
    """Set the readable attributes that differ from what the study shows now."""
    current = study.user_attrs
    for key, value in readable_settings(spec).items():
        if current.get(key) != value:
            study.set_user_attr(key, value)
