"""PPO: clipped surrogate objective, GAE, entropy bonus, minibatches, annealed learning rate.

One file, top to bottom: the hyperparameters, the actor-critic network, the rollout, the
advantages, the update, `learn` (the training loop) and the adapter the orchestrator calls.
`num_envs` environments step at once as tensors on the trial's device; nothing loops over
environments.

Each update collects a rollout of `num_envs x rollout_steps` transitions, computes advantages
with GAE(gamma, gae_lambda) (bootstrapping from the real final observation where an episode was
truncated, not where it terminated), then runs `update_epochs` passes over the rollout in
shuffled minibatches of exactly `batch_size` transitions, each pass dropping the remainder.
Where one rollout would be smaller than a minibatch, the rollout is made longer
(`rollout_steps` >= batch_size / num_envs): the batch size itself is never changed.
Loss = -clipped surrogate + vf_coef x value loss - entropy_coefficient x entropy; gradients
clipped to `max_grad_norm`; the learning rate falls linearly to 0 over the run.

While the rollout runs only the actor acts, one small batch per step; the critic values the
whole rollout afterwards in one batch (the weights do not change during a rollout, so these
are the same values).

`learn` returns a `Run` whose `batch_sizes` holds the size of every minibatch the loss saw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from adapters._rl import checkpoint as _rl_checkpoint
from adapters._rl import frame as _rl
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, Checkpoint, Member, Report
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import optuna
    import torch
    import torch.nn.functional as F
else:
    torch = LazyImport("torch")
    F = LazyImport("torch.nn.functional")


@dataclass
class PPOConfig(_rl.Config):
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


LAYERS = ("w1", "b1", "w2", "b2", "w3", "b3")


def actor_critic(obs_dim: int, n_actions: int, hidden: int, device: torch.device) -> _rl.Weights:
    """Separate actor and critic MLPs, two tanh layers each, orthogonal initialisation.

    Gains sqrt(2) for the hidden layers, 0.01 for the actor's output (a near-uniform first
    policy) and 1 for the critic's; biases 0 (CleanRL's and stable-baselines3's choice).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name, outputs in (("actor", n_actions), ("critic", 1)):
        shapes |= {
            f"{name}_w1": (hidden, obs_dim),
            f"{name}_b1": (hidden,),
            f"{name}_w2": (hidden, hidden),
            f"{name}_b2": (hidden,),
            f"{name}_w3": (outputs, hidden),
            f"{name}_b3": (outputs,),
        }
    net = _rl.Weights(shapes, device)
    gains = {"actor_w3": 0.01, "critic_w3": 1.0}
    with torch.no_grad():
        for name, view in net.views.items():
            if view.dim() == 2:
                torch.nn.init.orthogonal_(view, gains.get(name, math.sqrt(2)))
    return net


def tower(net: _rl.Weights, name: str, obs: torch.Tensor) -> torch.Tensor:
    """One of the two MLPs (`actor` or `critic`) on a batch of observations."""
    w1, b1, w2, b2, w3, b3 = (net[f"{name}_{layer}"] for layer in LAYERS)
    h = torch.tanh(F.linear(obs, w1, b1))
    return F.linear(torch.tanh(F.linear(h, w2, b2)), w3, b3)


def greedy(net: _rl.Weights, obs: torch.Tensor) -> torch.Tensor:
    """The scored policy: the actor's most likely action."""
    return tower(net, "actor", obs).argmax(dim=1)


@dataclass
class Rollout:
    """`steps x num_envs` transitions, each field stacked over time."""

    obs: torch.Tensor  # [steps, envs, obs_dim]
    final_obs: torch.Tensor  # [steps, envs, obs_dim]: what each step really led to
    action: torch.Tensor  # [steps, envs]
    logits: torch.Tensor  # [steps, envs, n_actions]: the policy that acted
    reward: torch.Tensor  # [steps, envs]
    terminated: torch.Tensor  # [steps, envs]
    done: torch.Tensor  # [steps, envs]: terminated or truncated


def collect(
    net: _rl.Weights, env: Any, obs: torch.Tensor, steps: int, generator: torch.Generator
) -> tuple[Rollout, torch.Tensor]:
    """Act for `steps` steps with the current policy; the rollout and the next observation."""
    fields: list[list[torch.Tensor]] = [[] for _ in range(7)]
    for _ in range(steps):
        with torch.inference_mode():
            logits = tower(net, "actor", obs)
            # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits).
            noise = torch.rand(logits.shape, generator=generator, device=logits.device)
            action = (logits - noise.log_().neg_().log_()).argmax(dim=1)
        step = env.step(action)
        done = step.terminated | step.truncated
        values = (obs, step.final_obs, action, logits, step.reward, step.terminated, done)
        for field, value in zip(fields, values, strict=True):
            field.append(value)
        obs = step.obs
    return Rollout(*(torch.stack(field) for field in fields)), obs


def advantages(
    config: PPOConfig, net: _rl.Weights, rollout: Rollout
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns; an episode's end stops the advantage flowing back."""
    steps, n_envs, obs_dim = rollout.obs.shape
    with torch.no_grad():
        both = torch.cat([rollout.obs, rollout.final_obs]).view(-1, obs_dim)
        values = tower(net, "critic", both).view(2, steps, n_envs)
        # The value after each step: of the final observation, 0 after a termination.
        value, next_value = values[0], values[1] * ~rollout.terminated
        delta = rollout.reward + config.gamma * next_value - value
        carry = (config.gamma * config.gae_lambda) * ~rollout.done
        backwards = [delta[-1]]
        for t in range(steps - 2, -1, -1):
            backwards.append(torch.addcmul(delta[t], carry[t], backwards[-1]))
        advantage = torch.stack(backwards[::-1])
    return advantage, advantage + value


def loss_on(config: PPOConfig, net: _rl.Weights, batch: torch.Tensor, obs_dim: int) -> torch.Tensor:
    """The PPO loss on one minibatch, a row per transition: obs, action, logprob, advantage, return."""
    obs, action = batch[:, :obs_dim], batch[:, obs_dim].long()
    old_logprob, adv, ret = batch[:, obs_dim + 1], batch[:, obs_dim + 2], batch[:, obs_dim + 3]
    log_probs = F.log_softmax(tower(net, "actor", obs), dim=1)
    new_logprob = log_probs.gather(1, action.unsqueeze(1)).squeeze(1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=1).mean()
    ratio = (new_logprob - old_logprob).exp()
    std, mean = torch.std_mean(adv)
    adv = (adv - mean) / (std + 1e-8)
    clipped = ratio.clamp(1 - config.clip_coef, 1 + config.clip_coef)
    policy_loss = -torch.min(adv * ratio, adv * clipped).mean()
    value_loss = 0.5 * (tower(net, "critic", obs).squeeze(1) - ret).square().mean()
    return policy_loss + config.vf_coef * value_loss - config.entropy_coefficient * entropy


def update(
    config: PPOConfig,
    net: _rl.Weights,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    generator: torch.Generator,
    run: _rl.Run,
) -> None:
    """`update_epochs` shuffled passes over the rollout in minibatches of exactly `batch_size`."""
    advantage, returns = advantages(config, net, rollout)
    obs_dim = rollout.obs.shape[-1]
    logprob = rollout.logits.log_softmax(dim=-1).gather(-1, rollout.action.unsqueeze(-1))
    table = torch.column_stack(  # one row per transition, so one gather shuffles them all
        (rollout.obs.reshape(-1, obs_dim), rollout.action.reshape(-1), logprob.reshape(-1))
        + (advantage.reshape(-1), returns.reshape(-1))
    )
    size = config.batch_size
    for _ in range(config.update_epochs):
        order = torch.randperm(len(table), generator=generator, device=table.device)
        shuffled = table.index_select(0, order)
        for start in range(0, len(table) - size + 1, size):
            loss = loss_on(config, net, shuffled[start : start + size], obs_dim)
            net.zero_grad()
            loss.backward()
            net.clip_grad_norm(config.max_grad_norm)
            optimizer.step()
            run.batch_sizes.add(size)
            run.gradient_steps += 1


def learn(
    config: PPOConfig,
    task: _rl.Task,
    *,
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    report: Report | None = None,
    checkpoint: Checkpoint | None = None,
) -> _rl.Run:
    """Train for `epochs` x `steps_per_epoch` environment steps; score after every epoch; go on
    from the latest checkpoint, and save one after each epoch (adapters/_rl/checkpoint.py)."""
    with _rl.training(task, config, device) as (env, generator, run):
        net = actor_critic(env.obs_dim, env.n_actions, config.hidden_size, device)
        optimizer = net.optimizer(config.learning_rate, eps=1e-5)
        policy = functools.partial(greedy, net)  # what each epoch scores
        steps = max(config.rollout_steps, math.ceil(config.batch_size / config.num_envs))
        total_rollouts = max(1, math.ceil(epochs * steps_per_epoch / (steps * config.num_envs)))

        obs = env.reset()
        first, epoch = _rl_checkpoint.resume_ppo(checkpoint, net, optimizer, generator, run)
        _rl_checkpoint.own_learning_rate(optimizer, config.learning_rate)
        if epoch:  # from the steps taken: a copied PBT member's rollout length may differ
            first = run.env_steps // (steps * config.num_envs)
        scored = functools.partial(
            _score_epochs, run, task, config, policy, device, epochs, steps_per_epoch, report
        )

        def saver(index: int) -> Any:  # a checkpoint after an epoch scored after rollout `index`
            return lambda e: _rl_checkpoint.save_ppo(
                checkpoint, e, index, net, optimizer, generator, run
            )

        for rollout_index in range(first, total_rollouts):
            if config.anneal_lr:
                remaining = 1.0 - rollout_index / total_rollouts
                optimizer.param_groups[0]["lr"] = config.learning_rate * remaining
            rollout, obs = collect(net, env, obs, steps, generator)
            run.env_steps += steps * config.num_envs
            update(config, net, optimizer, rollout, generator, run)
            last = rollout_index == total_rollouts - 1
            epoch = scored(epoch, last, saver(rollout_index))
        if first >= total_rollouts:  # resumed after the last rollout: only its scores remain
            if epoch >= epochs:  # a finished run's state (a test run's): its weights scored here
                _rl.score_epoch(run, task, config, policy, device, epochs - 1, None)
            scored(epoch, True, saver(total_rollouts - 1))
    return run


def _score_epochs(
    run: _rl.Run,
    task: _rl.Task,
    config: PPOConfig,
    policy: Any,
    device: torch.device,
    epochs: int,
    steps_per_epoch: int,
    report: Report | None,
    epoch: int,
    last: bool,
    save: Any,
) -> int:
    """Score (and checkpoint) every epoch the run has taken its share of environment steps
    for (all that are left after the last rollout); returns the next epoch."""
    while epoch < epochs and (run.env_steps >= (epoch + 1) * steps_per_epoch or last):
        _rl.score_epoch(run, task, config, policy, device, epoch, report)
        save(epoch)
        epoch += 1
    return epoch


class PPOAdapter(_rl.RLAdapter):
    name = "ppo"
    model_overhead_mb = 200.0  # declared: actor, critic, optimizer state, rollout
    per_sample_mb = 0.015  # declared: one transition of a minibatch with its activations
    description = "PPO with GAE and clipped objective (trading or any Gymnasium env)"
    options = {**_rl.COMMON_OPTIONS, "steps_per_epoch": 25_000}
    default_params = {
        k: v for k, v in asdict(PPOConfig()).items() if k not in ("num_envs", "anneal_lr")
    }
    config = PPOConfig
    learn = staticmethod(learn)

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

    def train_fused(
        self,
        members: Sequence[Member],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
    ) -> list[float | BaseException]:
        """Trials of one `fuse_key` trained as one fused group (adapters/_rl/fused_ppo.py)."""
        from adapters._rl import fused_ppo

        algorithm = fused_ppo.Algorithm(PPOConfig, actor_critic)
        return fused_ppo.train_fused(
            self, algorithm, members, epochs=epochs, device=device, options=options
        )

    def fuse_key(self, params: Mapping[str, Any]) -> Hashable:
        """Which trials may share a fused group: hidden width, minibatch size, rollout length
        and environments. It reads only those parameters (a fused group's other members are
        asked with the ones it reads fixed: orchestrator/run/trial/group.py)."""
        from adapters._rl import fused_ppo

        present, config = set(params), PPOConfig()  # iterating reads no parameter
        hidden, batch, rollout, envs = (
            params[name] if name in present else getattr(config, name)
            for name in ("hidden_size", "batch_size", "rollout_steps", "num_envs")
        )
        return fused_ppo.fuse_key(hidden, batch, rollout, envs)


adapter = PPOAdapter()
