"""What DQN and PPO share: options, the task, scoring, the weights and the frame of a run.

Each algorithm's file holds the algorithm itself, top to bottom; this module holds what both
need around it: the options and the task (which environment, which prices), the score of a
trial, `Weights` (a small network's parameters in one flat tensor), `training` (the first and
last lines of every `learn`) and `RLAdapter` (the adapter's `train`).

The score of a trial is what `_scoring` says, on the validation part of the prices
(`envs.periods`: train, validation, test in time order; `--option folds=K` for walk-forward
folds, the value then being the mean over folds) or on the validation episodes of a Gymnasium
environment. The test part is scored only by `final_scores`, for the trial a study selected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._scoring import (
    EVAL_SEED_OFFSET,
    TEST_SEED_OFFSET,
    WINDOW,
    gym_baselines,
    mean_eval_return,
    period_sharpe,
    trading_baselines,
)
from adapters.base import SEED_MAX, BaseAdapter, InputFile, Range, Report
from adapters.envs.periods import MAX_FOLDS, Period, Periods, trading_periods
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
        from adapters.envs import GymVecEnv, TradingEnv

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
        """The run's score for a greedy `policy` (see `_scoring`)."""
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
        import numpy as np

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
    from adapters.envs import REGIME_CHOICES, check_gym_id, load_prices, synthetic_prices

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
    """What a tuned agent's validation and test scores stand beside (see `_scoring`)."""
    market = load_market(options)
    if market is None:
        return gym_baselines(str(options["env"]), int(options.get("seed", 0)))
    scale = market.task(0, market.periods.before_test, market.periods.test).return_scale
    periods = {"validation": market.validation, "test": market.periods.test}
    return trading_baselines(market.prices, periods, return_scale=scale)


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
    started: float = field(default_factory=time.perf_counter)  # when `training` began


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
    run = Run(started=started)
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
    `max_position_absolute` units), keep the score in `run`, and report it.

    A reported score is also a line of the trial's log; a run that reports nothing (a fold, the
    final test run) writes nothing: its caller says what it means."""
    value = task.evaluate(policy, device, max_position=config.max_position_absolute)
    run.history.append(value)
    run.value = value
    if report is not None:
        seconds = time.perf_counter() - run.started
        trial_log.write(trial_log.evaluation_line(epoch, task.metric, value, seconds, _done(run)))
        report(epoch, value)  # may raise optuna.TrialPruned: let it end the run


def _done(run: Run) -> str:
    return f"{run.env_steps:,} env steps, {run.gradient_steps:,} gradient steps"


def _log_value(metric: str, value: float, started: float, how: str) -> None:
    trial_log.write(trial_log.value_line(metric, value, time.perf_counter() - started, how))


class RLAdapter(BaseAdapter):
    """What the DQN and PPO adapters share: the task, the score, and `train`.

    A subclass names its `config` dataclass and its `learn` function (as a staticmethod).
    """

    workload_class = "rl"
    direction = "maximize"
    metric = "sharpe"  # validation Sharpe on trading; mean validation return on Gymnasium envs
    default_trials = 12
    option_ranges = OPTION_RANGES
    config: type[Config] = Config
    learn: Callable[..., Run]

    def metric_for(self, options: Mapping[str, Any]) -> str:
        return metric_for(options)

    def check_options(self, options: Mapping[str, Any]) -> None:
        load_market(options)  # a bad environment, CSV or fold count fails before any training

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        """The validation score; with folds, their mean (reported once per fold, as its step)."""
        started = time.perf_counter()
        tasks = fold_tasks(options)  # before anything else: bad options fail fast
        metric = tasks[0].metric
        if len(tasks) == 1:
            run = self._learn(params, tasks[0], epochs, device, options, report)
            _log_value(metric, run.value, started, "the last epoch's score")
            return run.value
        scores: list[float] = []
        for fold, task in enumerate(tasks):
            run = self._learn(params, task, epochs, device, options, None)
            scores.append(run.value)
            mean = sum(scores) / len(scores)
            seconds = time.perf_counter() - started
            done = f"fold {fold + 1} of {len(tasks)} scored {run.value:.6g}"
            trial_log.write(trial_log.evaluation_line(fold, f"mean {metric}", mean, seconds, done))
            report(fold, mean)  # may prune after any fold
        _log_value(metric, sum(scores) / len(scores), started, f"the mean of {len(tasks)} folds")
        return sum(scores) / len(scores)

    def final_scores(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
    ) -> dict[str, float]:
        """The selected trial's test score: trained again on everything before the test part,
        then scored once on it (a part no trial has seen)."""
        task = test_task(options)
        return {"test": self._learn(params, task, epochs, device, options, None).value}

    def baselines(self, options: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        return baselines(options)

    def _learn(
        self,
        params: Mapping[str, Any],
        task: Task,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report | None,
    ) -> Run:
        return self.learn(
            self.config.from_params(params),
            task,
            epochs=epochs,
            steps_per_epoch=int(options["steps_per_epoch"]),
            device=device,
            report=report,
        )
