"""PPO: clipped surrogate objective, GAE, entropy bonus, minibatches, annealed learning rate.

One file, top to bottom: the hyperparameters, the actor-critic network, `learn` (the training
loop) and the adapter the orchestrator calls. `num_envs` environments step at once as tensors
on the trial's device; nothing loops over environments.

Each update collects a rollout of `num_envs x rollout_steps` transitions, computes advantages
with GAE(gamma, gae_lambda) (bootstrapping from the real final observation where an episode was
truncated, not where it terminated), then runs `update_epochs` passes over the rollout in
shuffled minibatches of exactly `batch_size` transitions, each pass dropping the remainder.
Where one rollout would be smaller than a minibatch, the rollout is made longer
(`rollout_steps` >= batch_size / num_envs): the batch size itself is never changed.
Loss = -clipped surrogate + vf_coef x value loss - entropy_coefficient x entropy; gradients
clipped to `max_grad_norm`; the learning rate falls linearly to 0 over the run.

`learn` returns a `Run` whose `batch_sizes` holds the size of every minibatch the loss saw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from adapters import _rl
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter, Report

if TYPE_CHECKING:
    import optuna
    import torch


@dataclass
class PPOConfig:
    learning_rate: float = 2.5e-3  # Adam step size at the start, annealed to 0
    batch_size: int = 256  # transitions per minibatch (never changed on the way in)
    gamma: float = 0.99  # discount per step
    gae_lambda: float = 0.95  # GAE's bias-variance trade-off
    clip_coef: float = 0.2  # how far the new policy may move from the rollout's
    entropy_coefficient: float = 0.01  # weight of the entropy bonus
    vf_coef: float = 0.5  # weight of the value loss
    max_grad_norm: float = 0.5  # gradient norm clip
    update_epochs: int = 4  # passes over each rollout
    rollout_steps: int = 128  # steps per environment per rollout
    hidden_size: int = 64  # width of the two hidden layers of actor and critic
    # Trading environment only.
    hold_penalty_weight: float = 0.5  # weight of the carrying charge on inventory
    max_position_absolute: int = 3  # position limit, in units
    transaction_cost_multiplier: float = 1.0  # training cost = real cost x this
    # Fixed.
    num_envs: int = 8  # environments stepped together
    anneal_lr: bool = True

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PPOConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known})


@dataclass
class Run:
    """What one training run did: its score, per-epoch scores, and what the loop really used."""

    value: float
    history: list[float] = field(default_factory=list)
    batch_sizes: set[int] = field(default_factory=set)  # sizes of the minibatches the loss saw
    env_steps: int = 0
    gradient_steps: int = 0
    seconds: float = 0.0
    finished_returns: list[float] = field(default_factory=list)  # training episodes


def _agent(obs_dim: int, n_actions: int, hidden: int) -> torch.nn.Module:
    import numpy as np
    from torch import nn

    def layer(n_in: int, n_out: int, std: float = float(np.sqrt(2))) -> nn.Linear:
        linear = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(linear.weight, std)
        nn.init.constant_(linear.bias, 0.0)
        return linear

    class Agent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.critic = nn.Sequential(
                layer(obs_dim, hidden),
                nn.Tanh(),
                layer(hidden, hidden),
                nn.Tanh(),
                layer(hidden, 1, 1.0),
            )
            self.actor = nn.Sequential(
                layer(obs_dim, hidden),
                nn.Tanh(),
                layer(hidden, hidden),
                nn.Tanh(),
                layer(hidden, n_actions, 0.01),
            )

        def value(self, obs: torch.Tensor) -> torch.Tensor:
            return self.critic(obs).squeeze(-1)

        def logits(self, obs: torch.Tensor) -> torch.Tensor:
            return self.actor(obs)

    return Agent()


def learn(
    config: PPOConfig,
    task: _rl.Task,
    *,
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    report: Report | None = None,
) -> Run:
    """Train for `epochs` x `steps_per_epoch` environment steps; score after every epoch."""
    import torch
    from torch.distributions import Categorical

    started = time.perf_counter()
    _rl.seed_everything(task.seed)
    generator = torch.Generator(device=device)
    generator.manual_seed(task.seed)
    env = task.make_env(
        config.num_envs,
        device,
        max_position=config.max_position_absolute,
        cost_multiplier=config.transaction_cost_multiplier,
        hold_penalty_weight=config.hold_penalty_weight,
    )
    agent = _agent(env.obs_dim, env.n_actions, config.hidden_size).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=config.learning_rate, eps=1e-5)

    n_envs = config.num_envs
    steps = max(config.rollout_steps, math.ceil(config.batch_size / n_envs))  # derived
    rollout_size = steps * n_envs
    minibatches = rollout_size // config.batch_size
    total_steps = epochs * steps_per_epoch
    total_rollouts = max(1, math.ceil(total_steps / rollout_size))

    obs_buf = torch.zeros(steps, n_envs, env.obs_dim, device=device)
    action_buf = torch.zeros(steps, n_envs, dtype=torch.long, device=device)
    logprob_buf = torch.zeros(steps, n_envs, device=device)
    reward_buf = torch.zeros(steps, n_envs, device=device)
    value_buf = torch.zeros(steps, n_envs, device=device)
    # Per step: 1 where the episode goes on, and the value to bootstrap from after the step.
    continues_buf = torch.zeros(steps, n_envs, device=device)
    next_value_buf = torch.zeros(steps, n_envs, device=device)
    run = Run(value=float("nan"))

    def greedy(obs: torch.Tensor) -> torch.Tensor:
        return agent.logits(obs).argmax(dim=1)

    obs = env.reset()
    epoch = 0
    for rollout in range(total_rollouts):
        if config.anneal_lr:
            optimizer.param_groups[0]["lr"] = config.learning_rate * (
                1.0 - rollout / total_rollouts
            )

        with torch.no_grad():
            for t in range(steps):
                logits = agent.logits(obs)
                action = Categorical(logits=logits).sample()
                step = env.step(action)
                obs_buf[t], action_buf[t] = obs, action
                logprob_buf[t] = (
                    torch.log_softmax(logits, dim=1).gather(1, action[:, None]).squeeze(1)
                )
                value_buf[t] = agent.value(obs)
                reward_buf[t] = step.reward
                # The value after this step: of the final observation, 0 after a termination.
                next_value_buf[t] = agent.value(step.final_obs) * (~step.terminated)
                continues_buf[t] = (~(step.terminated | step.truncated)).float()
                obs = step.obs
            run.env_steps += rollout_size

            # GAE, backwards in time; an episode's end stops the advantage flowing back.
            advantages = torch.zeros_like(reward_buf)
            last = torch.zeros(n_envs, device=device)
            for t in reversed(range(steps)):
                delta = reward_buf[t] + config.gamma * next_value_buf[t] - value_buf[t]
                last = delta + config.gamma * config.gae_lambda * continues_buf[t] * last
                advantages[t] = last
            returns = advantages + value_buf

        b_obs = obs_buf.reshape(rollout_size, -1)
        b_actions, b_logprobs = action_buf.reshape(-1), logprob_buf.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        for _ in range(config.update_epochs):
            order = torch.randperm(rollout_size, generator=generator, device=device)
            for k in range(minibatches):
                rows = order[k * config.batch_size : (k + 1) * config.batch_size]
                logits = agent.logits(b_obs[rows])
                log_probs = torch.log_softmax(logits, dim=1)
                new_logprob = log_probs.gather(1, b_actions[rows, None]).squeeze(1)
                entropy = -(log_probs.exp() * log_probs).sum(dim=1).mean()
                ratio = (new_logprob - b_logprobs[rows]).exp()
                adv = b_advantages[rows]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(
                    -adv * ratio, -adv * ratio.clamp(1 - config.clip_coef, 1 + config.clip_coef)
                ).mean()
                value_loss = 0.5 * ((agent.value(b_obs[rows]) - b_returns[rows]) ** 2).mean()
                loss = (
                    policy_loss + config.vf_coef * value_loss - config.entropy_coefficient * entropy
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
                optimizer.step()
                run.batch_sizes.add(int(rows.shape[0]))
                run.gradient_steps += 1

        # An epoch ends once the run has taken its share of environment steps.
        while epoch < epochs and (
            run.env_steps >= (epoch + 1) * steps_per_epoch or rollout == total_rollouts - 1
        ):
            with torch.no_grad():
                value = task.evaluate(greedy, device, max_position=config.max_position_absolute)
            run.history.append(value)
            run.value = value
            if report is not None:
                report(epoch, value)  # may raise optuna.TrialPruned: let it end the run
            epoch += 1
    run.finished_returns = list(env.finished_returns)
    if hasattr(env, "close"):
        env.close()
    run.seconds = time.perf_counter() - started
    return run


class PPOAdapter(BaseAdapter):
    name = "ppo"
    workload_class = "rl"
    model_overhead_mb = 200.0  # seed 002: actor, critic, optimizer state, rollout
    per_sample_mb = 0.015  # seed 002: one transition of a minibatch with its activations
    direction = "maximize"
    metric = "sharpe"  # held-out annualised Sharpe on trading; mean return on Gymnasium envs
    description = "PPO with GAE and clipped objective (trading or any Gymnasium env)"
    options = {**_rl.COMMON_OPTIONS, "steps_per_epoch": 25_000}
    default_params = {
        k: v for k, v in asdict(PPOConfig()).items() if k not in ("num_envs", "anneal_lr")
    }
    default_trials = 12

    def metric_for(self, options: Mapping[str, Any]) -> str:
        return _rl.metric_for(options)

    def check_options(self, options: Mapping[str, Any]) -> None:
        _rl.load_task(options)  # a bad environment or CSV fails before any training

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-2, log=True),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
            "gamma": trial.suggest_float("gamma", 0.9, 0.999),
            "gae_lambda": trial.suggest_float("gae_lambda", 0.8, 0.99),
            "clip_coef": trial.suggest_float("clip_coef", 0.1, 0.3),
            "entropy_coefficient": trial.suggest_float("entropy_coefficient", 1e-4, 0.1, log=True),
            "vf_coef": trial.suggest_float("vf_coef", 0.25, 1.0),
            "max_grad_norm": trial.suggest_float("max_grad_norm", 0.3, 2.0, log=True),
            "update_epochs": trial.suggest_int("update_epochs", 2, 10),
            "rollout_steps": trial.suggest_int("rollout_steps", 32, 512, log=True),
            "hidden_size": trial.suggest_categorical("hidden_size", [32, 64, 128, 256]),
        }
        return {**params, **_rl.suggest_trading(trial, options)}

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        task = _rl.load_task(options)  # before anything else: bad options fail fast
        run = learn(
            PPOConfig.from_params(params),
            task,
            epochs=epochs,
            steps_per_epoch=int(options["steps_per_epoch"]),
            device=device,
            report=report,
        )
        return run.value


adapter = PPOAdapter()
