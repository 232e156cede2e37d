"""DQN: it learns (CartPole, a trending market), it is reproducible, its batch size is never clamped."""

from __future__ import annotations

import pytest
import torch

from adapters import dqn
from adapters._rl import frame as _rl
from tests import _rl_helpers as rl

torch.set_num_threads(1)


@pytest.mark.slow
def test_defaults_learn_cartpole_within_15000_steps():
    rl.check_learns_cartpole(dqn, epochs=3, steps_per_epoch=5_000)


@pytest.mark.slow
def test_defaults_learn_a_trending_market():
    rl.check_learns_a_trending_market(dqn, epochs=2, steps_per_epoch=6_000)


@pytest.mark.parametrize("per_alpha", [0.6, 0.0], ids=["prioritised", "uniform"])
def test_same_seed_same_run_and_report_once_per_epoch(per_alpha):
    rl.check_same_seed_same_run(dqn, dqn.DQNConfig(learning_starts=200, per_alpha=per_alpha))


def test_a_short_epoch_still_trains_before_it_is_scored():
    # 400 steps per epoch is below the default learning_starts (1,000): the first score must
    # still come from a trained network, not from the random initial one.
    task = _rl.load_task({"env": "trading", "seed": 5})
    config = dqn.DQNConfig()
    assert config.learning_starts > 400
    run = dqn.learn(config, task, epochs=1, steps_per_epoch=400, device=rl.CPU)
    assert run.gradient_steps > 0  # one epoch: every gradient step came before its score


def test_pruning_from_report_ends_the_run():
    rl.check_pruning_ends_the_run(dqn)


def test_batch_size_2048_reaches_the_loss_unclamped(monkeypatch):
    params = {"batch_size": 2048, "buffer_size": 10_000}
    options = {**dqn.adapter.options, "steps_per_epoch": 3_200}
    _, run = rl.run_one_trial(dqn.adapter, params, options, monkeypatch)
    assert run.gradient_steps > 0 and run.batch_sizes == {2048}


def test_search_space_declares_seed_002_parameters():
    rl.check_search_space(
        dqn.adapter,
        (
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
        ),
    )


def test_malformed_csv_fails_before_training(tmp_path):
    rl.check_malformed_csv_fails_before_training(dqn.adapter, tmp_path)


def _filled_replay(alpha: float, capacity: int = 1_000) -> dqn.PrioritizedReplay:
    replay = dqn.PrioritizedReplay(capacity, 2, alpha, rl.CPU)
    for start in range(0, capacity, 8):  # each transition's return is its own row number
        rows = torch.arange(start, start + 8, dtype=torch.float32)
        replay.add(
            rows[:, None].expand(8, 2),
            torch.zeros(8, dtype=torch.long),
            rows,
            rows[:, None].expand(8, 2),
            torch.ones(8),
        )
    return replay


def test_prioritised_replay_draws_in_proportion_to_priority():
    # Rows 0-99 get priority 9, the other 900 rows 1 (less 1e-6): with alpha = 1 half the draws
    # must come from the first 100 rows; uniform replay would give a tenth.
    replay = _filled_replay(alpha=1.0)
    errors = torch.where(torch.arange(1_000) < 100, 9.0, 1.0) - 1e-6
    replay.update(torch.arange(1_000), errors)
    generator = torch.Generator().manual_seed(0)
    rows, importance = replay.sample(20_000, beta=1.0, generator=generator)
    share = float((rows < 100).float().mean())
    assert 0.48 < share < 0.52, share
    # The rare rows weigh most: importance is (w_i / min w)^-beta, 1 for the smallest priority.
    assert float(importance[rows >= 100].min()) == pytest.approx(1.0)
    assert float(importance[rows < 100].max()) == pytest.approx(1 / 9, rel=1e-4)
    # Each row carries its own transition: the batch's returns are the rows drawn.
    _, _, _, ret, discount = replay.batch(rows[:5])
    assert ret.tolist() == rows[:5].float().tolist() and discount.tolist() == [1.0] * 5


def test_priorities_stay_right_as_the_ring_wraps():
    replay = _filled_replay(alpha=0.5, capacity=100)  # a hundred rows, written ten times over
    assert replay.size == 100
    block_sums = replay.weight.view(-1, replay.BLOCK).sum(dim=1)
    assert torch.allclose(replay.block_sum, block_sums)
    replay.update(torch.tensor([3, 3, 70]), torch.tensor([4.0, 4.0, 0.0]))
    assert torch.allclose(replay.block_sum, replay.weight.view(-1, replay.BLOCK).sum(dim=1))
    rows, _ = replay.sample(5_000, beta=0.5, generator=torch.Generator().manual_seed(1))
    assert int(rows.max()) < 100 and float((rows == 3).float().mean()) > 0.01


def test_uniform_replay_draws_every_row_alike():
    replay = _filled_replay(alpha=0.0)
    rows, importance = replay.sample(50_000, beta=0.4, generator=torch.Generator().manual_seed(0))
    assert importance is None
    counts = torch.bincount(rows, minlength=1_000).float()
    assert int(rows.max()) < 1_000 and float(counts.min()) > 20 and float(counts.max()) < 90


def test_n_step_window_sums_rewards_and_cuts_at_episode_ends():
    from adapters.envs import StepResult

    # Three environments, gamma 0.5: env 0 runs on, env 1 terminates at its second step, env 2
    # is truncated at its first. Step k's final observation is 10 k + env, to see which is kept.
    window = dqn.NStepWindow(3, 0.5)
    terminated = [[False, False, False], [False, True, False], [False, False, False]]
    truncated = [[False, False, True], [False, False, False], [False, False, False]]
    for k in range(3):
        final_obs = torch.tensor([[10.0 * k + e] for e in range(3)])
        step = StepResult(
            obs=final_obs,
            reward=torch.tensor([1.0, 1.0, 1.0]) * 2**k,
            terminated=torch.tensor(terminated[k]),
            truncated=torch.tensor(truncated[k]),
            final_obs=final_obs,
        )
        transition = window.push(torch.full((3, 1), -float(k)), torch.tensor([k] * 3), step)
        assert (transition is None) == (k < 2)
    obs, action, ret, next_obs, discount = transition
    assert obs.flatten().tolist() == [0.0] * 3 and action.tolist() == [0, 0, 0]
    assert ret.tolist() == [1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2, 1]
    assert next_obs.flatten().tolist() == [20.0, 11.0, 2.0]
    # Bootstrap gamma^3 after three steps, never after a termination, gamma^1 after a truncation.
    assert discount.tolist() == [0.125, 0.0, 0.5]
