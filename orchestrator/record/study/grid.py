"""`--sampler grid`: the grid Optuna's GridSampler walks, from what the user gave.

The user names the values of the parameters they want to vary (`--grid learning_rate=0.001,0.01`,
or a `grid` table in the config file); every other parameter of the adapter's space stays at the
adapter's known-good value (its `default_params`), because GridSampler needs a value list for
every parameter the objective draws. The grid is stored with the study's settings, so every
process walks the same one (GridSampler hands each point out once across processes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import yaml
else:
    yaml = LazyImport("yaml")


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """`NAME=V1,V2,...` (or `NAME=[V1, V2]`, as a config file's table gives it) as a mapping of
    value lists; a ValueError saying what to type."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name or not text.strip():
            raise ValueError(f"--grid {item!r}: give NAME=VALUE,VALUE,..., as in lr=0.001,0.01")
        loaded = yaml.safe_load(text) if text.strip().startswith("[") else None
        parts = loaded if isinstance(loaded, list) else text.split(",")
        grid[name] = [_value(part) for part in parts]
    return grid


def _value(part: Any) -> Any:
    return yaml.safe_load(part.strip()) if isinstance(part, str) else part


def full_grid(given: Mapping[str, list[Any]], defaults: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The grid over the adapter's whole space: what was given, and each default as one point."""
    unknown = sorted(set(given) - set(defaults))
    if unknown and defaults:
        raise ValueError(
            f"--grid {', '.join(unknown)}: not a parameter of the adapter; its parameters: "
            f"{', '.join(defaults)}"
        )
    grid = {name: [value] for name, value in defaults.items()}
    grid.update({name: list(values) for name, values in given.items()})
    return grid


def grid_size(grid: Mapping[str, list[Any]]) -> int:
    """How many points the grid has: the study's budget when none is given."""
    return math.prod(len(values) for values in grid.values())
