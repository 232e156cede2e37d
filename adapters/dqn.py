"""DQN: double DQN, dueling head, prioritised n-step replay, Huber loss, soft (entropy) targets.

One file, top to bottom: the hyperparameters, the network, the replay buffer, the n-step window,
`learn` (the training loop) and the adapter the orchestrator calls. Many environments step at
once (`num_envs`), all as tensors on the trial's device; nothing loops over environments.

- Double DQN: the online network picks the next action, the target network values it.
- Dueling head: Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
- Prioritised replay (proportional): a transition is drawn with probability p_i^alpha / sum,
  p_i = |TD error| + 1e-6; importance weights (N P(i))^-beta / max, beta annealed linearly from
  `per_beta_start` to 1 over the run. Priorities live in one tensor, summed in blocks, so a
  draw costs a search over the block sums and then within one block, not a pass over the
  whole buffer. `per_alpha = 0` is uniform replay, drawn directly.
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

`learn`'s `Run.batch_sizes` holds every batch size the loss saw: `batch_size` reaches it as is.
"""

from __future__ import annotations

import functools
import math
from collections import deque
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

    from adapters.envs import StepResult

    # An n-step transition: observation, action, n-step return, the observation to bootstrap
    # from, and its discount (one row each per environment).
    Transition = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
else:
    torch = LazyImport("torch")
    F = LazyImport("torch.nn.functional")


@dataclass
class DQNConfig(_rl.Config):
    # The hyperparameters suggest draws, with their defaults.
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


def q_network(obs_dim: int, n_actions: int, hidden: int, device: torch.device) -> _rl.Weights:
    """The dueling Q-network's weights: two hidden ReLU layers, one head for V(s) and A(s, .)."""
    shapes = {
        "w1": (hidden, obs_dim),
        "b1": (hidden,),
        "w2": (hidden, hidden),
        "b2": (hidden,),
        "head_w": (1 + n_actions, hidden),  # row 0: the value, then one row per action
        "head_b": (1 + n_actions,),
    }
    net = _rl.Weights(shapes, device)
    net.init_like_linear()
    return net


def q_values(net: _rl.Weights, obs: torch.Tensor) -> torch.Tensor:
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a), for a batch of observations."""
    h = F.relu(F.linear(obs, net["w1"], net["b1"]))
    h = F.relu(F.linear(h, net["w2"], net["b2"]))
    # Q is a fixed linear map of the head's outputs [V, A_1..A_n]: fold it into the head's
    # weights, one small product instead of slicing, averaging and adding a whole batch.
    fold = dueling_map(net["head_b"].shape[0] - 1, obs.device)
    return F.linear(h, fold.T @ net["head_w"], net["head_b"] @ fold)


@functools.cache
def dueling_map(n_actions: int, device: torch.device) -> torch.Tensor:
    """M such that head @ M = V + A - mean(A): row 0 (the value) all ones, then I - 1/n."""
    with torch.inference_mode(False):  # a plain tensor, whoever asks first, for autograd too
        identity = torch.eye(n_actions, device=device)
        return torch.cat([torch.ones(1, n_actions, device=device), identity - 1 / n_actions])


class PrioritizedReplay:
    """A ring buffer of n-step transitions, all tensors, replayed uniformly or by priority.

    One row of `table` per transition: observation, the observation to bootstrap from, action,
    n-step return, discount; one gather fetches a batch. With `alpha > 0`, `weight` holds
    p_i^alpha and `block_sum` its sums over blocks of `BLOCK` rows: a draw picks a block by the
    block sums, then a row inside it, two small searches whatever the capacity.
    """

    BLOCK = 64

    def __init__(self, capacity: int, obs_dim: int, alpha: float, device: torch.device) -> None:
        self.capacity, self.obs_dim, self.alpha, self.device = capacity, obs_dim, alpha, device
        self.table = torch.zeros(capacity, 2 * obs_dim + 3, device=device)
        self.position = 0
        self.size = 0
        if alpha > 0:
            blocks = math.ceil(capacity / self.BLOCK)
            # float64, so that sums over a million entries keep their digits; padding stays 0.
            self.weight = torch.zeros(blocks * self.BLOCK, dtype=torch.float64, device=device)
            self.block_sum = torch.zeros(blocks, dtype=torch.float64, device=device)
            self.max_weight = torch.ones((), dtype=torch.float64, device=device)

    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        ret: torch.Tensor,
        next_obs: torch.Tensor,
        discount: torch.Tensor,
    ) -> None:
        n = len(obs)
        if self.position + n <= self.capacity:  # the usual case: one slice, no index tensor
            rows: Any = slice(self.position, self.position + n)
        else:
            rows = (self.position + torch.arange(n, device=self.device)) % self.capacity
        self.table[rows] = torch.column_stack((obs, next_obs, action, ret, discount))
        if self.alpha > 0:  # new transitions are drawn at least once: the highest priority
            self.weight[rows] = self.max_weight
            self._resum(rows)
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(obs, next_obs, action, n-step return, discount) of the transitions in `rows`."""
        d = self.obs_dim
        batch = self.table.index_select(0, rows)
        return batch[:, :d], batch[:, d : 2 * d], batch[:, 2 * d].long(), batch[:, -2], batch[:, -1]

    def _resum(self, rows: Any) -> None:
        """Recompute the sums of the blocks that hold `rows` (a slice or an index tensor)."""
        if isinstance(rows, slice):
            blocks: Any = slice(rows.start // self.BLOCK, (rows.stop - 1) // self.BLOCK + 1)
            self.block_sum[blocks] = self.weight.view(-1, self.BLOCK)[blocks].sum(dim=1)
        else:
            blocks = rows // self.BLOCK  # a block named twice gets the same sum twice
            sums = self.weight.view(-1, self.BLOCK).index_select(0, blocks).sum(dim=1)
            self.block_sum[blocks] = sums

    def sample(
        self, batch_size: int, beta: float, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows to replay and their importance weights (None when replay is uniform)."""
        if self.alpha == 0:
            rows = torch.randint(self.size, (batch_size,), generator=generator, device=self.device)
            return rows, None
        block_end = torch.cumsum(self.block_sum, dim=0)
        draws = torch.rand(batch_size, generator=generator, device=self.device, dtype=torch.float64)
        draws = draws * block_end[-1]
        block = torch.searchsorted(block_end, draws).clamp_max(len(self.block_sum) - 1)
        inside = draws - (block_end - self.block_sum).index_select(0, block)  # place in block
        in_block = self.weight.view(-1, self.BLOCK).index_select(0, block)
        offset = torch.searchsorted(in_block.cumsum(dim=1), inside.unsqueeze(1)).squeeze(1)
        rows = (block * self.BLOCK + offset).clamp_max(self.size - 1)
        # (N P(i))^-beta / max_j (N P(j))^-beta = (w_i / min_j w_j)^-beta over the batch.
        weight = self.weight.index_select(0, rows)
        return rows, ((weight / weight.min()) ** (-beta)).float()

    def update(self, rows: torch.Tensor, td_error: torch.Tensor) -> None:
        """New priorities |TD error| + 1e-6 for the rows just replayed (prioritised only)."""
        weight = (td_error.abs().double() + 1e-6) ** self.alpha
        self.weight[rows] = weight
        self.max_weight = torch.maximum(self.max_weight, weight.max())  # no host sync
        self._resum(rows)


class NStepWindow:
    """The last n steps of every environment; once full, each step emits one n-step transition."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.steps: deque = deque(maxlen=n)

    def push(self, obs: torch.Tensor, action: torch.Tensor, step: StepResult) -> Transition | None:
        """(obs, action, n-step return, observation to bootstrap from, its discount) or None."""
        # Per step, once: 1.0 while the episode goes on, and gamma where it did not terminate.
        goes_on = (~(step.terminated | step.truncated)).float()
        self.steps.append((obs, action, step, goes_on, (~step.terminated) * self.gamma))
        if len(self.steps) < self.n:
            return None
        first_obs, first_action, first, alive, discount = self.steps[0]
        ret, next_obs, scale = first.reward, first.final_obs, 1.0
        for _, _, s, s_goes_on, s_discount in list(self.steps)[1:]:  # over time, never envs
            scale *= self.gamma
            # Where the episode is still alive, step k adds its reward and moves the bootstrap on.
            ret = torch.addcmul(ret, alive, s.reward, value=scale)
            keep = alive.bool()
            next_obs = torch.where(keep[:, None], s.final_obs, next_obs)
            discount = torch.where(keep, s_discount * scale, discount)
            alive = alive * s_goes_on
        return first_obs, first_action, ret, next_obs, discount


@dataclass
class Learner:
    """What acting and learning use: the online and target networks, Adam, the replay."""

    q_net: _rl.Weights
    target_net: _rl.Weights
    optimizer: torch.optim.Optimizer
    replay: PrioritizedReplay
    generator: torch.Generator

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return q_values(self.q_net, obs).argmax(dim=1)

    def act(self, obs: torch.Tensor, epsilon: float, n_actions: int) -> torch.Tensor:
        """Epsilon-greedy actions for every environment at once."""
        with torch.inference_mode():
            n, device = len(obs), obs.device
            explore = torch.rand(n, generator=self.generator, device=device) < epsilon
            random = torch.randint(n_actions, (n,), generator=self.generator, device=device)
            return torch.where(explore, random, self.greedy(obs))

    def gradient_step(self, config: DQNConfig, beta: float) -> int:
        """One update of the online network on one replayed batch; returns the batch's size."""
        replay = self.replay
        rows, importance = replay.sample(config.batch_size, beta, self.generator)
        obs, next_obs, action, ret, discount = replay.batch(rows)
        with torch.no_grad():
            next_q = q_values(self.target_net, next_obs)
            online_next_q = q_values(self.q_net, next_obs)
            if config.entropy_coefficient > 0:
                alpha = config.entropy_coefficient
                log_pi = F.log_softmax(online_next_q / alpha, dim=1)
                next_value = (log_pi.exp() * (next_q - alpha * log_pi)).sum(dim=1)
            else:
                best = online_next_q.argmax(dim=1, keepdim=True)
                next_value = next_q.gather(1, best).squeeze(1)
            target = torch.addcmul(ret, discount, next_value)
        predicted = q_values(self.q_net, obs).gather(1, action.unsqueeze(1)).squeeze(1)
        if importance is None:
            loss = F.huber_loss(predicted, target, delta=config.huber_delta)
        else:
            loss = F.huber_loss(predicted, target, reduction="none", delta=config.huber_delta)
            loss = (importance * loss).mean()
        self.q_net.zero_grad()
        loss.backward()
        self.q_net.clip_grad_norm(config.max_grad_norm)
        self.optimizer.step()
        if importance is not None:
            replay.update(rows, (target - predicted).detach())
        return len(rows)


def learn(
    config: DQNConfig,
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
        vector_steps = math.ceil(steps_per_epoch / config.num_envs)
        total_steps = epochs * vector_steps * config.num_envs
        q_net = q_network(env.obs_dim, env.n_actions, config.hidden_size, device)
        # Never more transitions than the run makes: no memory reserved for nothing.
        capacity = max(1, min(config.buffer_size, total_steps))
        replay = PrioritizedReplay(capacity, env.obs_dim, config.per_alpha, device)
        optimizer = q_net.optimizer(config.learning_rate)
        learner = Learner(q_net, q_net.frozen_copy(), optimizer, replay, generator)
        window = NStepWindow(config.n_step, config.gamma)
        updates_per_step = config.replay_ratio * config.num_envs / config.batch_size
        # Learning starts within the first quarter of the first epoch at the latest, so a short
        # `steps_per_epoch` never scores the untrained network.
        learning_starts = min(config.learning_starts, steps_per_epoch // 4)
        explore_steps = config.exploration_fraction * total_steps

        obs = env.reset()
        start, update_credit = _rl_checkpoint.resume_dqn(checkpoint, learner, run)
        _rl_checkpoint.own_learning_rate(optimizer, config.learning_rate)
        for epoch in range(start, epochs):
            for _ in range(vector_steps):
                epsilon = _rl.linear_schedule(1.0, config.epsilon_end, explore_steps, run.env_steps)
                action = learner.act(obs, epsilon, env.n_actions)
                step = env.step(action)
                transition = window.push(obs, action, step)
                if transition is not None:
                    replay.add(*transition)
                obs = step.obs
                run.env_steps += config.num_envs
                if run.env_steps < learning_starts or replay.size < config.batch_size:
                    continue
                update_credit += updates_per_step
                beta = _rl.linear_schedule(config.per_beta_start, 1.0, total_steps, run.env_steps)
                while update_credit >= 1.0:
                    update_credit -= 1.0
                    run.batch_sizes.add(learner.gradient_step(config, beta))
                    run.gradient_steps += 1
                    if run.gradient_steps % config.target_update_period == 0:
                        learner.target_net.flat.copy_(q_net.flat)
            _rl.score_epoch(run, task, config, learner.greedy, device, epoch, report)
            _rl_checkpoint.save_dqn(checkpoint, epoch, learner, run, update_credit)
        if start >= epochs:  # a finished run's state (a test run's): its weights scored here
            _rl.score_epoch(run, task, config, learner.greedy, device, epochs - 1, None)
    return run


class DQNAdapter(_rl.RLAdapter):
    name = "dqn"
    model_overhead_mb = 300.0  # declared: network, target copy, optimizer state, replay
    per_sample_mb = 0.0002  # declared: one transition of the batch
    description = "double dueling DQN with prioritised n-step replay (trading or any Gymnasium env)"
    options = {**_rl.COMMON_OPTIONS, "steps_per_epoch": 12_000}
    default_params = {
        k: v
        for k, v in asdict(DQNConfig()).items()
        if k not in ("epsilon_end", "num_envs", "learning_starts", "replay_ratio", "max_grad_norm")
    }
    config = DQNConfig
    learn = staticmethod(learn)

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

    def train_fused(
        self,
        members: Sequence[Member],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
    ) -> list[float | BaseException]:
        """Trials of one `fuse_key` trained as one fused group (adapters/_rl/fused_dqn.py)."""
        from adapters._rl import fused_dqn

        algorithm = fused_dqn.Algorithm(DQNConfig, q_network, PrioritizedReplay)
        return fused_dqn.train_fused(
            self, algorithm, members, epochs=epochs, device=device, options=options
        )

    def fuse_key(self, params: Mapping[str, Any]) -> Hashable:
        """Which trials may share a fused group: hidden width and batch band. It reads only
        those two parameters (a fused group's other members are asked with the ones it reads
        fixed: orchestrator/run/trial/group.py)."""
        from adapters._rl import fused_dqn

        present = set(params)  # iterating reads no parameter
        config = DQNConfig()
        hidden = params["hidden_size"] if "hidden_size" in present else config.hidden_size
        batch = params["batch_size"] if "batch_size" in present else config.batch_size
        return fused_dqn.fuse_key(hidden, batch)


adapter = DQNAdapter()
