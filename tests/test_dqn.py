"""DQN: it learns (CartPole, a trending market), it is reproducible, its batch size is never clamped."""

from __future__ import annotations

import optuna
import pytest
import torch

from adapters import _rl, dqn
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN
from orchestrator.errors import UserError
from orchestrator.planner import HardwareBudget

torch.set_num_threads(1)
CPU = torch.device("cpu")


def _random_score(
    task: _rl.Task, n_actions: int, *, max_position: int = 1, tries: int = 5
) -> float:
    generator = torch.Generator().manual_seed(123)

    def random_policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(n_actions, (obs.shape[0],), generator=generator)

    scores = [task.evaluate(random_policy, CPU, max_position=max_position) for _ in range(tries)]
    return sum(scores) / len(scores)


@pytest.mark.slow
def test_defaults_learn_cartpole_within_15000_steps():
    task = _rl.load_task({"env": "CartPole-v1"})
    run = dqn.learn(dqn.DQNConfig(), task, epochs=3, steps_per_epoch=5_000, device=CPU)
    random = _random_score(task, 2)
    assert random < 40  # a random policy keeps the pole up for about 20 steps
    assert run.value > 150 and run.value > 4 * random, (run.history, random)


@pytest.mark.slow
def test_defaults_learn_a_trending_market():
    task = _rl.load_task({"env": "trading", "regime": "trend"})
    config = dqn.DQNConfig()
    run = dqn.learn(config, task, epochs=2, steps_per_epoch=6_000, device=CPU)
    random = _random_score(task, 3, max_position=config.max_position_absolute)
    assert run.value > 2.0 and run.value > random + 1.5, (run.history, random)


def test_same_seed_same_run_and_report_once_per_epoch():
    task = _rl.load_task({"env": "trading", "seed": 5})
    config = dqn.DQNConfig(learning_starts=200)
    reports: list[tuple[int, float]] = []
    runs = [
        dqn.learn(
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
    other = dqn.learn(
        config,
        _rl.load_task({"env": "trading", "seed": 6}),
        epochs=2,
        steps_per_epoch=400,
        device=CPU,
    )
    assert other.history != runs[0].history


def test_a_short_epoch_still_trains_before_it_is_scored():
    # 400 steps per epoch is below the default learning_starts (1,000): the first score must
    # still come from a trained network, not from the random initial one.
    task = _rl.load_task({"env": "trading", "seed": 5})
    config = dqn.DQNConfig()
    assert config.learning_starts > 400
    run = dqn.learn(config, task, epochs=1, steps_per_epoch=400, device=CPU)
    assert run.gradient_steps > 0  # one epoch: every gradient step came before its score


def test_pruning_from_report_ends_the_run():
    task = _rl.load_task({"env": "trading"})

    def prune(epoch: int, value: float) -> None:
        raise optuna.TrialPruned(f"pruned at epoch {epoch}")

    with pytest.raises(optuna.TrialPruned):
        dqn.learn(dqn.DQNConfig(), task, epochs=3, steps_per_epoch=200, device=CPU, report=prune)


def test_batch_size_2048_reaches_the_loss_unclamped(monkeypatch):
    adapter = dqn.adapter
    plan = HardwareBudget(gpu_memory_mb=24_576).plan_hyperopt(
        adapter.model_overhead_mb, adapter.per_sample_mb, BATCH_SIZE_MIN, BATCH_SIZE_MAX, 20
    )
    assert plan.batch_size_bounds[1] >= 2048  # the plan allows it

    runs: list[dqn.Run] = []
    real_learn = dqn.learn

    def spy(*args, **kwargs):
        runs.append(real_learn(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(dqn, "learn", spy)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({**adapter.default_params, "batch_size": 2048, "buffer_size": 10_000})
    options = {**adapter.options, "steps_per_epoch": 3_200}
    study.optimize(lambda trial: adapter.objective(trial, CPU, 1, options), n_trials=1)
    assert study.trials[0].params["batch_size"] == 2048
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert runs[0].gradient_steps > 0 and runs[0].batch_sizes == {2048}


def test_search_space_declares_seed_002_parameters():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    params = dqn.adapter.suggest(trial, dqn.adapter.options)
    for name in (
        "learning_rate",
        "batch_size",
        "gamma",
        "buffer_size",
        "hold_penalty_weight",
        "max_position_absolute",
        "huber_delta",
        "entropy_coefficient",
        "transaction_cost_multiplier",
        "per_alpha",
        "per_beta_start",
    ):
        assert name in params
    dist = trial.distributions["batch_size"]
    assert (dist.low, dist.high, dist.log) == (BATCH_SIZE_MIN, BATCH_SIZE_MAX, True)
    # On a Gymnasium env the trading-only parameters are not searched.
    gym_params = dqn.adapter.suggest(study.ask(), {**dqn.adapter.options, "env": "CartPole-v1"})
    assert "max_position_absolute" not in gym_params
    assert dqn.adapter.metric_for(dqn.adapter.options) == "sharpe"
    assert dqn.adapter.metric_for({"env": "CartPole-v1"}) == "return"


def test_malformed_csv_fails_before_training(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("date,price\n2020-01-01,100\n")
    options = {**dqn.adapter.options, "data": str(path)}
    with pytest.raises(UserError, match="has no `close` column") as caught:
        dqn.adapter.check_options(options)
    assert str(path) in str(caught.value)
    reports = []
    with pytest.raises(UserError, match=str(path)):
        dqn.adapter.train(
            dqn.adapter.default_params,
            epochs=1,
            device=CPU,
            options=options,
            report=lambda e, v: reports.append(e),
        )
    assert reports == []
