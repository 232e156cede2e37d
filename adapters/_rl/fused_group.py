"""One fused DQN group's run: `adapters.dqn.learn`'s loop for N members at once.

`learn_group` is the loop `fused_dqn.train_fused` runs (docs/fused.md has the design):
one act over the stacked networks, one step of every member's environments, one n-step window,
each member's own replay and cadence, one fused gradient step over the members that owe one;
after each epoch every member is scored, reports through its own `report` and saves through its
own checkpoint handle. A member whose report or checkpoint raises leaves the group at that
epoch (its rows are cut out); an error of the group's own step ends every member still in it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._rl import frame as _rl
from adapters._rl import fused, fused_envs, fused_members
from adapters._rl.fused_members import GroupMember, Stack
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Checkpoint, Report
    from adapters.dqn import DQNConfig
else:
    torch = LazyImport("torch")


@dataclass(frozen=True)
class Algorithm:
    """What the fused loop takes from `adapters/dqn.py`, handed in by its adapter (dqn.py
    imports the fused modules, so they do not import it back)."""

    config: type  # DQNConfig
    q_network: Callable[..., Any]
    replay: type  # PrioritizedReplay


def log(index: int, line: str) -> None:
    """A member's line of its trial log: the group's members share the process's output, so
    each line names the member (its place in the group), which the pool's group puts in that
    member's own log."""
    trial_log.write_member(index, line)


def learn_group(
    algorithm: Algorithm,
    configs: Sequence[DQNConfig],
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
    return GroupRun(
        algorithm, configs, task, epochs, steps_per_epoch, device, reports, checkpoints
    ).go()


class GroupRun:
    """One fused group's run, from its members' configs to their outcomes."""

    def __init__(
        self,
        algorithm: Algorithm,
        configs: Sequence[DQNConfig],
        task: _rl.Task,
        epochs: int,
        steps_per_epoch: int,
        device: torch.device,
        reports: Sequence[Report | None],
        checkpoints: Sequence[Checkpoint | None],
    ) -> None:
        self.algorithm, self.task, self.epochs, self.device = algorithm, task, epochs, device
        self.started = time.perf_counter()
        self.num_envs = configs[0].num_envs
        self.vector_steps = math.ceil(steps_per_epoch / self.num_envs)
        self.steps_per_epoch = steps_per_epoch
        self.configs, self.reports, self.checkpoints = list(configs), reports, checkpoints
        self.outcomes: list[_rl.Run | BaseException | None] = [None] * len(configs)
        self._batch_buffers: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, ...]] = {}

    # -- setting up ----------------------------------------------------------------------------

    def _make_env(self) -> Any:
        return fused_envs.group_env(self.task, self.configs, self.num_envs, self.device)

    def _members(self, env: Any) -> tuple[list[GroupMember], Stack]:
        """Each member as its trial starts alone (the same seed: the same first weights and
        draws), then what its own checkpoint holds, if anything."""
        task, device = self.task, self.device
        total_steps = self.epochs * self.vector_steps * self.num_envs
        members, nets = [], []
        for index, config in enumerate(self.configs):
            torch.manual_seed(task.seed)  # the weights a trial alone draws first
            nets.append(
                self.algorithm.q_network(env.obs_dim, env.n_actions, config.hidden_size, device)
            )
            generator = torch.Generator(device=device)
            generator.manual_seed(task.seed)
            capacity = max(1, min(config.buffer_size, total_steps))
            replay = self.algorithm.replay(capacity, env.obs_dim, config.per_alpha, device)
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
                fused_members.resume(member, stack, row, self.device)
            except Exception as error:  # an unreadable state of its own: it alone ends
                member.outcome = error
        return members, stack

    # -- running -------------------------------------------------------------------------------

    def go(self) -> list[_rl.Run | BaseException]:
        _rl.seed_everything(self.task.seed)
        members: list[GroupMember] = []
        env = None
        try:
            env = self._make_env()
            members, stack = self._members(env)
            window = fused_envs.GroupWindow(
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
        window: fused_envs.GroupWindow,
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
        if isinstance(env, fused_envs.GymGroupEnv):
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
        window: fused_envs.GroupWindow,
        env: Any,
        obs: torch.Tensor,
    ) -> torch.Tensor:
        """One epoch of every member: `vector_steps` steps of all environments, each member's
        gradient steps as its own cadence owes them."""
        n, e = len(members), self.num_envs
        draws = (
            torch.empty(n, e, device=self.device),
            torch.empty(n, e, dtype=torch.long, device=self.device),
        )
        for _ in range(self.vector_steps):
            grouped_obs = obs.view(n, e, -1)
            action = self._act(members, stack, grouped_obs, env.n_actions, draws)
            step = env.step(action.flatten())
            grouped = type(step)(*(t.view(n, e, *t.shape[1:]) for t in step))
            pushed = window.push(grouped_obs, action, grouped)
            if pushed is not None:
                emits, rows = pushed
                for k, m in enumerate(members):
                    if emits[k]:
                        fused_envs.put(m.replay, rows[k])
            obs = step.obs
            self._learn(members, stack)
        return obs

    def _act(
        self,
        members: list[GroupMember],
        stack: Stack,
        obs: torch.Tensor,
        n_actions: int,
        draws: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Epsilon-greedy actions `[N, envs]`: one greedy forward over all members, each
        member's exploration drawn from its own generator (as `Learner.act` draws it alone)."""
        explore, random = draws
        epsilon = [
            _rl.linear_schedule(
                1.0, m.config.epsilon_end, m.config.exploration_fraction * m.total_steps,
                m.run.env_steps,
            )
            for m in members
        ]  # fmt: skip
        with torch.inference_mode():
            net = fused.views(stack.online, stack.shapes)
            greedy = fused.dueling_q_values(net, obs).argmax(dim=2)
            e, device = obs.shape[1], self.device
            for k, m in enumerate(members):
                torch.rand(e, generator=m.generator, device=device, out=explore[k])
                torch.randint(n_actions, (e,), generator=m.generator, device=device, out=random[k])
            eps = torch.tensor(epsilon, device=device).unsqueeze(1)
            return torch.where(explore < eps, random, greedy)

    def _learn(self, members: list[GroupMember], stack: Stack) -> None:
        """After a vector step: each member's credit grows by its replay ratio's share (once
        its learning has started), and the fused steps the members owe are taken."""
        betas = []
        for m in members:
            m.run.env_steps += self.num_envs
            if m.run.env_steps >= m.learning_starts and m.replay.size >= m.config.batch_size:
                m.credit += m.updates_per_step
            betas.append(
                _rl.linear_schedule(m.config.per_beta_start, 1.0, m.total_steps, m.run.env_steps)
            )
        while True:
            owed = tuple(k for k, m in enumerate(members) if m.credit >= 1.0)
            if not owed:
                return
            for k in owed:
                members[k].credit -= 1.0
            self._gradient_step(members, stack, owed, betas)

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
            online = fused.aligned(stack.online.detach().index_select(0, index))
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
        values = fused_envs.scores(self.task, members, stack, self.device)
        for row, (member, value) in enumerate(zip(members, values, strict=True)):
            run, epoch = member.run, member.epoch
            run.history.append(value)
            run.value = value
            try:
                if member.report is not None:
                    seconds = time.perf_counter() - run.started
                    done = f"{run.env_steps:,} env steps, {run.gradient_steps:,} gradient steps"
                    metric = self.task.metric
                    log(
                        member.index, trial_log.evaluation_line(epoch, metric, value, seconds, done)
                    )
                    member.report(epoch, value)  # may raise optuna.TrialPruned: it leaves
                if member.checkpoint is not None and member.checkpoint.due(epoch):
                    member.checkpoint.save(
                        epoch, fused_members.checkpoint_state(member, stack, row, self.device)
                    )
            except Exception as error:
                member.outcome = error
            member.epoch += 1
