"""The swarm's surrogate and its screen: the GP, log expected improvement, the candidates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from scipy import stats

from samplers._model.candidates import (
    Particle,
    Space,
    climb,
    neighbours,
    single_moves,
    swarm_draws,
    values_at,
)
from samplers._model.gp import GaussianProcess, _loss, log_expected_improvement, squared_differences
from samplers._space import clip_to_bounds, from_unit
from samplers._swarm import SwarmCoefficients


def test_the_likelihood_gradient_is_the_derivative_of_the_likelihood() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((25, 4))
    x[:, 3] = rng.integers(0, 3, 25)
    categorical = np.array([False, False, False, True])
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.3 * x[:, 3] + 0.1 * rng.standard_normal(25)
    y = (y - y.mean()) / y.std()
    sq = squared_differences(x, x, categorical)
    raw = rng.normal(size=6) * 0.5
    _, grad = _loss(raw, sq, y)
    h = 1e-6
    numeric = [
        (_loss(raw + e, sq, y)[0] - _loss(raw - e, sq, y)[0]) / (2 * h) for e in np.eye(6) * h
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-5)
    # Points that pool several observations carry less noise: the gradient follows.
    shares = 1.0 / rng.integers(1, 5, 25)
    _, grad = _loss(raw, sq, y, shares)
    numeric = [
        (_loss(raw + e, sq, y, shares)[0] - _loss(raw - e, sq, y, shares)[0]) / (2 * h)
        for e in np.eye(6) * h
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-5)


def _noisy_bowl(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((n, 3))
    return x, np.sum((x - 0.3) ** 2, axis=1) + noise * rng.standard_normal(n)


def test_the_model_predicts_unseen_points_better_than_their_mean() -> None:
    x, y = _noisy_bowl(60, 0.01, 1)
    test_x, test_y = _noisy_bowl(200, 0.0, 2)
    gp = GaussianProcess(x, y, np.zeros(3, bool))
    mean, _ = gp.posterior(test_x)
    # The mean is in standardised units: rank correlation is what a screen uses.
    assert stats.spearmanr(mean, test_y).statistic > 0.9


def test_the_fitted_noise_grows_with_the_noise_of_the_data() -> None:
    quiet = GaussianProcess(*_noisy_bowl(60, 0.001, 3), np.zeros(3, bool))
    loud = GaussianProcess(*_noisy_bowl(60, 0.2, 3), np.zeros(3, bool))
    assert loud.kernel.noise > 10 * quiet.kernel.noise


def test_a_running_trial_shrinks_the_variance_around_it_and_leaves_the_mean() -> None:
    x, y = _noisy_bowl(30, 0.01, 4)
    gp = GaussianProcess(x, y, np.zeros(3, bool))
    running = np.array([[0.9, 0.9, 0.9]])
    near, far = np.array([[0.88, 0.9, 0.9]]), np.array([[0.1, 0.9, 0.1]])
    alone = gp.given(None)
    fantasy = gp.given(running)
    assert fantasy(near)[0] == pytest.approx(alone(near)[0])
    assert fantasy(near)[1][0] < 0.5 * alone(near)[1][0]
    assert fantasy(far)[1][0] == pytest.approx(alone(far)[1][0], rel=0.05)


def test_categorical_columns_compare_choices_not_their_order() -> None:
    # Choice 2 is like choice 0 and unlike choice 1: an order would put 1 between them.
    x = np.array([[c, u] for c in (0, 1, 2) for u in np.linspace(0, 1, 8)])
    y = np.where(x[:, 0] == 1, 1.0, 0.0) + 0.01 * x[:, 1]
    gp = GaussianProcess(x, y, np.array([True, False]))
    mean = gp.mean(np.array([[0, 0.5], [1, 0.5], [2, 0.5]]))
    assert mean[1] > mean[0] + 1 and mean[1] > mean[2] + 1


@given(
    st.floats(-50, 50),
    st.floats(1e-6, 100),
    st.floats(-50, 50),
)
def test_log_ei_is_the_log_of_ei_and_finite_in_the_tail(mean, variance, best) -> None:
    sigma = math.sqrt(variance)
    z = (best - mean) / sigma
    ei = sigma * (z * stats.norm.cdf(z) + stats.norm.pdf(z))
    got = float(log_expected_improvement(np.array([mean]), np.array([variance]), best)[0])
    assert math.isfinite(got)
    if ei > 1e-250:
        assert got == pytest.approx(math.log(ei), rel=1e-6, abs=1e-6)


def test_log_ei_orders_by_mean_then_by_uncertainty() -> None:
    scores = log_expected_improvement(np.array([0.0, 1.0, 30.0, 60.0]), np.ones(4), 0.0)
    assert list(np.argsort(-scores)) == [0, 1, 2, 3]
    wider = log_expected_improvement(np.array([30.0, 30.0]), np.array([1.0, 4.0]), 0.0)
    assert wider[1] > wider[0]


SPACE = Space.of(
    {
        "lr": FloatDistribution(1e-5, 1e-1, log=True),
        "depth": IntDistribution(1, 3),
        "units": IntDistribution(16, 512, log=True),
        "op": CategoricalDistribution(["none", "skip", "conv1x1", "conv3x3", "pool"]),
        "dropout": FloatDistribution(0.0, 0.5, step=0.1),
    },
    bounds={"units": (32, 300)},
)


def _value(name, dist, x):
    value = from_unit(dist, x)
    return clip_to_bounds(dist, value, (32, 300)) if name == "units" else value


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=5, max_size=5))
def test_positions_encode_as_the_values_they_run_with(u) -> None:
    u = np.array(u)
    values = values_at(SPACE, u, _value)
    assert np.allclose(SPACE.encode_positions(u)[0], SPACE.encode(values), atol=1e-9)


def test_a_categorical_move_switches_choices_and_lands_on_their_cells() -> None:
    rng = np.random.default_rng(0)
    centre = SPACE.position({"lr": 1e-3, "depth": 2, "units": 64, "op": "skip", "dropout": 0.2})
    op = SPACE.names.index("op")
    near = neighbours(SPACE, centre, rng, 400)
    choices = {round(float(c) * 5 - 0.5, 9) for c in near[:, op]}
    # Every other choice is one move away, 'none' as much as 'conv3x3': no order.
    assert choices == {0.0, 1.0, 2.0, 3.0, 4.0}
    moved = near[near[:, op] != centre[op], op]
    counts = np.bincount(np.floor(moved * 5).astype(int), minlength=5)
    assert counts[1] == 0 and min(counts[[0, 2, 3, 4]]) > 40


def test_swarm_draws_take_a_categorical_choice_from_the_particle_or_its_guides() -> None:
    rng = np.random.default_rng(1)
    at = SPACE.position({"lr": 1e-3, "depth": 1, "units": 64, "op": "none", "dropout": 0.0})
    own = SPACE.position({"lr": 1e-2, "depth": 2, "units": 128, "op": "pool", "dropout": 0.1})
    best = SPACE.position({"lr": 1e-4, "depth": 3, "units": 256, "op": "skip", "dropout": 0.4})
    particle = Particle(at, np.zeros(5), own, holds_best=False)
    draws = swarm_draws(SPACE, particle, best, SwarmCoefficients(), 2.5, 0.05, rng, 300)
    op = SPACE.names.index("op")
    assert set(np.round(draws[:, op], 9)) == {
        round(at[op], 9),
        round(own[op], 9),
        round(best[op], 9),
    }
    assert np.all((draws >= 0) & (draws <= 1))


def test_a_grid_parameter_cannot_freeze_one_move_reaches_the_next_points() -> None:
    depth = SPACE.names.index("depth")
    centre = SPACE.position({"lr": 1e-3, "depth": 1, "units": 64, "op": "none", "dropout": 0.0})
    moves = single_moves(SPACE, centre)
    reached = {values_at(SPACE, m, _value)["depth"] for m in moves if m[depth] != centre[depth]}
    assert reached == {2, 3}


def test_climbing_finds_the_best_of_a_grid_from_a_corner() -> None:
    target = SPACE.position({"lr": 1e-3, "depth": 3, "units": 64, "op": "conv3x3", "dropout": 0.3})
    op = SPACE.names.index("op")

    def score(u: np.ndarray) -> np.ndarray:
        u = np.atleast_2d(u)
        return -np.sum((u - target) ** 2, axis=1) - 5.0 * (np.abs(u[:, op] - target[op]) > 1e-9)

    start = SPACE.position({"lr": 1e-3, "depth": 1, "units": 64, "op": "none", "dropout": 0.0})
    u, _ = climb(SPACE, start, float(score(start)[0]), score, rounds=10)
    assert values_at(SPACE, u, _value)["depth"] == 3
    assert values_at(SPACE, u, _value)["op"] == "conv3x3"
    assert values_at(SPACE, u, _value)["dropout"] == pytest.approx(0.3)


def test_the_best_by_the_model_is_not_one_lucky_draw() -> None:
    # A smooth bowl with its minimum at 0.3, observed with noise; the lowest observation is a
    # lucky draw at 0.8, among close neighbours that all did badly.
    rng = np.random.default_rng(7)
    x = np.vstack([rng.random((40, 2)), 0.8 + 0.03 * rng.standard_normal((6, 2))])
    y = np.sum((x - 0.3) ** 2, axis=1) + 0.05 * rng.standard_normal(len(x))
    lucky = len(x) - 1
    y[lucky] = y.min() - 0.1
    gp = GaussianProcess(x, y, np.zeros(2, bool))
    best = int(np.argmin(gp.mean(x)))
    assert best != lucky
    assert np.sum((x[best] - 0.3) ** 2) < 0.05
