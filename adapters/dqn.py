"""DQN: double DQN, dueling head, prioritised n-step replay, Huber loss, soft (entropy) targets.

One file, top to bottom: the hyperparameters, the network, the replay buffer, the n-step window,
`learn` (the training loop) and the adapter the orchestrator calls. Many environments step at
once (`num_envs`), all as tensors on the trial's device; nothing loops over environments.

- Double DQN: the online network picks the next action, the target network values it.
- Dueling head: Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
- Prioritised replay (proportional): a transition is drawn with probability p_i^alpha / sum,
  p_i = |TD error| + 1e-6; importance weights (N P(i))^-beta / max, beta annealed linearly from
  `per_beta_start` to 1 over the run. Sampling is a cumulative sum and a binary search over the
  priorities tensor: one tensor operation instead of a Python sum-tree.
- n-step returns: G = r_0 + gamma r_1 + ... + gamma^(n-1) r_(n-1) + gamma^n V(s_n), cut at the
  end of an episode (no bootstrap after a termination; bootstrap from the real final
  observation after a truncation).
- `entropy_coefficient` (alpha) is the temperature of a soft Bellman backup:
  V(s') = sum_a pi(a|s') (Q_target(s', a) - alpha log pi(a|s')), pi = softmax(Q_online(s') / alpha).
  It values states by how many good actions they keep open, which damps the over-estimation of
  a single lucky action; alpha = 0 is exactly double DQN. Acting stays epsilon-greedy and the
  scored policy is greedy.
- Gradient steps: `replay_ratio` replayed samples per environment step, so a trial with a large
  batch makes fewer, larger updates for the same compute (the batch size is never changed).

`learn` returns a `Run` whose `batch_sizes` holds the size of every batch the loss was computed
on: the orchestrator's `batch_size` reaches this loop as it is.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from adapters import _rl
from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter, Report

if TYPE_CHECKING:
    import optuna
    import torch

    from adapters.envs import StepResult


@dataclass
class DQNConfig:
    # Seed 002's search space.
    learning_rate: float = 1e-3  # Adam step size
    batch_size: int = 128  # transitions per gradient step (never changed on the way in)
    gamma: float = 0.97  # discount per step
    buffer_size: int = 100_000  # replay capacity in transitions
    hold_penalty_weight: float = 0.5  # trading: weight of the carrying charge on inventory
    max_position_absolute: int = 3  # trading: position limit, in units
    huber_delta: float = 10.0  # TD error where the loss turns from quadratic to linear
    entropy_coefficient: float = 0.0  # temperature of the soft backup; 0 = double DQN
    transaction_cost_multiplier: float = 1.0  # trading: training cost = real cost x this
    per_alpha: float = 0.6  # how strongly priorities shape sampling (0 = uniform)
    per_beta_start: float = 0.4  # importance-weight exponent at the start, annealed to 1
    # Extensions, also searched.
    n_step: int = 3  # steps summed before bootstrapping
    target_update_period: int = 250  # gradient steps between copies to the target network
    exploration_fraction: float = 0.25  # share of the run over which epsilon falls to its end
    hidden_size: int = 128  # width of the two hidden layers
    # Fixed.
    epsilon_end: float = 0.05
    num_envs: int = 8  # environments stepped together
    learning_starts: int = 1_000  # environment steps before the first gradient step (at most)
    replay_ratio: float = 16.0  # replayed samples per environment step
    max_grad_norm: float = 10.0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DQNConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known})


@dataclass
class Run:
    """What one training run did: its score, per-epoch scores, and what the loop really used."""

    value: float
    history: list[float] = field(default_factory=list)
    batch_sizes: set[int] = field(default_factory=set)  # sizes of the batches the loss saw
    env_steps: int = 0
    gradient_steps: int = 0
    seconds: float = 0.0
    finished_returns: list[float] = field(default_factory=list)  # training episodes


def _network(obs_dim: int, n_actions: int, hidden: int) -> torch.nn.Module:
    from torch import nn

    class DuelingQNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
            )
            self.value = nn.Linear(hidden, 1)
            self.advantage = nn.Linear(hidden, n_actions)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            h = self.body(obs)
            advantage = self.advantage(h)
            return self.value(h) + advantage - advantage.mean(dim=1, keepdim=True)

    return DuelingQNetwork()


class PrioritizedReplay:
    """A ring buffer of n-step transitions with proportional priorities, all tensors."""

    def __init__(self, capacity: int, obs_dim: int, alpha: float, device: torch.device) -> None:
        import torch

        self.capacity, self.alpha, self.device = capacity, alpha, device
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)
        self.action = torch.zeros(capacity, dtype=torch.long, device=device)
        self.ret = torch.zeros(capacity, device=device)
        self.discount = torch.zeros(capacity, device=device)
        # p_i ** alpha, in float64 so the cumulative sum stays exact over a million entries.
        self.weight = torch.zeros(capacity, dtype=torch.float64, device=device)
        self.max_priority = 1.0
        self.position = 0
        self.size = 0

    def add(self, obs, action, ret, next_obs, discount) -> None:  # noqa: ANN001 - tensors
        import torch

        rows = (self.position + torch.arange(len(obs), device=self.device)) % self.capacity
        self.obs[rows], self.action[rows], self.ret[rows] = obs, action, ret
        self.next_obs[rows], self.discount[rows] = next_obs, discount
        self.weight[rows] = self.max_priority**self.alpha  # new transitions are seen at least once
        self.position = (self.position + len(obs)) % self.capacity
        self.size = min(self.size + len(obs), self.capacity)

    def sample(self, batch_size: int, beta: float, generator: torch.Generator):  # noqa: ANN201
        import torch

        cdf = torch.cumsum(self.weight[: self.size], dim=0)
        total = cdf[-1]
        draws = torch.rand(batch_size, generator=generator, device=self.device, dtype=torch.float64)
        rows = torch.searchsorted(cdf, draws * total).clamp_max(self.size - 1)
        probability = self.weight[rows] / total
        importance = (self.size * probability) ** (-beta)
        importance = (importance / importance.max()).float()
        return rows, importance

    def update(self, rows: torch.Tensor, td_error: torch.Tensor) -> None:
        priority = td_error.detach().abs().double() + 1e-6
        self.weight[rows] = priority**self.alpha
        self.max_priority = max(self.max_priority, float(priority.max()))


class NStepWindow:
    """The last n steps of every environment; once full, each step emits one n-step transition."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.steps: deque = deque(maxlen=n)

    def push(self, obs: torch.Tensor, action: torch.Tensor, step: StepResult):  # noqa: ANN201
        import torch

        self.steps.append((obs, action, step))
        if len(self.steps) < self.n:
            return None
        first_obs, first_action, last = self.steps[0][0], self.steps[0][1], self.steps[-1][2]
        ret = torch.zeros_like(last.reward)
        alive = torch.ones_like(last.terminated)
        next_obs = last.final_obs.clone()
        discount = torch.full_like(last.reward, self.gamma**self.n)
        scale = 1.0
        for _, _, s in self.steps:  # n is small: this loops over time, never over environments
            ret += alive * scale * s.reward
            scale *= self.gamma
            ended = alive & (s.terminated | s.truncated)
            next_obs[ended] = s.final_obs[ended]
            discount[ended] = torch.where(s.terminated[ended], 0.0, scale)
            alive &= ~(s.terminated | s.truncated)
        return first_obs, first_action, ret, next_obs, discount


def learn(
    config: DQNConfig,
    task: _rl.Task,
    *,
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    report: Report | None = None,
) -> Run:
    """Train for `epochs` x `steps_per_epoch` environment steps; score after every epoch."""
    import torch
    import torch.nn.functional as F

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
    q_network = _network(env.obs_dim, env.n_actions, config.hidden_size).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=config.learning_rate, fused=True)
    vector_steps = math.ceil(steps_per_epoch / config.num_envs)
    total_steps = epochs * vector_steps * config.num_envs
    # Never more transitions than the run makes: no memory reserved for nothing.
    capacity = max(1, min(config.buffer_size, total_steps))
    replay = PrioritizedReplay(capacity, env.obs_dim, config.per_alpha, device)
    window = NStepWindow(config.n_step, config.gamma)
    updates_per_step = config.replay_ratio * config.num_envs / config.batch_size
    # Learning starts within the first quarter of the first epoch at the latest, so a short
    # `steps_per_epoch` never scores the untrained network.
    learning_starts = min(config.learning_starts, steps_per_epoch // 4)
    run = Run(value=float("nan"))

    def greedy(obs: torch.Tensor) -> torch.Tensor:
        return q_network(obs).argmax(dim=1)

    obs = env.reset()
    update_credit = 0.0
    for epoch in range(epochs):
        for _ in range(vector_steps):
            epsilon = _rl.linear_schedule(
                1.0, config.epsilon_end, config.exploration_fraction * total_steps, run.env_steps
            )
            with torch.no_grad():
                action = greedy(obs)
            explore = torch.rand(config.num_envs, generator=generator, device=device) < epsilon
            random_action = torch.randint(
                env.n_actions, (config.num_envs,), generator=generator, device=device
            )
            action = torch.where(explore, random_action, action)
            step = env.step(action)
            transition = window.push(obs, action, step)
            if transition is not None:
                replay.add(*transition)
            obs = step.obs
            run.env_steps += config.num_envs

            if run.env_steps < learning_starts or replay.size < config.batch_size:
                continue
            update_credit += updates_per_step
            while update_credit >= 1.0:
                update_credit -= 1.0
                beta = _rl.linear_schedule(config.per_beta_start, 1.0, total_steps, run.env_steps)
                rows, importance = replay.sample(config.batch_size, beta, generator)
                with torch.no_grad():
                    next_obs = replay.next_obs[rows]
                    next_q = target_network(next_obs)
                    online_next_q = q_network(next_obs)
                    if config.entropy_coefficient > 0:
                        alpha = config.entropy_coefficient
                        log_pi = F.log_softmax(online_next_q / alpha, dim=1)
                        next_value = (log_pi.exp() * (next_q - alpha * log_pi)).sum(dim=1)
                    else:
                        best = online_next_q.argmax(dim=1, keepdim=True)
                        next_value = next_q.gather(1, best).squeeze(1)
                    target = replay.ret[rows] + replay.discount[rows] * next_value
                predicted = (
                    q_network(replay.obs[rows]).gather(1, replay.action[rows, None]).squeeze(1)
                )
                td_error = target - predicted
                loss = F.huber_loss(predicted, target, reduction="none", delta=config.huber_delta)
                loss = (importance * loss).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(q_network.parameters(), config.max_grad_norm)
                optimizer.step()
                replay.update(rows, td_error)
                run.batch_sizes.add(int(rows.shape[0]))
                run.gradient_steps += 1
                if run.gradient_steps % config.target_update_period == 0:
                    target_network.load_state_dict(q_network.state_dict())

        value = task.evaluate(greedy, device, max_position=config.max_position_absolute)
        run.history.append(value)
        run.value = value
        if report is not None:
            report(epoch, value)  # may raise optuna.TrialPruned: let it end the run
    run.finished_returns = list(env.finished_returns)
    if hasattr(env, "close"):
        env.close()
    run.seconds = time.perf_counter() - started
    return run


class DQNAdapter(BaseAdapter):
    name = "dqn"
    workload_class = "rl"
    model_overhead_mb = 300.0  # seed 002: network, target copy, optimizer state, replay
    per_sample_mb = 0.0002  # seed 002: one transition of the batch
    direction = "maximize"
    metric = "sharpe"  # held-out annualised Sharpe on trading; mean return on Gymnasium envs
    description = "double dueling DQN with prioritised n-step replay (trading or any Gymnasium env)"
    options = {**_rl.COMMON_OPTIONS, "steps_per_epoch": 12_000}
    default_params = {
        k: v
        for k, v in asdict(DQNConfig()).items()
        if k not in ("epsilon_end", "num_envs", "learning_starts", "replay_ratio", "max_grad_norm")
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
            "buffer_size": trial.suggest_int("buffer_size", 10_000, 1_000_000, log=True),
            "huber_delta": trial.suggest_float("huber_delta", 1.0, 100.0, log=True),
            "entropy_coefficient": trial.suggest_float("entropy_coefficient", 0.0, 0.1),
            "per_alpha": trial.suggest_float("per_alpha", 0.0, 1.0),
            "per_beta_start": trial.suggest_float("per_beta_start", 0.2, 0.8),
            "n_step": trial.suggest_int("n_step", 1, 5),
            "target_update_period": trial.suggest_int("target_update_period", 50, 2_000, log=True),
            "exploration_fraction": trial.suggest_float("exploration_fraction", 0.05, 0.5),
            "hidden_size": trial.suggest_categorical("hidden_size", [64, 128, 256]),
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
            DQNConfig.from_params(params),
            task,
            epochs=epochs,
            steps_per_epoch=int(options["steps_per_epoch"]),
            device=device,
            report=report,
        )
        return run.value


adapter = DQNAdapter()
