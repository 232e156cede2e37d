"""The task of an RL trial: its options, its environment and prices, and the baselines.

`Task` is one training run's environment and how its policy is scored: the trading
environment on the training part of the prices, scored on the validation part (`envs.periods`:
train, validation, test in time order; `--option folds=K` gives one task per walk-forward fold),
or a Gymnasium environment scored on its validation episodes. `test_task` is the final run's,
scored on the test part that no trial has seen. DQN and PPO share all of it through `_rl`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters._rl.scoring import (
    EVAL_SEED_OFFSET,
    TEST_SEED_OFFSET,
    WINDOW,
    gym_baselines,
    mean_eval_return,
    period_sharpe,
    trading_baselines,
)
from adapters.base import SEED_MAX, InputFile, Range
from adapters.envs import (
    REGIME_CHOICES,
    GymVecEnv,
    TradingEnv,
    check_gym_id,
    load_prices,
    synthetic_prices,
)
from adapters.envs.periods import MAX_FOLDS, Period, Periods, trading_periods
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import optuna
    import torch

    Policy = Callable[[torch.Tensor], torch.Tensor]
else:
    np = LazyImport("numpy")

# Options both adapters accept (each adds its own `steps_per_epoch` default).
COMMON_OPTIONS: dict[str, Any] = {
    "env": "trading",  # "trading" or a Gymnasium id with a discrete action space
    "data": "",  # a CSV with a `close` column; empty: the seeded synthetic series
    "regime": "mixed",  # synthetic series only: mixed, trend, mean_reversion, volatile
    "seed": 0,  # one seed for prices, environments and networks: every trial uses the same
    "folds": 1,  # trading only: walk-forward folds over the validation part (envs.periods)
}

# What each option accepts (RLAdapter's `option_ranges`, so both adapters check them).
OPTION_RANGES = {
    "data": InputFile(),
    "seed": Range(0, SEED_MAX),
    "steps_per_epoch": Range(1),
    "folds": Range(1, MAX_FOLDS),
}

SYNTHETIC_LENGTH = (
    10_000  # about 40 years of daily prices: 6,000 train, 2,000 validation, 2,000 test
)
EPISODE_STEPS = 256  # training episode length on the trading environment


@dataclass(frozen=True)
class Task:
    """The environment of one training run and how its policy is scored."""

    env_id: str
    seed: int
    prices: np.ndarray | None = None  # trading only
    train: Period | None = None  # trading only: the prices it trains on
    scored: Period | None = None  # trading only: the prices its policy is scored on
    return_scale: float = 1.0  # trading only: std of the training part's log returns
    eval_seed_offset: int = EVAL_SEED_OFFSET  # Gymnasium only: which episodes score it

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
        if not self.is_trading:
            return GymVecEnv(self.env_id, num_envs=num_envs, device=device, seed=self.seed)
        assert self.train is not None
        return TradingEnv(
            self.prices,
            num_envs=num_envs,
            window=WINDOW,
            max_position=max_position,
            cost_multiplier=cost_multiplier,
            hold_penalty_weight=hold_penalty_weight,
            episode_steps=EPISODE_STEPS,
            end=self.train.end,
            return_scale=self.return_scale,
            device=device,
            seed=self.seed,
        )

    def evaluate(self, policy: Policy, device: torch.device, *, max_position: int = 1) -> float:
        """The run's score for a greedy `policy` (see `_rl/scoring`)."""
        if not self.is_trading:
            return mean_eval_return(
                self.env_id, policy, device, seed=self.seed + self.eval_seed_offset
            )
        assert self.prices is not None and self.scored is not None
        return period_sharpe(
            self.prices,
            self.scored,
            policy,
            device,
            max_position=max_position,
            return_scale=self.return_scale,
        )


def metric_for(options: Mapping[str, Any]) -> str:
    """What a trial's value is for these options: a Sharpe ratio on trading, a return elsewhere."""
    return "sharpe" if str(options.get("env", "trading")) == "trading" else "return"


def suggest_trading(trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
    """The trading environment's own parameters, searched only on `--env trading`."""
    if str(options.get("env", "trading")) != "trading":
        return {}
    return {
        "hold_penalty_weight": trial.suggest_float("hold_penalty_weight", 0.0, 3.0),
        "max_position_absolute": trial.suggest_int("max_position_absolute", 1, 10),
        "transaction_cost_multiplier": trial.suggest_float(
            "transaction_cost_multiplier", 0.25, 2.0
        ),
    }


@dataclass(frozen=True)
class Market:
    """A trading task's prices and how they are cut (see `envs.periods`)."""

    prices: np.ndarray
    periods: Periods

    def task(self, seed: int, train: Period, scored: Period) -> Task:
        log_returns = np.diff(np.log(self.prices[train.start : train.end]))
        return Task(
            env_id="trading",
            seed=seed,
            prices=self.prices,
            train=train,
            scored=scored,
            return_scale=float(max(log_returns.std(), 1e-12)),
        )

    @property
    def validation(self) -> Period:
        """The whole validation part, every fold's window together."""
        return Period(self.periods.folds[0].validation.start, self.periods.test.start)


def load_market(options: Mapping[str, Any]) -> Market | None:
    """The prices and their periods on `--env trading`; None on a Gymnasium id. Every problem
    with the options is a one-line UserError."""
    env_id = str(options.get("env", "trading"))
    steps = int(options.get("steps_per_epoch", 1))
    if steps < 1:
        raise UserError(f"--option steps_per_epoch={steps} must be at least 1")
    data = str(options.get("data", "") or "")
    regime = str(options.get("regime", "mixed"))
    folds = int(options.get("folds", 1))
    if env_id != "trading":
        if data:
            raise UserError(f"--data is for --env trading only, not {env_id!r}: drop one of them")
        if folds != 1:
            raise UserError(f"--option folds is for --env trading only, not {env_id!r}")
        check_gym_id(env_id)
        return None
    if regime not in REGIME_CHOICES:
        raise UserError(
            f"--option regime={regime} is unknown: use one of {', '.join(REGIME_CHOICES)}"
        )
    seed = int(options.get("seed", 0))
    prices = (
        load_prices(Path(data))
        if data
        else synthetic_prices(SYNTHETIC_LENGTH, seed=seed, regime=regime)
    )
    return Market(prices, trading_periods(len(prices), folds, window=WINDOW))


def fold_tasks(options: Mapping[str, Any]) -> list[Task]:
    """One task per walk-forward fold (one without `folds`): trained and scored before the test."""
    seed = int(options.get("seed", 0))
    market = load_market(options)
    if market is None:
        return [Task(env_id=str(options["env"]), seed=seed)]
    return [market.task(seed, fold.train, fold.validation) for fold in market.periods.folds]


def load_task(options: Mapping[str, Any]) -> Task:
    """The task of a trial without folds (the first fold's with them)."""
    return fold_tasks(options)[0]


def test_task(options: Mapping[str, Any]) -> Task:
    """The final run: trained on everything before the test part, scored on the test part
    (on Gymnasium: the test episodes)."""
    seed = int(options.get("seed", 0))
    market = load_market(options)
    if market is None:
        return Task(env_id=str(options["env"]), seed=seed, eval_seed_offset=TEST_SEED_OFFSET)
    return market.task(seed, market.periods.before_test, market.periods.test)


def baselines(options: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """What a tuned agent's validation and test scores stand beside (see `_rl/scoring`)."""
    market = load_market(options)
    if market is None:
        return gym_baselines(str(options["env"]), int(options.get("seed", 0)))
    scale = market.task(0, market.periods.before_test, market.periods.test).return_scale
    periods = {"validation": market.validation, "test": market.periods.test}
    return trading_baselines(market.prices, periods, return_scale=scale)
