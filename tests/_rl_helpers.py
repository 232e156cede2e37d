"""What the DQN and PPO tests check in the same way: baselines, reproducibility, pruning, the
batch size through a real study, the search space, and bad options."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import optuna
import pytest
import torch

from adapters._rl import frame as _rl
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN
from orchestrator.errors import UserError
from orchestrator.planning.hardware_budget import HardwareBudget

CPU = torch.device("cpu")


def random_score(task: _rl.Task, n_actions: int, *, max_position: int = 1, tries: int = 5) -> float:
    """The baseline a learning check beats: a uniformly random policy's mean score."""
    generator = torch.Generator().manual_seed(123)

    def random_policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(n_actions, (obs.shape[0],), generator=generator)

    scores = [task.evaluate(random_policy, CPU, max_position=max_position) for _ in range(tries)]
    return sum(scores) / len(scores)


def check_learns_cartpole(algorithm: ModuleType, *, epochs: int, steps_per_epoch: int) -> None:
    task = _rl.load_task({"env": "CartPole-v1"})
    run = algorithm.learn(
        algorithm.adapter.config(), task, epochs=epochs, steps_per_epoch=steps_per_epoch, device=CPU
    )
    random = random_score(task, 2)
    assert random < 40  # a random policy keeps the pole up for about 20 steps
    assert run.value > 150 and run.value > 4 * random, (run.history, random)
    assert run.env_steps <= epochs * steps_per_epoch + 1024  # the bound on steps holds


def check_learns_a_trending_market(
    algorithm: ModuleType, *, epochs: int, steps_per_epoch: int
) -> None:
    task = _rl.load_task({"env": "trading", "regime": "trend"})
    config = algorithm.adapter.config()
    run = algorithm.learn(config, task, epochs=epochs, steps_per_epoch=steps_per_epoch, device=CPU)
    random = random_score(task, 3, max_position=config.max_position_absolute)
    assert run.value > 2.0 and run.value > random + 1.5, (run.history, random)


def check_same_seed_same_run(algorithm: ModuleType, config: Any) -> None:
    """Two runs from one seed score alike epoch by epoch, report once per epoch; another differs."""
    task = _rl.load_task({"env": "trading", "seed": 5})
    reports: list[tuple[int, float]] = []
    runs = [
        algorithm.learn(
            config,
            task,
            epochs=2,
            steps_per_epoch=400,
            device=CPU,
            report=lambda e, v: reports.append((e, v)),
        )
        for _ in range(2)
    ]
    assert runs[0].gradient_steps > 0
    assert runs[0].history == runs[1].history
    assert [e for e, _ in reports] == [0, 1, 0, 1]
    other_task = _rl.load_task({"env": "trading", "seed": 6})
    other = algorithm.learn(config, other_task, epochs=2, steps_per_epoch=400, device=CPU)
    assert other.history != runs[0].history


def check_pruning_ends_the_run(algorithm: ModuleType) -> None:
    task = _rl.load_task({"env": "trading"})

    def prune(epoch: int, value: float) -> None:
        raise optuna.TrialPruned(f"pruned at epoch {epoch}")

    with pytest.raises(optuna.TrialPruned):
        algorithm.learn(
            algorithm.adapter.config(),
            task,
            epochs=3,
            steps_per_epoch=200,
            device=CPU,
            report=prune,
        )


def run_one_trial(
    adapter: Any, params: dict[str, Any], options: dict[str, Any], monkeypatch: Any
) -> tuple[optuna.Study, _rl.Run]:
    """One trial through `adapter.objective` in a real study, with the `Run` that `learn` returned."""
    plan = HardwareBudget(gpu_memory_mb=24_576).plan_hyperopt(
        adapter.model_overhead_mb, adapter.per_sample_mb, BATCH_SIZE_MIN, BATCH_SIZE_MAX, 20
    )
    assert plan.batch_size_bounds[1] >= params["batch_size"]  # the plan allows it
    runs: list[_rl.Run] = []
    real_learn = adapter.learn

    def spy(*args: Any, **kwargs: Any) -> _rl.Run:
        runs.append(real_learn(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(adapter, "learn", spy)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({**adapter.default_params, **params})
    study.optimize(lambda trial: adapter.objective(trial, CPU, 1, options), n_trials=1)
    assert study.trials[0].params["batch_size"] == params["batch_size"]
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    return study, runs[0]


def check_search_space(adapter: Any, names: tuple[str, ...]) -> None:
    """The named parameters are searched; batch size over the study-wide range; metrics by env."""
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    params = adapter.suggest(trial, adapter.options)
    assert set(names) <= set(params)
    dist = trial.distributions["batch_size"]
    assert (dist.low, dist.high, dist.log) == (BATCH_SIZE_MIN, BATCH_SIZE_MAX, True)
    # On a Gymnasium env the trading-only parameters are not searched.
    gym_params = adapter.suggest(study.ask(), {**adapter.options, "env": "CartPole-v1"})
    assert "max_position_absolute" not in gym_params
    assert adapter.metric_for(adapter.options) == "sharpe"
    assert adapter.metric_for({"env": "CartPole-v1"}) == "return"


def check_malformed_csv_fails_before_training(adapter: Any, tmp_path: Any) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("date,price\n2020-01-01,100\n")
    options = {**adapter.options, "data": str(path)}
    with pytest.raises(UserError, match="has no `close` column") as caught:
        adapter.check_options(options)
    assert str(path) in str(caught.value)
    reports: list[int] = []
    with pytest.raises(UserError, match=str(path)):
        adapter.train(
            adapter.default_params,
            epochs=1,
            device=CPU,
            options=options,
            report=lambda e, v: reports.append(e),
        )
    assert reports == []
