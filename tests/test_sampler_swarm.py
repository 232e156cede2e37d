"""Property tests of the pure pieces: the swarm step, the unit-interval mapping, the designs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from samplers._lhs import latin_hypercube, lhs_column
from samplers._space import clip_to_bounds, from_unit, grid_bounds, grid_size, to_unit
from samplers._swarm import SwarmCoefficients, back_off, dimension_clamp, reflect, step

unit = st.floats(0.0, 1.0)
speed = st.floats(-1.0, 1.0)
rand = st.floats(0.0, 1.0, exclude_max=True)
coefficients = st.builds(
    SwarmCoefficients,
    inertia=st.floats(0.0, 1.2),
    cognitive=st.floats(0.0, 3.0),
    social=st.floats(0.0, 3.0),
    max_velocity=st.floats(0.01, 1.0),
)


def vectors(elements, size: int):
    return st.lists(elements, min_size=size, max_size=size).map(np.array)


@settings(max_examples=150, deadline=None)
@given(
    dim=st.integers(1, 6).flatmap(
        lambda d: st.tuples(*(vectors(e, d) for e in (unit, speed, unit, unit, rand, rand)))
    ),
    c=coefficients,
    jitter=st.floats(-0.2, 0.2),
)
def test_step_keeps_positions_in_the_unit_cube_and_velocity_clamped(dim, c, jitter) -> None:
    x, v, personal, neighbourhood, r1, r2 = dim
    new_x, new_v = step(x, v, personal, neighbourhood, r1, r2, c, jitter=jitter)
    assert np.all(new_x >= 0.0) and np.all(new_x <= 1.0)
    assert np.all(np.abs(new_v) <= c.max_velocity + 1e-12)
    assert new_x.shape == x.shape and new_v.shape == v.shape


@settings(max_examples=200, deadline=None)
@given(x=unit, personal=unit, neighbourhood=unit)
def test_step_moves_towards_the_bests_from_rest(x, personal, neighbourhood) -> None:
    # At rest with both bests on the same side, the particle never moves away from them.
    if (personal - x) * (neighbourhood - x) <= 0:
        return
    new_x, _ = step(
        np.array([x]),
        np.zeros(1),
        np.array([personal]),
        np.array([neighbourhood]),
        np.array([0.5]),
        np.array([0.5]),
    )
    assert (new_x[0] - x) * (personal - x) >= 0


def test_grid_size_counts_the_values_of_an_ordered_grid() -> None:
    assert grid_size(IntDistribution(0, 9)) == 10
    assert grid_size(IntDistribution(2, 10, step=2)) == 5
    assert grid_size(FloatDistribution(0.1, 0.7, step=0.1)) == 7
    assert grid_size(CategoricalDistribution(["a", "b", "c"])) is None  # no order
    assert grid_size(FloatDistribution(0.0, 1.0)) is None
    assert grid_size(IntDistribution(64, 4096, log=True)) is None  # cells of unequal width


@settings(max_examples=200, deadline=None)
@given(clamp=st.floats(0.01, 1.0), values=st.one_of(st.none(), st.integers(1, 10_000)))
def test_dimension_clamp_lets_a_step_cross_the_reach_and_never_shrinks(clamp, values) -> None:
    wide = dimension_clamp(clamp, values, reach=2.5)
    assert clamp <= wide <= 1.0
    if values is None:
        assert wide == clamp
    else:
        assert wide >= min(1.0, 2.5 / values)  # a step can cross 2.5 cells (or the whole grid)


def test_reflect_bounces_and_reverses() -> None:
    x, v = reflect(np.array([1.2, -0.1, 0.5]), np.array([0.3, -0.2, 0.1]))
    np.testing.assert_allclose(x, [0.8, 0.1, 0.5])
    np.testing.assert_allclose(v, [-0.3, 0.2, 0.1])


@given(x=unit, v=speed, evaluated=unit, halved=unit)
def test_back_off_never_moves_up_nor_keeps_upward_speed(x, v, evaluated, halved) -> None:
    new_x, new_v = back_off(x, v, evaluated, halved)
    assert new_x <= min(x, evaluated) and new_v <= 0 and new_x <= halved


@pytest.mark.parametrize("bad", [{"inertia": -1}, {"max_velocity": 0}, {"social": math.nan}])
def test_coefficients_are_validated(bad) -> None:
    with pytest.raises(ValueError):
        SwarmCoefficients(**bad)


DISTRIBUTIONS = [
    FloatDistribution(-1.0, 1.0),
    FloatDistribution(1e-7, 1.0, log=True),
    FloatDistribution(-10.2, 10.2, step=0.1),
    IntDistribution(-10, 10),
    IntDistribution(0, 10, step=2),
    IntDistribution(64, 4096, log=True),
    CategoricalDistribution(["a", "b", 3]),
]


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=str)
@settings(max_examples=40, deadline=None)
@given(u=unit)
def test_from_unit_gives_python_values_the_distribution_contains(dist, u) -> None:
    value = from_unit(dist, u)
    assert dist._contains(dist.to_internal_repr(value))
    if isinstance(dist, IntDistribution):
        assert type(value) is int
    elif isinstance(dist, FloatDistribution):
        assert type(value) is float
    # Round trip: the cell centre decodes to the same value.
    assert from_unit(dist, to_unit(dist, value)) == value


@pytest.mark.parametrize(
    "dist", [d for d in DISTRIBUTIONS if not isinstance(d, CategoricalDistribution)], ids=str
)
@settings(max_examples=40, deadline=None)
@given(u=unit, a=st.floats(-20, 5000), b=st.floats(-20, 5000))
def test_clip_to_bounds_stays_inside_and_on_the_grid(dist, u, a, b) -> None:
    lo, hi = min(a, b), max(a, b)
    try:
        grid_lo, grid_hi = grid_bounds(dist, (lo, hi))
    except ValueError:
        return  # no value of dist inside: refused, as it must be
    value = clip_to_bounds(dist, from_unit(dist, u), (lo, hi))
    assert lo - 1e-9 <= value <= hi + 1e-9
    assert grid_lo <= value <= grid_hi
    assert dist._contains(dist.to_internal_repr(value))


@st.composite
def stepped_distributions(draw):
    """A stepped float or int distribution with a few to a few hundred grid points."""
    n = draw(st.integers(0, 300))
    if draw(st.booleans()):
        step = draw(st.integers(1, 7))
        low = draw(st.integers(-100, 100))
        return IntDistribution(low, low + n * step, step=step)
    step = draw(st.sampled_from([0.1, 0.01, 0.05, 0.2, 0.25, 0.3, 1e-3, 0.7, 1.1]))
    low = round(draw(st.integers(-50, 50)) * step, 10)
    return FloatDistribution(low, round(low + n * step, 10), step=step)


@settings(max_examples=400, deadline=None)
@example(dist=FloatDistribution(0.1, 0.7, step=0.1), value=0.7, a=0.65, b=1.0)
@given(
    dist=stepped_distributions(),
    value=st.floats(-500, 500),
    a=st.floats(-500, 500),
    b=st.floats(-500, 500),
)
def test_clip_to_bounds_never_leaves_a_stepped_range(dist, value, a, b) -> None:
    # Summing steps in floats lands just past the grid (0.1 + 6 x 0.1 = 0.7000000000000001):
    # the bounds and the value must still be values Optuna accepts.
    lo, hi = min(a, b), max(a, b)
    try:
        grid_lo, grid_hi = grid_bounds(dist, (lo, hi))
    except ValueError:
        return
    for bound in (grid_lo, grid_hi):
        assert dist._contains(dist.to_internal_repr(bound)), bound
    clipped = clip_to_bounds(dist, value, (lo, hi))
    assert dist.low <= clipped <= dist.high
    assert dist._contains(dist.to_internal_repr(clipped)), clipped
    assert grid_lo <= clipped <= grid_hi


def test_grid_bounds_refuse_bounds_outside_the_range() -> None:
    with pytest.raises(ValueError, match="overlap"):
        grid_bounds(IntDistribution(64, 4096, log=True), (10, 32))
    assert grid_bounds(IntDistribution(0, 9, step=3), (1, 8)) == (3, 6)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 64), seed=st.integers(0, 2**32), design=st.integers(0, 50))
def test_every_column_is_a_latin_hypercube(n, seed, design) -> None:
    points = latin_hypercube(["lr", "batch_size", "gamma"], n, seed=seed, design=design)
    assert points.shape == (n, 3)
    for column in points.T:
        assert sorted(np.floor(column * n).astype(int)) == list(range(n))


def test_designs_are_keyed_by_name_seed_and_number() -> None:
    a = lhs_column(1, 0, "lr", 20)
    np.testing.assert_array_equal(a, latin_hypercube(["gamma", "lr"], 20, seed=1)[:, 1])
    assert not np.array_equal(a, lhs_column(2, 0, "lr", 20))
    assert not np.array_equal(a, lhs_column(1, 1, "lr", 20))
    assert not np.array_equal(a, lhs_column(1, 0, "gamma", 20))
