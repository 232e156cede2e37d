"""What DQN and PPO share: options, the task, scoring, the weights and the frame of a run.

Each algorithm's file holds the algorithm itself, top to bottom; this module holds what both
need around it: the options and the task (which environment, which prices), the score of a
trial, `Weights` (a small network's parameters in one flat tensor), `training` (the first and
last lines of every `learn`) and `RLAdapter` (the adapter's `train`).

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
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import SEED_MAX, BaseAdapter, InputFile, Range, Report
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

# What each option accepts (RLAdapter's `option_ranges`, so both adapters check them).
OPTION_RANGES = {"data": InputFile(), "seed": Range(0, SEED_MAX), "steps_per_epoch": Range(1)}

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
    # The held-out part has a known length: no asking the device each step whether it ended.
    with torch.inference_mode():
        for _ in range(env.last_t - env.first_t + 1):
            obs = env.step(policy(obs)).obs
            pnl.append(env.pnl)
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
        with torch.inference_mode():
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


class Config:
    """Base of the hyperparameter dataclasses: built from a trial's parameters."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Any:
        """The defaults overridden by `params`; names that are not fields are ignored."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in params.items() if k in known})


@dataclass
class Run:
    """What one training run did: its score, per-epoch scores, and what the loop really used."""

    value: float = float("nan")
    history: list[float] = field(default_factory=list)
    batch_sizes: set[int] = field(default_factory=set)  # sizes of the batches the loss saw
    env_steps: int = 0
    gradient_steps: int = 0
    seconds: float = 0.0
    finished_returns: list[float] = field(default_factory=list)  # training episodes


class Weights:
    """A small network's parameters as views into one flat tensor, their gradients into another.

    The layers are plain functions of these views (`torch.nn.functional`), so each algorithm's
    file shows its network in a few lines. One tensor makes zeroing, clipping and Adam's step
    one operation each instead of one per layer: on networks this small that bookkeeping costs
    as much as the matrix products. Backward accumulates into each view's `.grad`, which is a
    view into `grad`, in place.
    """

    def __init__(
        self, shapes: Mapping[str, tuple[int, ...]], device: torch.device, *, trainable: bool = True
    ) -> None:
        import torch

        self.shapes = dict(shapes)
        sizes = [math.prod(shape) for shape in shapes.values()]
        self.flat = torch.zeros(sum(sizes), device=device)
        self.grad = torch.zeros_like(self.flat)
        self.flat.grad = self.grad  # what the optimiser steps
        self.views: dict[str, torch.Tensor] = {}
        pieces = zip(self.flat.split(sizes), self.grad.split(sizes), strict=True)
        for (name, shape), (value, grad) in zip(shapes.items(), pieces, strict=True):
            view = value.view(shape)
            if trainable:
                view.requires_grad_()
                view.grad = grad.view(shape)
            self.views[name] = view

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.views[name]

    def frozen_copy(self) -> Weights:
        """A copy that takes no gradients (a target network); refresh it with `flat.copy_`."""
        copy = Weights(self.shapes, self.flat.device, trainable=False)
        copy.flat.copy_(self.flat)
        return copy

    def init_like_linear(self) -> None:
        """torch.nn.Linear's default: weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

        Each bias follows its weight in `shapes`, so a bias takes the fan-in of the one before.
        """
        import torch

        fan_in = 1
        with torch.no_grad():
            for view in self.views.values():
                fan_in = view.shape[1] if view.dim() == 2 else fan_in
                view.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def optimizer(self, learning_rate: float, **kwargs: Any) -> torch.optim.Adam:
        import torch

        fused = self.flat.device.type in ("cpu", "cuda")
        return torch.optim.Adam([self.flat], lr=learning_rate, fused=fused, **kwargs)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm(self, max_norm: float) -> None:
        """As torch.nn.utils.clip_grad_norm_: scale all gradients so their L2 norm is at most max_norm."""
        import torch

        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0))


@contextmanager
def training(
    task: Task, config: Any, device: torch.device
) -> Iterator[tuple[Any, torch.Generator, Run]]:
    """The first and last lines of every `learn`: seed, make the environments, time the run.

    Yields the environments, a generator seeded with the task's seed (on `device`) and the
    `Run` to fill in; however the run ends (a pruned trial raises out of `report`), the
    environments are closed and the run's time is recorded.
    """
    import torch

    started = time.perf_counter()
    seed_everything(task.seed)
    generator = torch.Generator(device=device)
    generator.manual_seed(task.seed)
    env = task.make_env(
        config.num_envs,
        device,
        max_position=config.max_position_absolute,
        cost_multiplier=config.transaction_cost_multiplier,
        hold_penalty_weight=config.hold_penalty_weight,
    )
    run = Run()
    try:
        yield env, generator, run
    finally:
        run.finished_returns = list(env.finished_returns)
        env.close()
        run.seconds = time.perf_counter() - started


def score_epoch(
    run: Run,
    task: Task,
    config: Any,
    policy: Policy,
    device: torch.device,
    epoch: int,
    report: Report | None,
) -> None:
    """Score the greedy `policy` after `epoch` (trading: up to the config's
    `max_position_absolute` units), keep the score in `run`, and report it."""
    value = task.evaluate(policy, device, max_position=config.max_position_absolute)
    run.history.append(value)
    run.value = value
    if report is not None:
        report(epoch, value)  # may raise optuna.TrialPruned: let it end the run


class RLAdapter(BaseAdapter):
    """What the DQN and PPO adapters share: the task, the score, and `train`.

    A subclass names its `config` dataclass and its `learn` function (as a staticmethod).
    """

    workload_class = "rl"
    direction = "maximize"
    metric = "sharpe"  # held-out annualised Sharpe on trading; mean return on Gymnasium envs
    default_trials = 12
    option_ranges = OPTION_RANGES
    config: type[Config] = Config
    learn: Callable[..., Run]

    def metric_for(self, options: Mapping[str, Any]) -> str:
        return metric_for(options)

    def check_options(self, options: Mapping[str, Any]) -> None:
        load_task(options)  # a bad environment or CSV fails before any training

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        task = load_task(options)  # before anything else: bad options fail fast
        run = self.learn(
            self.config.from_params(params),
            task,
            epochs=epochs,
            steps_per_epoch=int(options["steps_per_epoch"]),
            device=device,
            report=report,
        )
        return run.value
