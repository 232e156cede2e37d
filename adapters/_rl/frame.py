"""What DQN and PPO share: the frame of a training run, its score, and the adapter's `train`.

Each algorithm's file holds the algorithm itself, top to bottom; this module holds what both
need around it: `Config` (a trial's parameters as a dataclass), `training` (the first and last
lines of every `learn`), `score_epoch` (the score after each epoch, reported and logged), `Run`
(what a run did) and `RLAdapter` (the adapter's `train`, with folds, and `final_scores`).

The task a run trains on and how it is scored is `_rl/task`'s; a network's parameters are
`_rl/weights`'s. Both are imported here too, so the algorithms reach everything through this
module (`from adapters._rl import frame as _rl`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

# An import `as` itself is a re-export: dqn, ppo, the tests and the benchmarks reach these
# names through `_rl`.
from adapters import trial_log
from adapters._rl.scoring import EVAL_SEED_OFFSET as EVAL_SEED_OFFSET
from adapters._rl.scoring import mean_eval_return as mean_eval_return
from adapters._rl.task import COMMON_OPTIONS as COMMON_OPTIONS
from adapters._rl.task import (
    OPTION_RANGES,
    Task,
    baselines,
    fold_tasks,
    load_market,
    metric_for,
    test_task,
)
from adapters._rl.task import load_task as load_task
from adapters._rl.task import suggest_trading as suggest_trading
from adapters._rl.weights import Weights as Weights
from adapters.base import BaseAdapter, Checkpoint, Report
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import torch

    from adapters._rl.task import Policy
else:
    np = LazyImport("numpy")
    torch = LazyImport("torch")


def seed_everything(seed: int) -> None:
    """Seed torch (all devices) and numpy's global state: the same seed gives the same run."""
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


@contextmanager
def training(
    task: Task, config: Any, device: torch.device
) -> Iterator[tuple[Any, torch.Generator, Run]]:
    """The first and last lines of every `learn`: seed, make the environments, time the run.

    Yields the environments, a generator seeded with the task's seed (on `device`) and the
    `Run` to fill in; however the run ends (a pruned trial raises out of `report`), the
    environments are closed and the run's time is recorded.
    """
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
        checkpoint: Checkpoint | None = None,
    ) -> float:
        """The validation score; with folds, their mean (reported once per fold, as its step).
        One task goes on from the trial's checkpoint; folds (a step is a fold) train afresh."""
        started = time.perf_counter()
        tasks = fold_tasks(options)  # before anything else: bad options fail fast
        metric = tasks[0].metric
        if len(tasks) == 1:
            run = self._learn(params, tasks[0], epochs, device, options, report, checkpoint)
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
        report: Report | None = None,
        final_state: Mapping[str, Any] | None = None,
    ) -> dict[str, float]:
        """The selected trial's test score: trained again on everything before the test part,
        then scored once on it (a part no trial has seen). `report(epoch, score)` after each
        epoch, as a trial reports: how the run is getting on, not a figure to choose by.

        `final_state`: what the trial saved after its last epoch, when it is kept. On a Gymnasium
        environment the run before the test part is the trial's own (the same environment and
        seed: only the scored episodes differ), so its final weights are scored on the test
        episodes instead of trained again; on a trading market the test run trains on more
        prices than the trial saw (the validation part too), so it trains."""
        task = test_task(options)
        if final_state is not None and self.scores_kept_weights(options):
            finished = _Finished(final_state)  # resumed after its last epoch: scored, not trained
            return {
                "test": self._learn(params, task, epochs, device, options, None, finished).value
            }
        return {"test": self._learn(params, task, epochs, device, options, report).value}

    def scores_kept_weights(self, options: Mapping[str, Any]) -> bool:
        """Whether `final_scores` scores a trial's kept final weights for these options instead
        of training again: on a Gymnasium environment, not on a trading market."""
        return not test_task(options).is_trading

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
        checkpoint: Checkpoint | None = None,
    ) -> Run:
        extra = {} if checkpoint is None else {"checkpoint": checkpoint}
        return self.learn(
            self.config.from_params(params),
            task,
            epochs=epochs,
            steps_per_epoch=int(options["steps_per_epoch"]),
            device=device,
            report=report,
            **extra,
        )


class _Finished:
    """A finished run's saved state as a checkpoint handle that only loads: `learn` goes on from
    it with no epoch left, and scores its weights on the task it is given."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self._state = dict(state)

    def load(self) -> dict[str, Any]:
        return self._state

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        """Never written: the state is the trial's, kept by its study."""

    def due(self, epoch: int) -> bool:
        return False
