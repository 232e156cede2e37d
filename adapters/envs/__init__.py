"""Environments for the RL adapters: the vectorised trading environment, its prices, and Gymnasium.

Every environment here has the same tensor interface: `num_envs`, `obs_dim`, `n_actions`,
`reset() -> obs`, `step(actions) -> StepResult` and `close()`, plus `finished_returns` (the
return of every episode that ended). Importing this package is cheap: torch and gymnasium load on first use.
"""

from __future__ import annotations

from adapters.envs.base import StepResult
from adapters.envs.gym_vec import GymVecEnv, check_gym_id
from adapters.envs.prices import REGIME_CHOICES, load_prices, synthetic_prices
from adapters.envs.trading import BUY, HOLD, SELL, TradingEnv

__all__ = [
    "BUY",
    "HOLD",
    "REGIME_CHOICES",
    "SELL",
    "GymVecEnv",
    "StepResult",
    "TradingEnv",
    "check_gym_id",
    "load_prices",
    "synthetic_prices",
]
