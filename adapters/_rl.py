"""What DQN and PPO share: the options, the task (which environment, which prices), and scoring.

The score of a trial:

- on `--env trading`: the annualised Sharpe ratio of the greedy policy on the held-out part of
  the price series (the last `1 - TRAIN_FRACTION` of it, never seen in training). The policy
  starts flat at the first held-out price and trades to the end, under the real cost
  (`cost_rate`, multiplier 1) and no hold penalty; with `pnl_t` its net return at each step
  (position x price return - cost x units traded),
  Sharpe = mean(pnl) / std(pnl) x sqrt(252), each step being one trading day (population std;
  0 when the policy never holds a position, so that doing nothing scores 0, not infinity);
- on a Gymnasium id: the mean undiscounted return of the greedy policy over `EVAL_EPISODES`
  episodes from fixed seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import optuna
    import torch

    Policy = Callable[[torch.Tensor], torch.Tensor]

# Options both adapters accept (each adds its own `steps_per_epoch` default).
COMMON_OPTIONS: dict[str, Any] = {
    "env": "trading",  # "trading" or a Gymnasium id with a discrete action space
    "data": "",  # a CSV with a `close` column; empty: the seeded synthetic series
    "regime": "mixed",  # synthetic series only: mixed, trend, mean_reversion, volatile
    "seed": 0,  # one seed for prices, environments and networks: every trial uses the same
}

TRAIN_FRACTION = 0.8
SYNTHETIC_LENGTH = 10_000  # about 40 years of daily prices: 8,000 to train, 2,000 held out
WINDOW = 32  # log returns in a trading observation
EPISODE_STEPS = 256  # training episode length on the trading environment
TRADING_DAYS = 252
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 10_000  # evaluation episodes never share seeds with training ones
EVAL_MAX_STEPS = 10_000  # a guard for environments without a time limit


@dataclass(frozen=True)
class Task:
    """The environment of a trial and how its policy is scored."""

    env_id: str
    seed: int
    prices: np.ndarray | None = None  # trading only
    split: int = 0  # trading only: index of the first held-out price
    return_scale: float = 1.0  # trading only: std of training log returns

    @property
    def is_trading(self) -> bool:
        return self.prices is not None

    @property
    def metric(self) -> str:
        return "sharpe" if self.is_trading else "return"

    def make_env(
        self,
        num_envs: int,
        device: torch.device,
        *,
        max_position: int = 1,
        cost_multiplier: float = 1.0,
        hold_penalty_weight: float = 0.0,
    ) -> Any:
        """The training environments: the training part of the prices, or Gymnasium copies."""
        from adapters.envs import GymVecEnv, TradingEnv

        if not self.is_trading:
            return GymVecEnv(self.env_id, num_envs=num_envs, device=device, seed=self.seed)
        return TradingEnv(
            self.prices,
            num_envs=num_envs,
            window=WINDOW,
            max_position=max_position,
            cost_multiplier=cost_multiplier,
            hold_penalty_weight=hold_penalty_weight,
            episode_steps=EPISODE_STEPS,
            end=self.split,
            return_scale=self.return_scale,
            device=device,
            seed=self.seed,
        )

    def evaluate(self, policy: Policy, device: torch.device, *, max_position: int = 1) -> float:
        """The trial's score for a greedy `policy` (see the module docstring)."""
        if self.is_trading:
            return held_out_sharpe(self, policy, device, max_position=max_position)
        return mean_eval_return(self.env_id, policy, device, seed=self.seed + EVAL_SEED_OFFSET)


def metric_for(options: Mapping[str, Any]) -> str:
    """What a trial's value is for these options: a Sharpe ratio on trading, a return elsewhere."""
    return "sharpe" if str(options.get("env", "trading")) == "trading" else "return"


def suggest_trading(trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
    """The trading environment's own parameters (seed 002), searched only on `--env trading`."""
    if str(options.get("env", "trading")) != "trading":
        return {}
    return {
        "hold_penalty_weight": trial.suggest_float("hold_penalty_weight", 0.0, 3.0),
        "max_position_absolute": trial.suggest_int("max_position_absolute", 1, 10),
        "transaction_cost_multiplier": trial.suggest_float(
            "transaction_cost_multiplier", 0.25, 2.0
        ),
    }


def load_task(options: Mapping[str, Any]) -> Task:
    """Validate the options and load the prices; every problem is a one-line UserError."""
    import numpy as np

    from adapters.envs import REGIME_CHOICES, check_gym_id, load_prices, synthetic_prices

    env_id = str(options.get("env", "trading"))
    seed = int(options.get("seed", 0))
    steps = int(options.get("steps_per_epoch", 1))
    if steps < 1:
        raise UserError(f"--option steps_per_epoch={steps} must be at least 1")
    data = str(options.get("data", "") or "")
    regime = str(options.get("regime", "mixed"))
    if env_id != "trading":
        if data:
            raise UserError(f"--data is for --env trading only, not {env_id!r}: drop one of them")
        check_gym_id(env_id)
        return Task(env_id=env_id, seed=seed)
    if regime not in REGIME_CHOICES:
        raise UserError(
            f"--option regime={regime} is unknown: use one of {', '.join(REGIME_CHOICES)}"
        )
    prices = (
        load_prices(Path(data))
        if data
        else synthetic_prices(SYNTHETIC_LENGTH, seed=seed, regime=regime)
    )
    split = int(len(prices) * TRAIN_FRACTION)  # load_prices makes sure both parts are long enough
    log_returns = np.diff(np.log(prices[:split]))
    return Task(
        env_id=env_id,
        seed=seed,
        prices=prices,
        split=split,
        return_scale=float(max(log_returns.std(), 1e-12)),
    )


def sharpe_ratio(pnl: torch.Tensor, periods_per_year: int = TRADING_DAYS) -> float:
    """mean / std (population) x sqrt(periods_per_year); 0 for a flat or constant series."""
    pnl = pnl.double()
    std = float(pnl.std(unbiased=False))
    if len(pnl) < 2 or std < 1e-12:
        return 0.0
    return float(pnl.mean()) / std * math.sqrt(periods_per_year)


def held_out_sharpe(
    task: Task, policy: Policy, device: torch.device, *, max_position: int
) -> float:
    """Run the greedy policy once through the held-out prices, from a flat position."""
    import torch

    from adapters.envs import TradingEnv

    assert task.prices is not None
    env = TradingEnv(
        task.prices,
        num_envs=1,
        window=WINDOW,
        max_position=max_position,
        episode_steps=len(task.prices),
        start=task.split - WINDOW,  # the first decision is at the first held-out price
        random_starts=False,
        return_scale=task.return_scale,
        device=device,
    )
    obs = env.reset()
    pnl = []
    with torch.no_grad():
        while True:
            step = env.step(policy(obs))
            pnl.append(env.pnl)
            if bool(step.truncated[0]):
                break
            obs = step.obs
    return sharpe_ratio(torch.cat(pnl))


def mean_eval_return(env_id: str, policy: Policy, device: torch.device, *, seed: int) -> float:
    """Mean return of the first episode of each of `EVAL_EPISODES` copies, run side by side."""
    import torch

    from adapters.envs import GymVecEnv

    env = GymVecEnv(env_id, num_envs=EVAL_EPISODES, device=device, seed=seed)
    try:
        obs = env.reset()
        returns = torch.zeros(EVAL_EPISODES, dtype=torch.float64)
        running = torch.ones(EVAL_EPISODES, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(EVAL_MAX_STEPS):
                step = env.step(policy(obs))
                returns += step.reward.double().cpu() * running
                running &= ~(step.terminated | step.truncated).cpu()
                if not bool(running.any()):
                    break
                obs = step.obs
    finally:
        env.close()
    return float(returns.mean())


def seed_everything(seed: int) -> None:
    """Seed torch (all devices) and numpy's global state: the same seed gives the same run."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """From `start` at t=0 to `end` at t=duration, then constant."""
    if duration <= 0:
        return end
    return start + (end - start) * min(1.0, t / duration)
