"""DQN trials trained as one fused group: the DQN adapter's `train_fused` and `fuse_key`.

docs/fused.md has the design; `adapters/_rl/fused` the maths of one fused gradient step. Here is
the training loop around it, `adapters.dqn.learn`'s loop for N members at once:

- the members' networks, targets and Adam states are stacked rows (`fused.FusedAdam`); every
  per-member hyperparameter is a value per row, and a member's Adam step is the very kernel its
  trial runs alone (`FusedAdam.step_rows`);
- one act over all members (one batched forward; each member draws its exploration with its own
  generator, so its draws do not depend on the group);
- one vector environment of N x `num_envs` Gymnasium copies, each member's seeded as its own
  trial seeds them (trading: the members' own environments, stepped one after another);
- one n-step window over all members, each with its own n and gamma (`GroupWindow`);
- each member's own replay (`adapters.dqn.PrioritizedReplay`) and generator; a gradient step
  samples each member's batch into one padded buffer and takes one fused step;
- the replay ratio's cadence per member: a vector step owes each member its own gradient steps,
  and a fused step computes only the members that owe one (the others are not in it);
- the target refresh per member, after its own `target_update_period` steps;
- per epoch, each member is scored (Gymnasium: all members' evaluation episodes in one vector
  env), reports through its own `report`, and saves through its own `checkpoint` handle in the
  format `adapters/_rl/checkpoint.py` writes for one trial, so a member goes on alone with
  `train`, and a group member goes on from a trial's checkpoint.

A member whose `report` raises (optuna.TrialPruned, a checkpoint's TrainedUntil) or whose
checkpoint fails leaves the group at that epoch: its rows are cut out of every stacked tensor and
the others go on; what it raised is its entry. An error of the group's own step ends every member
still in it. A group of one is `train` itself.

Resumed members may stand at different epochs: each trains its own next epoch every round, and
leaves the group when it has trained its last.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters import dqn, trial_log
from adapters._rl import checkpoint as _rl_checkpoint
from adapters._rl import frame as _rl
from adapters._rl import fused
from adapters._rl.scoring import mean_eval_returns
from adapters.base import BATCH_SIZE_MIN, Checkpoint, Member, Report
from adapters.envs import GymVecEnv
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.envs import StepResult
else:
    torch = LazyImport("torch")

BANDS = 6  # batch bands over the study's 64..4096: [64, 128), [128, 256), ..., [2048, 4096]


def batch_band(batch_size: int) -> int:
    """The band of a batch size: 0 for 64..127, 1 for 128..255, ..., 5 for 2048..4096. Within a
    band the largest batch is less than twice the smallest: a fused step pads at most 2x, and
    the members' replay-ratio cadences stay within 2x of each other (docs/fused.md)."""
    return min(max((int(batch_size) // BATCH_SIZE_MIN).bit_length() - 1, 0), BANDS - 1)


def fuse_key(params: Mapping[str, Any]) -> Hashable:
    """Which DQN trials may train as one group: equal hidden width, batch band and number of
    environments (fixed unless a trial's parameters set it)."""
    config = dqn.DQNConfig.from_params(params)
    return (config.hidden_size, batch_band(config.batch_size), config.num_envs)


def train_fused(
    adapter: Any,
    members: Sequence[Member],
    *,
    epochs: int,
    device: torch.device,
    options: Mapping[str, Any],
) -> list[float | BaseException]:
    """One entry per member, in order: its value, or what ended it (docs/fused.md)."""
    if len(members) == 1:  # a group of one is exactly a trial
        member = members[0]
        try:
            return [
                adapter.train(
                    member.params,
                    epochs=epochs,
                    device=device,
                    options=options,
                    report=member.report,
                    checkpoint=member.checkpoint,
                )
            ]
        except Exception as error:
            return [error]
    keys = {fuse_key(member.params) for member in members}
    if len(keys) > 1:
        raise ValueError(f"members of one fused DQN group need one fuse_key, not {sorted(keys)}")
    started = time.perf_counter()
    try:
        tasks = _rl.fold_tasks(options)  # bad options fail the group before any training
        configs = [dqn.DQNConfig.from_params(member.params) for member in members]
        steps_per_epoch = int(options["steps_per_epoch"])
    except Exception as error:  # every member's, as `train` raises it for a trial
        return [error] * len(members)
    metric = tasks[0].metric
    if len(tasks) == 1:
        outcomes = learn_group(
            configs,
            tasks[0],
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            device=device,
            reports=[member.report for member in members],
            checkpoints=[member.checkpoint for member in members],
        )
        entries: list[float | BaseException] = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                entries.append(outcome)
                continue
            _log(
                index,
                trial_log.value_line(
                    metric, outcome.value, _since(started), "the last epoch's score"
                ),
            )
            entries.append(outcome.value)
        return entries
    return _train_folds(members, configs, tasks, epochs, steps_per_epoch, device, started)


def _train_folds(
    members: Sequence[Member],
    configs: list[dqn.DQNConfig],
    tasks: list[_rl.Task],
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    started: float,
) -> list[float | BaseException]:
    """Walk-forward folds, as `RLAdapter.train` runs them: each fold trains afresh (the group
    together), and each member reports its running mean after every fold (a step is a fold)."""
    metric = tasks[0].metric
    entries: list[float | BaseException | None] = [None] * len(members)
    scores: list[list[float]] = [[] for _ in members]
    for fold, task in enumerate(tasks):
        going = [i for i, entry in enumerate(entries) if entry is None]
        if not going:
            break
        outcomes = learn_group(
            [configs[i] for i in going],
            task,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            device=device,
            reports=[None] * len(going),
            checkpoints=[None] * len(going),
        )
        for i, outcome in zip(going, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                entries[i] = outcome
                continue
            scores[i].append(outcome.value)
            mean = sum(scores[i]) / len(scores[i])
            done = f"fold {fold + 1} of {len(tasks)} scored {outcome.value:.6g}"
            _log(i, trial_log.evaluation_line(fold, f"mean {metric}", mean, _since(started), done))
            try:
                members[i].report(fold, mean)
            except Exception as error:  # pruned after this fold: it leaves the group
                entries[i] = error
    for i, entry in enumerate(entries):
        if entry is None:
            mean = sum(scores[i]) / len(scores[i])
            how = f"the mean of {len(tasks)} folds"
            _log(i, trial_log.value_line(metric, mean, _since(started), how))
            entries[i] = mean
    return [entry for entry in entries if entry is not None]


def _since(started: float) -> float:
    return time.perf_counter() - started


def _log(index: int, line: str) -> None:
    """A member's line of the trial log: the group's members share the process's output, so
    each line names the member (its place in the group) it belongs to."""
    trial_log.write(f"member {index}: {line}")


# --- the group's state -----------------------------------------------------------------------


@dataclass
class GroupMember:
    """What one member keeps of its own: its trial's handles, replay, generator and counts."""

    index: int  # its place in the caller's list
    config: dqn.DQNConfig
    report: Report | None
    checkpoint: Checkpoint | None
    replay: dqn.PrioritizedReplay
    generator: torch.Generator
    run: _rl.Run
    total_steps: int
    learning_starts: int
    epoch: int = 0  # the next epoch it trains
    credit: float = 0.0  # gradient steps owed (the replay ratio's cadence)
    outcome: BaseException | None = None

    @property
    def updates_per_step(self) -> float:
        c = self.config
        return c.replay_ratio * c.num_envs / c.batch_size


@dataclass
class Stack:
    """The members' online and target networks as `[N, P]` rows, their Adam, their
    hyperparameters as tensors of N; `keep` cuts the rows of members that leave."""

    online: torch.Tensor  # [N, P], a leaf
    target: torch.Tensor  # [N, P]
    adam: fused.FusedAdam
    shapes: dict[str, tuple[int, ...]]
    lr: list[float]
    hyper: fused.DQNHyper
    _parts: dict[tuple[int, ...], tuple[torch.Tensor, fused.DQNHyper]] = field(default_factory=dict)

    def keep(self, rows: list[int]) -> Stack:
        index = torch.tensor(rows, dtype=torch.long, device=self.online.device)
        online = self.online.detach().index_select(0, index).requires_grad_()
        hyper = self.hyper
        return Stack(
            online,
            self.target.index_select(0, index),
            self.adam.keep(rows, online),
            self.shapes,
            [self.lr[row] for row in rows],
            fused.DQNHyper(*(t.index_select(0, index) for t in _fields(hyper))),
        )

    def part(self, rows: tuple[int, ...]) -> tuple[torch.Tensor, fused.DQNHyper]:
        """The index and hyperparameters of a subset of rows (kept: a cadence repeats)."""
        if rows not in self._parts:
            index = torch.tensor(rows, dtype=torch.long, device=self.online.device)
            picked = (t.index_select(0, index) for t in _fields(self.hyper))
            self._parts[rows] = (index, fused.DQNHyper(*picked))
        return self._parts[rows]


def _fields(hyper: fused.DQNHyper) -> tuple[torch.Tensor, ...]:
    return (hyper.huber_delta, hyper.entropy_coefficient, hyper.max_grad_norm)


class GroupWindow:
    """`adapters.dqn.NStepWindow` for N members at once, each with its own n and gamma: the
    tensors are `[N, envs]`. A member's transition starts `n` steps back, so the window walks
    the steps of the longest member's n and counts a step only for the members whose window it
    is in; a member whose window is not yet full emits nothing."""

    def __init__(self, n: Sequence[int], gamma: Sequence[float], device: torch.device) -> None:
        self.n, self.gamma = list(n), list(gamma)
        self.device = device
        self.steps: deque = deque(maxlen=max(self.n))
        # float32 gamma as the single window's tensors hold it ((~terminated) * gamma).
        self._gamma = torch.tensor(self.gamma, device=device).unsqueeze(1)
        self._plans: dict[int, list[tuple[Any, ...]]] = {}

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.n, self.gamma = [self.n[r] for r in rows], [self.gamma[r] for r in rows]
        self._gamma = self._gamma.index_select(0, index)
        self.steps = deque(
            (tuple(t.index_select(0, index) for t in step) for step in self.steps),
            maxlen=max(self.n),
        )
        self._plans.clear()

    def _plan(self, length: int) -> list[tuple[Any, ...]]:
        """Per step k of a window of `length` steps: (k, which members' transitions start at k,
        which members count k, each member's gamma^(steps since its start)), from the first k
        any member counts. Scales are built as the single window builds them (repeated
        products of gamma in double precision, then float32), so each member's sums match."""
        if length in self._plans:
            return self._plans[length]
        starts = [length - n if length >= n else length for n in self.n]  # length: emits not
        plan = []
        for k in range(min(starts), length):
            first = [start == k for start in starts]
            within = [start <= k for start in starts]
            scales = []
            for start, gamma in zip(starts, self.gamma, strict=True):
                scale = 1.0
                for _ in range(max(0, k - start)):
                    scale *= gamma
                scales.append(scale)
            as_column = torch.tensor(scales, device=self.device).unsqueeze(1)
            counted = torch.tensor(within, device=self.device).unsqueeze(1)
            plan.append(
                (
                    k,
                    torch.tensor(first, device=self.device).unsqueeze(1) if any(first) else None,
                    counted if not all(within) else None,
                    as_column * counted,  # 0 where a member does not count the step
                    as_column,
                )
            )
        self._plans[length] = plan
        return plan

    def push(
        self, obs: torch.Tensor, action: torch.Tensor, step: StepResult
    ) -> tuple[list[bool], torch.Tensor] | None:
        """Which members emit a transition now, and all members' rows `[N, envs, width]`
        (observation, the observation to bootstrap from, action, n-step return, discount: the
        replay's columns), or None while no member's window is full."""
        goes_on = (~(step.terminated | step.truncated)).float()
        self.steps.append(
            (obs, action, step.reward, step.final_obs, goes_on, (~step.terminated) * self._gamma)
        )
        length = len(self.steps)
        emits = [length >= n for n in self.n]
        if not any(emits):
            return None
        first_obs = torch.zeros_like(obs)
        first_action = torch.zeros_like(action)
        ret = torch.zeros_like(step.reward)
        next_obs = torch.zeros_like(step.final_obs)
        discount = torch.zeros_like(step.reward)
        alive = torch.ones_like(step.reward)
        for k, first, counted, weight, scale in self._plan(length):
            s_obs, s_action, s_reward, s_final, s_goes_on, s_discount = self.steps[k]
            if first is not None:
                first_obs = torch.where(first.unsqueeze(2), s_obs, first_obs)
                first_action = torch.where(first, s_action, first_action)
            # Where a member counts step k and its episode is still alive, the step adds its
            # reward and moves the bootstrap on (NStepWindow's update, with 0 elsewhere).
            factor = alive * weight
            ret = torch.addcmul(ret, factor, s_reward)
            keep = factor > 0
            next_obs = torch.where(keep.unsqueeze(2), s_final, next_obs)
            discount = torch.where(keep, s_discount * scale, discount)
            alive = (
                alive * s_goes_on
                if counted is None
                else torch.where(counted, alive * s_goes_on, alive)
            )
        rows = torch.cat(
            (
                first_obs,
                next_obs,
                first_action.unsqueeze(2),
                ret.unsqueeze(2),
                discount.unsqueeze(2),
            ),
            dim=2,
        )
        return emits, rows


def put(replay: dqn.PrioritizedReplay, rows: torch.Tensor) -> None:
    """`PrioritizedReplay.add` of rows already in the replay's columns (`GroupWindow.push`)."""
    n = len(rows)
    if replay.position + n <= replay.capacity:
        where: Any = slice(replay.position, replay.position + n)
    else:
        where = (replay.position + torch.arange(n, device=replay.device)) % replay.capacity
    replay.table[where] = rows
    if replay.alpha > 0:  # new transitions are drawn at least once: the highest priority
        replay.weight[where] = replay.max_weight
        replay._resum(where)
    replay.position = (replay.position + n) % replay.capacity
    replay.size = min(replay.size + n, replay.capacity)


class StackedEnvs:
    """The members' own environments behind one step (trading: each member's environment has
    its own position limit, costs and penalty): `[N x envs]` actions in, rows out."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = envs
        self.obs_dim, self.n_actions = envs[0].obs_dim, envs[0].n_actions

    def reset(self) -> torch.Tensor:
        return torch.cat([env.reset() for env in self.envs])

    def step(self, actions: torch.Tensor) -> StepResult:
        parts = actions.chunk(len(self.envs))
        steps = [env.step(part) for env, part in zip(self.envs, parts, strict=True)]
        return type(steps[0])(*(torch.cat(field) for field in zip(*steps, strict=True)))

    def keep(self, members: list[int]) -> None:
        self.envs = [self.envs[i] for i in members]

    def close(self) -> None:
        for env in self.envs:
            env.close()


class GymGroupEnv(GymVecEnv):
    """One Gymnasium vector env of N x envs copies: member i's copies seeded seed, seed + 1, ...
    as its own trial's are, so each member plays the episodes it would play alone."""

    def __init__(self, env_id: str, members: int, envs: int, device: torch.device, seed: int):
        seeds = [seed + copy for copy in range(envs)] * members
        super().__init__(env_id, num_envs=members * envs, device=device, seed=seeds)
        self.envs_per_member = envs

    def keep_members(self, members: list[int]) -> None:
        e = self.envs_per_member
        self.keep([m * e + copy for m in members for copy in range(e)])


# --- the loop ----------------------------------------------------------------------------------


def learn_group(
    configs: Sequence[dqn.DQNConfig],
    task: _rl.Task,
    *,
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    reports: Sequence[Report | None],
    checkpoints: Sequence[Checkpoint | None],
) -> list[_rl.Run | BaseException]:
    """`adapters.dqn.learn` for N members of one shape at once: each member's `Run`, or what
    ended it (see the module's docstring)."""
    return GroupRun(configs, task, epochs, steps_per_epoch, device, reports, checkpoints).go()


class GroupRun:
    """One fused group's run, from its members' configs to their outcomes."""

    def __init__(
        self,
        configs: Sequence[dqn.DQNConfig],
        task: _rl.Task,
        epochs: int,
        steps_per_epoch: int,
        device: torch.device,
        reports: Sequence[Report | None],
        checkpoints: Sequence[Checkpoint | None],
    ) -> None:
        self.task, self.epochs, self.device = task, epochs, device
        self.started = time.perf_counter()
        self.num_envs = configs[0].num_envs
        self.vector_steps = math.ceil(steps_per_epoch / self.num_envs)
        self.steps_per_epoch = steps_per_epoch
        self.configs, self.reports, self.checkpoints = list(configs), reports, checkpoints
        self.outcomes: list[_rl.Run | BaseException | None] = [None] * len(configs)
        self._batch_buffers: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, ...]] = {}

    # -- setting up ----------------------------------------------------------------------------

    def _make_env(self) -> Any:
        task, n, envs = self.task, len(self.configs), self.num_envs
        if not task.is_trading:
            return GymGroupEnv(task.env_id, n, envs, self.device, task.seed)
        return StackedEnvs(
            [
                task.make_env(
                    envs,
                    self.device,
                    max_position=c.max_position_absolute,
                    cost_multiplier=c.transaction_cost_multiplier,
                    hold_penalty_weight=c.hold_penalty_weight,
                )
                for c in self.configs
            ]
        )

    def _members(self, env: Any) -> tuple[list[GroupMember], Stack]:
        """Each member as its trial starts alone (the same seed: the same first weights and
        draws), then what its own checkpoint holds, if anything."""
        task, device = self.task, self.device
        total_steps = self.epochs * self.vector_steps * self.num_envs
        members, nets = [], []
        for index, config in enumerate(self.configs):
            torch.manual_seed(task.seed)  # the weights a trial alone draws first
            nets.append(dqn.q_network(env.obs_dim, env.n_actions, config.hidden_size, device))
            generator = torch.Generator(device=device)
            generator.manual_seed(task.seed)
            capacity = max(1, min(config.buffer_size, total_steps))
            replay = dqn.PrioritizedReplay(capacity, env.obs_dim, config.per_alpha, device)
            learning_starts = min(config.learning_starts, self.steps_per_epoch // 4)
            run = _rl.Run(started=self.started)
            members.append(
                GroupMember(
                    index,
                    config,
                    self.reports[index],
                    self.checkpoints[index],
                    replay,
                    generator,
                    run,
                    total_steps,
                    learning_starts,
                )
            )
        online = fused.stack([net.flat for net in nets])
        stack = Stack(
            online,
            online.detach().clone(),
            fused.FusedAdam(online),
            dict(nets[0].shapes),
            [float(c.learning_rate) for c in self.configs],
            fused.DQNHyper.of(self.configs, device),
        )
        for row, member in enumerate(members):
            try:
                self._resume(member, stack, row)
            except Exception as error:  # an unreadable state of its own: it alone ends
                member.outcome = error
        return members, stack

    def _resume(self, member: GroupMember, stack: Stack, row: int) -> None:
        """`_rl_checkpoint.resume_dqn` into the member's rows (its generator, not the process's
        global ones, which the loop does not draw from)."""
        state = None if member.checkpoint is None else member.checkpoint.load()
        if state is None:
            return
        with torch.no_grad():
            stack.online[row] = state["q_net"].to(self.device)
            stack.target[row] = state["target_net"].to(self.device)
        saved = state["optimizer"]["state"]
        if saved:
            stack.adam.load_member(row, {k: v.to(self.device) for k, v in saved[0].items()})
        _rl_checkpoint.restore_replay(member.replay, state["replay"])
        member.generator.set_state(state["randomness"]["generator"])
        _rl_checkpoint.restore_counts(state["counts"], member.run)
        member.epoch, member.credit = int(state["epoch"]) + 1, float(state["update_credit"])

    # -- running -------------------------------------------------------------------------------

    def go(self) -> list[_rl.Run | BaseException]:
        _rl.seed_everything(self.task.seed)
        members: list[GroupMember] = []
        env = None
        try:
            env = self._make_env()
            members, stack = self._members(env)
            window = GroupWindow(
                [m.config.n_step for m in members], [m.config.gamma for m in members], self.device
            )
            obs = env.reset()
            members, stack, obs = self._leave(members, stack, window, env, obs)
            while members:
                obs = self._epoch(members, stack, window, env, obs)
                self._end_epoch(members, stack)
                members, stack, obs = self._leave(members, stack, window, env, obs)
        except Exception as error:  # the group's own step failed: it ends every member in it
            for member in members:
                if member.outcome is not None:  # ended at this epoch already, by its own
                    self._settle(member)
            for index, outcome in enumerate(self.outcomes):
                if outcome is None:
                    self.outcomes[index] = error
        finally:
            if env is not None:
                env.close()
        return [outcome if outcome is not None else _rl.Run() for outcome in self.outcomes]

    def _settle(self, member: GroupMember) -> None:
        member.run.seconds = time.perf_counter() - self.started
        self.outcomes[member.index] = member.outcome if member.outcome is not None else member.run

    def _leave(
        self,
        members: list[GroupMember],
        stack: Stack,
        window: GroupWindow,
        env: Any,
        obs: torch.Tensor,
    ) -> tuple[list[GroupMember], Stack, torch.Tensor]:
        """Cut out the members that ended (pruned, failed, or trained their last epoch)."""
        going = [
            row for row, m in enumerate(members) if m.outcome is None and m.epoch < self.epochs
        ]
        if len(going) == len(members):
            return members, stack, obs
        for row, member in enumerate(members):
            if row not in going:
                self._settle(member)
        if not going:
            return [], stack, obs
        e = self.num_envs
        if isinstance(env, GymGroupEnv):
            env.keep_members(going)
        else:
            env.keep(going)
        window.keep(going)
        rows = torch.tensor([r * e + c for r in going for c in range(e)], device=obs.device)
        self._batch_buffers.clear()  # keyed by rows of the group as it was
        return [members[r] for r in going], stack.keep(going), obs.index_select(0, rows)

    def _epoch(
        self,
        members: list[GroupMember],
        stack: Stack,
        window: GroupWindow,
        env: Any,
        obs: torch.Tensor,
    ) -> torch.Tensor:
        """One epoch of every member: `vector_steps` steps of all environments, each member's
        gradient steps as its own cadence owes them."""
        n, e, device = len(members), self.num_envs, self.device
        n_actions = env.n_actions
        explore_draws = torch.empty(n, e, device=device)
        random_actions = torch.empty(n, e, dtype=torch.long, device=device)
        explore_steps = [m.config.exploration_fraction * m.total_steps for m in members]
        for _ in range(self.vector_steps):
            epsilon = [
                _rl.linear_schedule(1.0, m.config.epsilon_end, explore_steps[k], m.run.env_steps)
                for k, m in enumerate(members)
            ]
            grouped_obs = obs.view(n, e, -1)
            with torch.inference_mode():
                greedy = fused.dueling_q_values(
                    fused.views(stack.online, stack.shapes), grouped_obs
                ).argmax(dim=2)
                for k, m in enumerate(members):  # each member's draws from its own generator
                    torch.rand(e, generator=m.generator, device=device, out=explore_draws[k])
                    torch.randint(
                        n_actions, (e,), generator=m.generator, device=device, out=random_actions[k]
                    )
                eps = torch.tensor(epsilon, device=device).unsqueeze(1)
                action = torch.where(explore_draws < eps, random_actions, greedy)
            step = env.step(action.flatten())
            grouped = type(step)(*(t.view(n, e, *t.shape[1:]) for t in step))
            pushed = window.push(grouped_obs, action, grouped)
            if pushed is not None:
                emits, rows = pushed
                for k, m in enumerate(members):
                    if emits[k]:
                        put(m.replay, rows[k])
            obs = step.obs
            betas = []
            for m in members:
                m.run.env_steps += e
                ready = (
                    m.run.env_steps >= m.learning_starts and m.replay.size >= m.config.batch_size
                )
                if ready:
                    m.credit += m.updates_per_step
                betas.append(
                    _rl.linear_schedule(
                        m.config.per_beta_start, 1.0, m.total_steps, m.run.env_steps
                    )
                )
            while True:
                owed = tuple(k for k, m in enumerate(members) if m.credit >= 1.0)
                if not owed:
                    break
                for k in owed:
                    members[k].credit -= 1.0
                self._gradient_step(members, stack, owed, betas)
        return obs

    def _gradient_step(
        self, members: list[GroupMember], stack: Stack, owed: tuple[int, ...], betas: list[float]
    ) -> None:
        """One fused step of the members in `owed` (rows of the stack), each on its own batch."""
        d = members[0].replay.obs_dim
        table, importance, mask = self._buffers(members, owed)
        drawn = []
        for j, k in enumerate(owed):
            m = members[k]
            b = m.config.batch_size
            rows, weights = m.replay.sample(b, betas[k], m.generator)
            torch.index_select(m.replay.table, 0, rows, out=table[j, :b])
            if weights is not None:
                importance[j, :b] = weights
            drawn.append(rows)
        batch = fused.Batch(
            table[..., :d],
            table[..., d : 2 * d],
            table[..., 2 * d],
            table[..., 2 * d + 1],
            table[..., 2 * d + 2],
            importance,
            mask,
        )
        if len(owed) == len(members):
            online, target, hyper = stack.online, stack.target, stack.hyper
        else:  # only the members that owe a step are computed
            index, hyper = stack.part(owed)
            online = stack.online.detach().index_select(0, index).requires_grad_()
            target = stack.target.index_select(0, index)
        losses, td_error = fused.dqn_losses(online, target, stack.shapes, batch, hyper)
        online.grad = None
        losses.sum().backward()
        grad = online.grad
        fused.clip_per_member(grad, hyper.max_grad_norm)
        stack.adam.step_rows(owed, grad, [stack.lr[k] for k in owed])
        online.grad = None
        due = []
        for j, k in enumerate(owed):
            m = members[k]
            if m.config.per_alpha > 0:
                m.replay.update(drawn[j], td_error[j, : m.config.batch_size])
            m.run.batch_sizes.add(m.config.batch_size)
            m.run.gradient_steps += 1
            if m.run.gradient_steps % m.config.target_update_period == 0:
                due.append(k)
        if due:
            with torch.no_grad():
                stack.target[due] = stack.online[due]

    def _buffers(
        self, members: list[GroupMember], owed: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The padded batch of the members in `owed`: its rows, importance weights and mask,
        kept from step to step (a cadence repeats the same few subsets). The padding rows
        keep whatever finite values they last held: the mask gives them no weight."""
        key = (len(members), owed)
        if key not in self._batch_buffers:
            sizes = [members[k].config.batch_size for k in owed]
            width = 2 * members[0].replay.obs_dim + 3
            shape = (len(owed), max(sizes))
            table = torch.zeros(*shape, width, device=self.device)
            mask = torch.zeros(shape, device=self.device)
            for j, b in enumerate(sizes):
                mask[j, :b] = 1.0
            self._batch_buffers[key] = (table, torch.ones(shape, device=self.device), mask)
        return self._batch_buffers[key]

    # -- the end of an epoch -------------------------------------------------------------------

    def _end_epoch(self, members: list[GroupMember], stack: Stack) -> None:
        """Score every member, then each reports and saves through its own handles."""
        values = self._scores(members, stack)
        for row, (member, value) in enumerate(zip(members, values, strict=True)):
            run, epoch = member.run, member.epoch
            run.history.append(value)
            run.value = value
            try:
                if member.report is not None:
                    seconds = time.perf_counter() - run.started
                    done = f"{run.env_steps:,} env steps, {run.gradient_steps:,} gradient steps"
                    metric = self.task.metric
                    _log(
                        member.index, trial_log.evaluation_line(epoch, metric, value, seconds, done)
                    )
                    member.report(epoch, value)  # may raise optuna.TrialPruned: it leaves
                if member.checkpoint is not None and member.checkpoint.due(epoch):
                    member.checkpoint.save(epoch, self._state(member, stack, row))
            except Exception as error:
                member.outcome = error
            member.epoch += 1

    def _scores(self, members: list[GroupMember], stack: Stack) -> list[float]:
        task, device, n = self.task, self.device, len(members)
        views = fused.views(stack.online.detach(), stack.shapes)
        if not task.is_trading:
            picked: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}

            def greedy(obs: torch.Tensor, playing: list[int]) -> torch.Tensor:
                key = tuple(playing)
                if key not in picked:  # the rows of the members still playing
                    index = torch.tensor(playing, device=device)
                    picked[key] = {k: v.index_select(0, index) for k, v in views.items()}
                own = obs.view(len(playing), -1, obs.shape[-1])
                return fused.dueling_q_values(picked[key], own).argmax(2).flatten()

            seed = task.seed + task.eval_seed_offset
            return mean_eval_returns(task.env_id, greedy, n, device, seed=seed)
        values = []
        for row, member in enumerate(members):
            own = {name: view[row : row + 1] for name, view in views.items()}

            def policy(obs: torch.Tensor, own: dict = own) -> torch.Tensor:
                return fused.dueling_q_values(own, obs.unsqueeze(0)).argmax(2).squeeze(0)

            values.append(
                task.evaluate(policy, device, max_position=member.config.max_position_absolute)
            )
        return values

    def _state(self, member: GroupMember, stack: Stack, row: int) -> dict[str, Any]:
        """The member's checkpoint, in `_rl_checkpoint.save_dqn`'s format."""
        weights = _rl.Weights(stack.shapes, self.device)
        optimizer = weights.optimizer(stack.lr[row])
        adam = stack.adam.member_state(row)
        if adam is not None:
            optimizer.state[weights.flat] = adam
        return {
            "epoch": member.epoch,
            "q_net": stack.online[row].detach().cpu().clone(),
            "target_net": stack.target[row].cpu().clone(),
            "optimizer": optimizer.state_dict(),
            "replay": _rl_checkpoint.replay_state(member.replay),
            "randomness": _rl_checkpoint.randomness(member.generator),
            "counts": _rl_checkpoint.counts(member.run),
            "update_credit": member.credit,
        }
