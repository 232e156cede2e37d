"""PPO: it learns (CartPole, a trending market), it is reproducible, its batch size is never clamped."""

from __future__ import annotations

import math

import pytest
import torch

from adapters import ppo
from adapters._rl import frame as _rl
from tests import _rl_helpers as rl

torch.set_num_threads(1)


@pytest.mark.slow
def test_defaults_learn_cartpole_within_12000_steps():
    rl.check_learns_cartpole(ppo, epochs=3, steps_per_epoch=4_000)


@pytest.mark.slow
def test_defaults_learn_a_trending_market():
    rl.check_learns_a_trending_market(ppo, epochs=2, steps_per_epoch=15_000)


def test_same_seed_same_run_and_report_once_per_epoch():
    rl.check_same_seed_same_run(ppo, ppo.PPOConfig(rollout_steps=32))


def test_pruning_from_report_ends_the_run():
    rl.check_pruning_ends_the_run(ppo)


def test_batch_size_2048_reaches_the_loss_unclamped(monkeypatch):
    params = {"batch_size": 2048, "update_epochs": 2}
    options = {**ppo.adapter.options, "steps_per_epoch": 2_048}
    _, run = rl.run_one_trial(ppo.adapter, params, options, monkeypatch)
    # The rollout grew to hold one whole minibatch (8 envs x 256 steps); the minibatch did not shrink.
    assert run.gradient_steps == 2 and run.batch_sizes == {2048}


def test_search_space():
    rl.check_search_space(
        ppo.adapter,
        (
            "learning_rate",
            "batch_size",
            "gamma",
            "gae_lambda",
            "clip_coef",
            "entropy_coefficient",
            "vf_coef",
            "max_grad_norm",
            "update_epochs",
            "hold_penalty_weight",
            "max_position_absolute",
            "transaction_cost_multiplier",
        ),
    )


def test_malformed_csv_fails_before_training(tmp_path):
    rl.check_malformed_csv_fails_before_training(ppo.adapter, tmp_path)


def test_advantages_follow_gae_and_stop_at_episode_ends():
    # A critic that values every state at 2 (zero weights, output bias 2), gamma 0.5, lambda 0.5.
    net = ppo.actor_critic(1, 2, 4, rl.CPU)
    with torch.no_grad():
        net.flat.zero_()
        net["critic_b3"].fill_(2.0)
    config = ppo.PPOConfig(gamma=0.5, gae_lambda=0.5)
    # One environment, three steps: rewards 1, 1, 1; the second step terminates.
    terminated = torch.tensor([[False], [True], [False]])
    rollout = ppo.Rollout(
        obs=torch.zeros(3, 1, 1),
        final_obs=torch.zeros(3, 1, 1),
        action=torch.zeros(3, 1, dtype=torch.long),
        logits=torch.zeros(3, 1, 2),
        reward=torch.ones(3, 1),
        terminated=terminated,
        done=terminated,
    )
    advantage, returns = ppo.advantages(config, net, rollout)
    delta = [
        1 + 0.5 * 2 - 2,
        1 + 0 - 2,
        1 + 0.5 * 2 - 2,
    ]  # r + gamma V(s') - V(s); V = 0 after the end
    expected = [delta[0] + 0.25 * delta[1], delta[1], delta[2]]
    assert advantage.flatten().tolist() == pytest.approx(expected)
    assert returns.flatten().tolist() == pytest.approx([a + 2 for a in expected])


def test_weights_train_exactly_as_torch_layers_with_torch_clipping_and_adam():
    # Weights keeps every parameter in one flat tensor; one step of it must equal torch.nn.Linear
    # layers stepped by clip_grad_norm_ and Adam, or the flat bookkeeping changed the algorithm.
    torch.manual_seed(0)
    weights = _rl.Weights({"w1": (8, 3), "b1": (8,), "w2": (2, 8), "b2": (2,)}, rl.CPU)
    weights.init_like_linear()
    layers = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for view, parameter in zip(weights.views.values(), layers.parameters(), strict=True):
            parameter.copy_(view)
            assert float(view.abs().max()) <= 1 / math.sqrt(
                view.shape[-1] if view.dim() == 2 else 3
            )
    optimizers = [
        weights.optimizer(1e-2, eps=1e-5),
        torch.optim.Adam(layers.parameters(), 1e-2, eps=1e-5),
    ]
    for _ in range(20):
        x, y = torch.randn(16, 3), torch.randn(16, 2)
        w = weights.views
        out = torch.nn.functional.linear(
            torch.tanh(torch.nn.functional.linear(x, w["w1"], w["b1"])), w["w2"], w["b2"]
        )
        weights.zero_grad()
        ((out - y) ** 2).mean().backward()
        weights.clip_grad_norm(0.1)
        optimizers[0].step()
        optimizers[1].zero_grad()
        ((layers(x) - y) ** 2).mean().backward()
        torch.nn.utils.clip_grad_norm_(layers.parameters(), 0.1)
        optimizers[1].step()
    for view, parameter in zip(weights.views.values(), layers.parameters(), strict=True):
        assert torch.allclose(view, parameter, atol=1e-6)
    assert float(weights.grad.abs().sum()) > 0  # the gradients really landed in the flat tensor


def test_rollout_actions_are_drawn_from_the_policy():
    # An actor whose logits are log(0.2, 0.3, 0.5) whatever it sees: the rollout's actions must
    # come out in those shares (Gumbel-max sampling), and its stored logits must be the policy's.
    task = _rl.load_task({"env": "trading", "seed": 0})
    env = task.make_env(8, rl.CPU)
    net = ppo.actor_critic(env.obs_dim, env.n_actions, 16, rl.CPU)
    with torch.no_grad():
        net["actor_w3"].zero_()
        net["actor_b3"].copy_(torch.tensor([0.2, 0.3, 0.5]).log())
    generator = torch.Generator().manual_seed(0)
    rollout, _ = ppo.collect(net, env, env.reset(), 2_000, generator)
    shares = torch.bincount(rollout.action.flatten(), minlength=3) / rollout.action.numel()
    assert shares.tolist() == pytest.approx([0.2, 0.3, 0.5], abs=0.01)
    assert torch.allclose(rollout.logits.softmax(-1), torch.tensor([0.2, 0.3, 0.5]))
    assert rollout.obs.shape == (2_000, 8, env.obs_dim) and rollout.done.dtype == torch.bool
