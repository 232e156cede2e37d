"""Optuna distributions <-> the unit interval, one parameter at a time.

The swarm lives in [0, 1] per parameter. `from_unit` turns a coordinate into a value the
distribution accepts (a Python int, float or one of the choices); `to_unit` is its inverse,
giving the centre of the value's cell. Log ranges are uniform in log space; step and int ranges
give every grid point a cell of equal width (the range is widened by half a step on each side,
as Optuna's own transform does); categorical choices are cells in their declared order.
`clip_to_bounds` maps a value into a per-process range such as the planner's batch-size bounds,
keeping the distribution's log and step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution


def unit_edges(dist: BaseDistribution) -> tuple[float, float, bool]:
    """The continuous range the unit interval spans: (lo, hi, in_log_space)."""
    if isinstance(dist, CategoricalDistribution):
        return 0.0, float(len(dist.choices)), False
    if isinstance(dist, IntDistribution):
        if dist.log:
            return math.log(dist.low - 0.5), math.log(dist.high + 0.5), True
        half = dist.step / 2
        return dist.low - half, dist.high + half, False
    if isinstance(dist, FloatDistribution):
        if dist.log:
            return math.log(dist.low), math.log(dist.high), True
        if dist.step is not None:
            half = dist.step / 2
            return dist.low - half, dist.high + half, False
        return dist.low, dist.high, False
    raise ValueError(f"The distribution {dist!r} is not supported by the particle swarm.")


def _grid_point(dist: BaseDistribution, k: int) -> int | float:
    """The k-th value of a stepped `dist`'s grid, as a value `dist` accepts.

    Summing steps in floats can land just past the grid (0.1 + 6 x 0.1 = 0.7000000000000001,
    outside [0.1, 0.7]): the result is re-rounded to the step's decimals and kept in the range.
    """
    assert dist.step is not None
    if isinstance(dist, IntDistribution):
        return int(min(max(dist.low + k * dist.step, dist.low), dist.high))
    decimals = max(0, -math.floor(math.log10(dist.step)) + 6)
    return float(min(max(round(dist.low + k * dist.step, decimals), dist.low), dist.high))


def _snap(dist: BaseDistribution, value: float, low: float, high: float) -> int | float:
    """Nearest value of `dist`'s grid inside [low, high] (which lie on the grid)."""
    if isinstance(dist, IntDistribution) or (
        isinstance(dist, FloatDistribution) and dist.step is not None
    ):
        snapped = _grid_point(dist, round((value - dist.low) / dist.step))
        return type(snapped)(min(max(snapped, low), high))
    return float(min(max(value, low), high))


def grid_size(dist: BaseDistribution) -> int | None:
    """How many values an ordered grid has: ints and stepped floats on a linear scale.

    None for a continuous range, a log scale (its cells are not of equal width) and categorical
    choices (their declared order is no neighbourhood: a longer step means nothing there).
    """
    if getattr(dist, "log", True) or getattr(dist, "step", None) is None:
        return None
    return int(round((dist.high - dist.low) / dist.step)) + 1


def from_unit(dist: BaseDistribution, u: float) -> Any:
    """The value at coordinate `u` in [0, 1] (values outside are clipped)."""
    u = min(max(float(u), 0.0), 1.0)
    lo, hi, log = unit_edges(dist)
    if isinstance(dist, CategoricalDistribution):
        index = min(int(u * len(dist.choices)), len(dist.choices) - 1)
        return dist.choices[index]
    raw = lo + u * (hi - lo)
    if log:
        raw = math.exp(raw)
    return _snap(dist, raw, dist.low, dist.high)


def to_unit(dist: BaseDistribution, value: Any) -> float:
    """The coordinate of `value`'s cell centre (the inverse of `from_unit` on the grid)."""
    lo, hi, log = unit_edges(dist)
    if isinstance(dist, CategoricalDistribution):
        return (dist.choices.index(value) + 0.5) / len(dist.choices)
    if hi == lo:
        return 0.5
    position = math.log(value) if log else float(value)
    return min(max((position - lo) / (hi - lo), 0.0), 1.0)


def grid_bounds(dist: BaseDistribution, bounds: tuple[float, float]) -> tuple[Any, Any]:
    """`bounds` intersected with `dist`'s range and moved inward onto its grid.

    Raises ValueError when nothing of `dist` lies inside `bounds`.
    """
    if isinstance(dist, CategoricalDistribution):
        raise ValueError("Bounds apply to numeric parameters only, not to categorical ones.")
    lo, hi = max(bounds[0], dist.low), min(bounds[1], dist.high)
    empty = lo > hi
    if dist.step is not None:
        # Grid points, re-rounded and kept inside [low, high] (see _grid_point).
        k_lo = math.ceil((lo - dist.low) / dist.step - 1e-9)
        k_hi = math.floor((hi - dist.low) / dist.step + 1e-9)
        empty = k_lo > k_hi
        lo, hi = _grid_point(dist, k_lo), _grid_point(dist, k_hi)
    if isinstance(dist, IntDistribution):
        lo, hi = int(lo), int(hi)
    elif isinstance(dist, FloatDistribution):
        lo, hi = float(lo), float(hi)
    if empty:
        raise ValueError(
            f"The bounds {tuple(bounds)} leave no value of {dist}: give bounds that overlap "
            f"[{dist.low}, {dist.high}]."
        )
    return lo, hi


def clip_to_bounds(dist: BaseDistribution, value: Any, bounds: tuple[float, float]) -> Any:
    """`value` moved to the nearest value of `dist` inside `bounds` (log and step kept)."""
    lo, hi = grid_bounds(dist, bounds)
    return _snap(dist, min(max(value, lo), hi), lo, hi)
