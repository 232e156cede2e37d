"""The trading environment's accounting, its price data, the Gymnasium wrapper, and the Sharpe ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adapters._rl import frame as _rl
from adapters._rl import scoring as _scoring
from adapters.envs import BUY, HOLD, SELL, GymVecEnv, TradingEnv, load_prices, synthetic_prices
from orchestrator.errors import UserError

torch.set_num_threads(1)

PRICES = [100.0, 102.0, 101.0, 101.0, 104.0, 103.0]
COST, MULTIPLIER, HOLD_WEIGHT, HOLD_COST = 0.001, 2.0, 0.5, 0.01


def _hand_env(num_envs: int = 2) -> TradingEnv:
    return TradingEnv(
        np.array(PRICES),
        num_envs=num_envs,
        window=1,
        max_position=1,
        cost_rate=COST,
        cost_multiplier=MULTIPLIER,
        hold_penalty_weight=HOLD_WEIGHT,
        hold_cost=HOLD_COST,
        reward_scale=1.0,
        episode_steps=100,
        random_starts=False,
        return_scale=1.0,
    )


def test_hand_computed_episode_costs_penalties_and_position_limits():
    env = _hand_env()
    obs = env.reset()
    # First decision at t=1: one log return (100 -> 102) and a flat position.
    assert obs[0].tolist() == pytest.approx([math.log(102 / 100), 0.0])

    def R(t: int) -> float:
        return PRICES[t + 1] / PRICES[t] - 1

    # env 0: buy, buy (blocked at the limit of 1), sell, sell; env 1: sell, sell (blocked), buy, hold.
    plan = [(BUY, SELL), (BUY, SELL), (SELL, BUY), (SELL, HOLD)]
    positions = [(1, -1), (1, -1), (0, 0), (-1, 0)]
    traded = [(1, 1), (0, 0), (1, 1), (1, 0)]
    totals = [0.0, 0.0]
    for k, (actions, held, moved) in enumerate(zip(plan, positions, traded, strict=True)):
        t = k + 1
        step = env.step(torch.tensor(actions))
        assert env.position.tolist() == list(held) or k == 3  # the last step resets positions
        for e in range(2):
            pnl = held[e] * R(t) - COST * moved[e]
            reward = (
                held[e] * R(t)
                - COST * MULTIPLIER * moved[e]
                - HOLD_WEIGHT * HOLD_COST * abs(held[e])
            )
            totals[e] += reward
            assert float(env.pnl[e]) == pytest.approx(pnl, abs=1e-12)
            assert float(step.reward[e]) == pytest.approx(reward, abs=1e-6)
        assert not step.terminated.any()
        # The series ends after t=4 (the last price with one after it): a truncation, never a termination.
        assert step.truncated.tolist() == [k == 3, k == 3]

    # The step that ended the episode led to t=5 with env 0 short one unit...
    assert step.final_obs[0].tolist() == pytest.approx([math.log(103 / 104), -1.0])
    # ...and the episode restarted at t=1, flat.
    assert step.obs[0].tolist() == pytest.approx([math.log(102 / 100), 0.0])
    assert env.position.tolist() == [0, 0]
    assert env.finished_returns == pytest.approx(totals, abs=1e-6)


def test_restarting_without_asking_the_device_gives_the_same_episodes():
    # The GPU path restarts ended episodes with no host sync; on the CPU it must match the path
    # that asks first, step for step, and keep the same finished returns.
    envs = [_hand_env(), _hand_env()]
    envs[1].ask_before_restart = False
    obs = [env.reset() for env in envs]
    generator = torch.Generator().manual_seed(0)
    for _ in range(12):  # three episodes of four steps
        actions = torch.randint(3, (2,), generator=generator)
        steps = [env.step(actions) for env in envs]
        for field in range(5):
            assert torch.equal(steps[0][field], steps[1][field])
        obs = [step.obs for step in steps]
    assert torch.equal(obs[0], obs[1])
    assert len(envs[1].finished_returns) == 6
    assert envs[1].finished_returns == envs[0].finished_returns


def test_reward_scale_and_longer_windows():
    env = TradingEnv(
        np.array(PRICES), window=3, max_position=2, reward_scale=100.0, random_starts=False
    )
    obs = env.reset()
    assert obs.shape == (1, 4)
    env.step(torch.tensor([BUY]))
    step = env.step(torch.tensor([BUY]))  # t=4: long 2 units into 104 -> 103, costs 5 bp a unit
    assert float(step.reward[0]) == pytest.approx(100 * (2 * (103 / 104 - 1) - 5e-4), rel=1e-5)


def test_random_starts_are_reproducible_and_stay_in_range():
    prices = synthetic_prices(2_000, seed=3)
    starts = []
    for _ in range(2):
        env = TradingEnv(prices, num_envs=64, window=32, episode_steps=100, end=1_000, seed=7)
        env.reset()
        starts.append(env.t.clone())
    assert torch.equal(starts[0], starts[1])
    assert int(starts[0].min()) >= 32 and int(starts[0].max()) <= 1_000 - 2 - 99
    other = TradingEnv(prices, num_envs=64, window=32, episode_steps=100, end=1_000, seed=8)
    other.reset()
    assert not torch.equal(starts[0], other.t)


def test_synthetic_prices_are_seeded_and_have_their_regimes():
    a, b = synthetic_prices(3_000, seed=1), synthetic_prices(3_000, seed=1)
    assert np.array_equal(a, b) and len(a) == 3_000 and (a > 0).all()
    assert not np.array_equal(a, synthetic_prices(3_000, seed=2))

    def lag1(prices: np.ndarray) -> float:
        r = np.diff(np.log(prices))
        return float(np.corrcoef(r[:-1], r[1:])[0, 1])

    assert lag1(synthetic_prices(5_000, seed=0, regime="mean_reversion")) < -0.05
    trend = np.diff(np.log(synthetic_prices(5_000, seed=0, regime="trend")))
    # Persistent drift: 20-step sums of returns vary far more than 20 independent steps would.
    sums = np.convolve(trend, np.ones(20), mode="valid")
    assert sums.var() / (20 * trend.var()) > 1.5
    volatile = np.diff(np.log(synthetic_prices(5_000, seed=0, regime="volatile")))
    assert volatile.std() > 2 * trend.std()


def _csv(tmp_path, text: str):
    path = tmp_path / "prices.csv"
    path.write_text(text)
    return path


def test_csv_with_a_close_column_loads(tmp_path):
    rows = "\n".join(f"{2000 + i}-01-01,{100 + i * 0.5}" for i in range(250))  # one a date
    prices = load_prices(_csv(tmp_path, "date,Close\n" + rows + "\n"))
    assert len(prices) == 250 and prices[0] == 100.0 and prices[-1] == pytest.approx(224.5)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("date,open\n2020-01-01,1\n", "no `close` column"),
        ("", "no `close` column"),
        ("close\n" + "100\n" * 50 + "abc\n", "line 52: close 'abc' is not a number"),
        ("close\n" + "100\n" * 10 + "-3\n", "must be a positive price"),
        ("close\n" + "100\n" * 20, "has 20 prices"),
    ],
)
def test_malformed_csv_is_a_user_error_naming_the_file_and_problem(tmp_path, text, problem):
    path = _csv(tmp_path, text)
    with pytest.raises(UserError) as caught:
        load_prices(path)
    assert str(path) in str(caught.value) and problem in str(caught.value)


def test_missing_price_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_prices(tmp_path / "nope.csv")


def test_sharpe_ratio_is_annualised_mean_over_std():
    pnl = torch.tensor([0.01, -0.005, 0.02, 0.0])
    expected = float(pnl.double().mean() / pnl.double().std(unbiased=False)) * math.sqrt(252)
    assert _scoring.sharpe_ratio(pnl) == pytest.approx(expected)
    assert _scoring.sharpe_ratio(torch.zeros(10)) == 0.0  # never trading scores 0


def _buy_and_hold_sharpe(prices, period) -> float:
    part = prices[period.start : period.end]
    pnl = part[1:] / part[:-1] - 1
    pnl[0] -= 5e-4  # the one purchase
    return float(pnl.mean() / pnl.std() * math.sqrt(252))


def test_a_trial_is_scored_on_the_validation_part_only():
    task = _rl.load_task({"env": "trading", "seed": 0})
    n = len(task.prices)
    assert (task.train.start, task.train.end) == (0, int(0.6 * n))
    assert (task.scored.start, task.scored.end) == (int(0.6 * n), int(0.8 * n))
    seen = []

    def always_long(obs: torch.Tensor) -> torch.Tensor:
        seen.append(obs)
        return torch.full((obs.shape[0],), BUY)

    sharpe = task.evaluate(always_long, torch.device("cpu"), max_position=1)
    assert len(seen) == task.scored.length - 1  # one decision per price but the last
    assert sharpe == pytest.approx(_buy_and_hold_sharpe(task.prices, task.scored), rel=1e-6)


def test_the_test_part_is_last_and_no_trial_is_scored_on_it():
    options = {"env": "trading", "seed": 0, "folds": 3}
    final = _rl.test_task(options)
    n = len(final.prices)
    assert (final.scored.start, final.scored.end) == (int(0.8 * n), n)
    assert final.train.end == final.scored.start  # the final run learns from all before it
    for task in _rl.fold_tasks(options):
        assert task.scored.end <= final.scored.start and task.train.end <= task.scored.start


def test_baselines_stand_on_the_same_periods():
    options = {"env": "trading", "seed": 0}
    market = _rl.load_market(options)
    scores = _rl.baselines(options)
    assert scores["flat"] == {"validation": 0.0, "test": 0.0}
    for name, period in (("validation", market.validation), ("test", market.periods.test)):
        expected = _buy_and_hold_sharpe(market.prices, period)
        assert scores["buy_and_hold"][name] == pytest.approx(expected, rel=1e-6)
    assert scores == _rl.baselines(options)  # the random policy's seeds are fixed
    assert scores["random"]["test"] < scores["buy_and_hold"]["test"]


def test_gymnasium_wrapper_gives_final_observations_and_returns():
    env = GymVecEnv("CartPole-v1", num_envs=3, seed=0)
    obs = env.reset()
    assert obs.shape == (3, 4) and env.n_actions == 2
    ended = 0
    for _ in range(60):
        step = env.step(torch.zeros(3, dtype=torch.long))  # always push left: falls in ~10 steps
        done = step.terminated | step.truncated
        if done.any():
            ended += int(done.sum())
            assert not torch.equal(step.final_obs[done], step.obs[done])
        assert torch.equal(step.final_obs[~done], step.obs[~done])
    env.close()
    assert len(env.finished_returns) == ended > 3
    assert all(5 <= r <= 30 for r in env.finished_returns)


@pytest.mark.parametrize(
    ("env_id", "problem"),
    [("NoSuchEnv-v9", "neither 'trading' nor a registered"), ("Pendulum-v1", "Box action space")],
)
def test_unusable_gymnasium_ids_are_user_errors(env_id, problem):
    with pytest.raises(UserError, match=problem):
        _rl.load_task({"env": env_id})
