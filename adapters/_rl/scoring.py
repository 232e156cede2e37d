"""How a policy is scored, and what it is judged against.

- Trading: the annualised Sharpe ratio of a greedy policy run once through a period of the
  prices (see `envs.periods`), starting flat at the period's first price, under the real cost
  (`cost_rate`, multiplier 1) and no hold penalty. With `pnl_t` the net return at each step
  (position x price return - cost x units traded), Sharpe = mean(pnl) / std(pnl) x sqrt(252),
  each step being one trading day (population std; 0 when the policy never holds a position, so
  that doing nothing scores 0, not infinity).
- Gymnasium: the mean undiscounted return of the greedy policy over `EVAL_EPISODES` episodes
  from fixed seeds; validation and test use different seeds, neither shared with training.

Baselines are scored the same way on the same periods: on trading, buying and holding one unit,
staying flat, and a uniformly random policy (mean over `RANDOM_TRIES` seeds); on Gymnasium, the
random policy. A tuned agent's figure means little without them beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from adapters.envs import GymVecEnv, TradingEnv
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import torch

    from adapters.envs.periods import Period

    Policy = Callable[[torch.Tensor], torch.Tensor]
else:
    torch = LazyImport("torch")

WINDOW = 32  # log returns in a trading observation
TRADING_DAYS = 252
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 10_000  # validation episodes never share seeds with training ones
TEST_SEED_OFFSET = 20_000  # nor do test episodes with either
EVAL_MAX_STEPS = 10_000  # a guard for environments without a time limit
RANDOM_TRIES = 5
BASELINE_SEED = 123


def sharpe_ratio(pnl: torch.Tensor, periods_per_year: int = TRADING_DAYS) -> float:
    """mean / std (population) x sqrt(periods_per_year); 0 for a flat or constant series."""
    pnl = pnl.double()
    std = float(pnl.std(unbiased=False))
    if len(pnl) < 2 or std < 1e-12:
        return 0.0
    return float(pnl.mean()) / std * math.sqrt(periods_per_year)


def period_sharpe(
    prices: np.ndarray,
    period: Period,
    policy: Policy,
    device: torch.device,
    *,
    max_position: int,
    return_scale: float,
) -> float:
    """Run the greedy policy once through `period` of the prices, from a flat position."""
    return period_sharpes(
        prices, period, policy, device, max_position=max_position, return_scale=return_scale
    )[0]


def period_sharpes(
    prices: np.ndarray,
    period: Period,
    policy: Policy,
    device: torch.device,
    *,
    max_position: int,
    return_scale: float,
    runs: int = 1,
) -> list[float]:
    """`runs` copies of the policy side by side through `period` (a random policy's copies act
    independently): each copy's Sharpe ratio."""
    env = TradingEnv(
        prices,
        num_envs=runs,
        window=WINDOW,
        max_position=max_position,
        episode_steps=len(prices),
        start=period.start - WINDOW,  # the first decision is at the period's first price
        end=period.end,
        random_starts=False,
        return_scale=return_scale,
        device=device,
    )
    obs = env.reset()
    pnl = []
    # The period has a known length: no asking the device each step whether it ended.
    with torch.inference_mode():
        for _ in range(env.last_t - env.first_t + 1):
            obs = env.step(policy(obs)).obs
            pnl.append(env.pnl)
    steps = torch.stack(pnl)  # (steps, runs)
    return [sharpe_ratio(steps[:, k]) for k in range(runs)]


def mean_eval_return(env_id: str, policy: Policy, device: torch.device, *, seed: int) -> float:
    """Mean return of the first episode of each of `EVAL_EPISODES` copies, run side by side."""
    return mean_eval_returns(env_id, lambda obs, members: policy(obs), 1, device, seed=seed)[0]


def mean_eval_returns(
    env_id: str,
    policy: Callable[[torch.Tensor, list[int]], torch.Tensor],
    members: int,
    device: torch.device,
    *,
    seed: int,
) -> list[float]:
    """`mean_eval_return` of each of a fused group's members at once: one vector env of
    `members` x `EVAL_EPISODES` copies, member k's copies seeded as its own trial's (so each
    member plays the episodes it plays alone). `policy(obs, members)` acts for the members
    still playing, `EVAL_EPISODES` rows each in that order: a member whose episodes have all
    ended leaves the vector env, so a long episode of one member does not step the others'."""
    seeds = [seed + episode for episode in range(EVAL_EPISODES)] * members
    env = GymVecEnv(env_id, num_envs=members * EVAL_EPISODES, device=device, seed=seeds)
    playing = list(range(members))
    try:
        obs = env.reset()
        returns = torch.zeros(members, EVAL_EPISODES, dtype=torch.float64)
        running = torch.ones(members, EVAL_EPISODES, dtype=torch.bool)
        with torch.inference_mode():
            for _ in range(EVAL_MAX_STEPS):
                step = env.step(policy(obs, playing))
                index = torch.tensor(playing)
                shape = (len(playing), EVAL_EPISODES)
                reward = step.reward.double().cpu().view(shape) * running[index]
                returns[index] += reward
                running[index] &= ~(step.terminated | step.truncated).cpu().view(shape)
                still = [m for m in playing if bool(running[m].any())]
                if not still:
                    break
                obs = step.obs
                if len(still) < len(playing):
                    keep = [playing.index(m) for m in still]
                    env.keep([k * EVAL_EPISODES + e for k in keep for e in range(EVAL_EPISODES)])
                    rows = torch.tensor(
                        [k * EVAL_EPISODES + e for k in keep for e in range(EVAL_EPISODES)]
                    )
                    obs = obs.index_select(0, rows.to(obs.device))
                    playing = still
    finally:
        env.close()
    return returns.mean(dim=1).tolist()


def random_policy(n_actions: int, seed: int) -> Policy:
    """Uniformly random actions from a generator of its own: the same seed, the same actions."""
    generator = torch.Generator().manual_seed(seed)
    return lambda obs: torch.randint(n_actions, (obs.shape[0],), generator=generator).to(obs.device)


def buy_and_hold_sharpe(prices: np.ndarray, period: Period, *, cost_rate: float = 5e-4) -> float:
    """One unit bought at the period's first price and held to its last (what the trading
    environment's accounting gives a policy that always buys, in closed form)."""
    part = torch.as_tensor(prices[period.start : period.end], dtype=torch.float64)
    pnl = part[1:] / part[:-1] - 1.0
    pnl[0] -= cost_rate  # the one purchase
    return sharpe_ratio(pnl)


def trading_baselines(
    prices: np.ndarray, periods: dict[str, Period], *, return_scale: float
) -> dict[str, dict[str, float]]:
    """Buy-and-hold, flat and random Sharpe ratios on each named period, one unit at most."""
    cpu = torch.device("cpu")

    def random_mean(period: Period) -> float:
        tries = period_sharpes(
            prices,
            period,
            random_policy(3, BASELINE_SEED),
            cpu,
            max_position=1,
            return_scale=return_scale,
            runs=RANDOM_TRIES,
        )
        return sum(tries) / len(tries)

    return {
        "buy_and_hold": {name: buy_and_hold_sharpe(prices, p) for name, p in periods.items()},
        "flat": dict.fromkeys(periods, 0.0),  # no position, no return: 0 by the rule above
        "random": {name: random_mean(p) for name, p in periods.items()},
    }


def gym_baselines(env_id: str, seed: int) -> dict[str, dict[str, float]]:
    """The random policy's mean return on the validation and the test episodes."""
    probe = GymVecEnv(env_id, num_envs=1, seed=seed)
    n_actions = probe.n_actions
    probe.close()
    cpu = torch.device("cpu")
    offsets = {"validation": EVAL_SEED_OFFSET, "test": TEST_SEED_OFFSET}
    return {
        "random": {
            name: mean_eval_return(
                env_id, random_policy(n_actions, BASELINE_SEED), cpu, seed=seed + offset
            )
            for name, offset in offsets.items()
        }
    }
