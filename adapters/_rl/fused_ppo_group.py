"""One fused PPO group's run: `adapters.ppo.learn`'s loop for N members at once.

`learn_group` is the loop `fused_ppo.train_fused` runs (docs/fused.md, "PPO's fused loop"). A
round is one rollout of every member: one act per vector step over the stacked actors (each
member's Gumbel noise from its own generator), one step of all members' environments; then
one critic pass and one GAE over all members, each member's own shuffles (a permutation from
its own generator per pass, one gather for all), one fused gradient step per minibatch. A
member with fewer `update_epochs` sits out the later passes (the step computes only the rows
of the members still passing). After each rollout every member whose epoch is complete is
scored, reports through its own `report` and saves through its own checkpoint handle, in the
format `adapters/_rl/checkpoint.py` writes for one trial. A member whose report or checkpoint
raises leaves the group at that epoch (its rows are cut out); an error of the group's own step
ends every member still in it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._rl import frame as _rl
from adapters._rl import fused, fused_envs
from adapters._rl import fused_ppo_maths as maths
from adapters._rl.fused import aligned
from adapters._rl.fused_group import log
from adapters._rl.fused_ppo_members import (
    ADAM_EPS,
    Algorithm,
    Member,
    Stack,
    checkpoint_state,
    resume,
    rollout_length,
)
from adapters._rl.scoring import mean_eval_returns
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Checkpoint, Report
    from adapters.ppo import PPOConfig
else:
    torch = LazyImport("torch")


def learn_group(
    algorithm: Algorithm,
    configs: Sequence[PPOConfig],
    task: _rl.Task,
    *,
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    reports: Sequence[Report | None],
    checkpoints: Sequence[Checkpoint | None],
) -> list[_rl.Run | BaseException]:
    """`adapters.ppo.learn` for N members of one `fuse_key` at once: each member's `Run`, or
    what ended it (see the module's docstring)."""
    return GroupRun(
        algorithm, configs, task, epochs, steps_per_epoch, device, reports, checkpoints
    ).go()


class GroupRun:
    """One fused PPO group's run, from its members' configs to their outcomes."""

    def __init__(
        self,
        algorithm: Algorithm,
        configs: Sequence[PPOConfig],
        task: _rl.Task,
        epochs: int,
        steps_per_epoch: int,
        device: torch.device,
        reports: Sequence[Report | None],
        checkpoints: Sequence[Checkpoint | None],
    ) -> None:
        self.algorithm, self.task, self.epochs, self.device = algorithm, task, epochs, device
        self.started = time.perf_counter()
        first = configs[0]
        self.num_envs = first.num_envs
        self.steps = rollout_length(first.rollout_steps, first.batch_size, first.num_envs)
        self.batch_size = first.batch_size
        self.steps_per_epoch = steps_per_epoch
        transitions = self.steps * self.num_envs
        self.total_rollouts = max(1, math.ceil(epochs * steps_per_epoch / transitions))
        self.configs, self.reports, self.checkpoints = list(configs), reports, checkpoints
        self.outcomes: list[_rl.Run | BaseException | None] = [None] * len(configs)

    # -- setting up ----------------------------------------------------------------------------

    def _make_env(self) -> Any:
        return fused_envs.group_env(self.task, self.configs, self.num_envs, self.device)

    def _members(self, env: Any) -> tuple[list[Member], Stack]:
        """Each member as its trial starts alone (the same seed: the same first weights and
        draws), then what its own checkpoint holds, if anything."""
        task, device = self.task, self.device
        members, nets = [], []
        for index, config in enumerate(self.configs):
            torch.manual_seed(task.seed)  # the weights a trial alone draws first
            nets.append(
                self.algorithm.network(env.obs_dim, env.n_actions, config.hidden_size, device)
            )
            generator = torch.Generator(device=device)
            generator.manual_seed(task.seed)
            run = _rl.Run(started=self.started)
            members.append(
                Member(index, config, self.reports[index], self.checkpoints[index], generator, run)
            )
        online = fused.stack([net.flat for net in nets])
        stack = Stack(
            online,
            fused.FusedAdam(online),
            dict(nets[0].shapes),
            maths.PPOHyper.of(self.configs, device),
        )
        for row, member in enumerate(members):
            try:
                self._resume(member, stack, row)
            except Exception as error:  # an unreadable state of its own: it alone ends
                member.outcome = error
        return members, stack

    def _resume(self, member: Member, stack: Stack, row: int) -> None:
        resume(member, stack, row, self.device, self.steps * self.num_envs)

    # -- running -------------------------------------------------------------------------------

    def go(self) -> list[_rl.Run | BaseException]:
        _rl.seed_everything(self.task.seed)
        members: list[Member] = []
        env = None
        try:
            env = self._make_env()
            members, stack = self._members(env)
            obs = env.reset()
            self._score(members, stack)  # a member resumed after its last rollout: scores only
            members, stack, obs = self._leave(members, stack, env, obs)
            while members:
                obs = self._round(members, stack, env, obs)
                self._score(members, stack)
                members, stack, obs = self._leave(members, stack, env, obs)
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

    def _settle(self, member: Member) -> None:
        member.run.seconds = time.perf_counter() - self.started
        self.outcomes[member.index] = member.outcome if member.outcome is not None else member.run

    def _finished(self, member: Member) -> bool:
        return member.outcome is not None or (
            member.rollout >= self.total_rollouts and member.epoch >= self.epochs
        )

    def _leave(
        self, members: list[Member], stack: Stack, env: Any, obs: torch.Tensor
    ) -> tuple[list[Member], Stack, torch.Tensor]:
        """Cut out the members that ended (pruned, failed, or trained their last rollout)."""
        going = [row for row, m in enumerate(members) if not self._finished(m)]
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
        rows = torch.tensor([r * e + c for r in going for c in range(e)], device=obs.device)
        return [members[r] for r in going], stack.keep(going), obs.index_select(0, rows)

    def _round(
        self, members: list[Member], stack: Stack, env: Any, obs: torch.Tensor
    ) -> torch.Tensor:
        """One rollout of every member and its update (`adapters.ppo.learn`'s loop body)."""
        lrs = []
        for m in members:
            lr = m.config.learning_rate
            if m.config.anneal_lr:
                lr = m.config.learning_rate * (1.0 - m.rollout / self.total_rollouts)
            lrs.append(lr)
        rollout, obs = self._collect(members, stack, env, obs)
        for m in members:
            m.run.env_steps += self.steps * self.num_envs
        self._update(members, stack, rollout, lrs)
        for m, lr in zip(members, lrs, strict=True):
            m.rollout += 1
            m.lr = lr  # the rate it last stepped with: its checkpoint's optimiser keeps it
        return obs

    def _collect(
        self, members: list[Member], stack: Stack, env: Any, obs: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """`adapters.ppo.collect` for every member: `steps` vector steps, one batched act.
        The rollout's fields are `[steps, N, envs, ...]`."""
        n, e = len(members), self.num_envs
        fields: list[list[torch.Tensor]] = [[] for _ in range(7)]
        net = fused.views(stack.online.detach(), stack.shapes)
        noise = torch.empty(n, e, env.n_actions, device=self.device)
        for _ in range(self.steps):
            own = obs.view(n, e, -1)
            with torch.inference_mode():
                logits = maths.tower(net, "actor", own)
                for k, m in enumerate(members):  # each member's draws from its own generator
                    torch.rand((e, env.n_actions), generator=m.generator, out=noise[k])
                # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits).
                action = (logits - noise.log_().neg_().log_()).argmax(dim=2)
            step = env.step(action.flatten())
            done = step.terminated | step.truncated
            values = (obs, step.final_obs, action.flatten(), logits.flatten(0, 1))
            values += (step.reward, step.terminated, done)
            for field, value in zip(fields, values, strict=True):
                field.append(value)
            obs = step.obs
        stacked = tuple(torch.stack(f).view(self.steps, n, e, *f[0].shape[1:]) for f in fields)
        return stacked, obs

    def _update(
        self,
        members: list[Member],
        stack: Stack,
        rollout: tuple[torch.Tensor, ...],
        lrs: list[float],
    ) -> None:
        """`adapters.ppo.update` for every member: each member's passes over its own rollout
        in its own shuffled minibatches, one fused gradient step per minibatch."""
        obs, final_obs, action, logits, reward, terminated, done = rollout
        net = fused.views(stack.online.detach(), stack.shapes)
        advantage, returns = maths.advantages(
            net, stack.hyper, obs, final_obs, reward, terminated, done
        )
        n, obs_dim = len(members), obs.shape[-1]
        logprob = logits.log_softmax(dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        columns = (obs, action.unsqueeze(-1), logprob.unsqueeze(-1))
        columns += (advantage.unsqueeze(-1), returns.unsqueeze(-1))
        # One row per transition, each member's in its trial's order (step, environment).
        table = torch.cat([c.to(obs.dtype) for c in columns], dim=-1).transpose(0, 1)
        table = table.reshape(n, -1, obs_dim + 4)
        length, size = table.shape[1], self.batch_size
        flat = table.view(-1, obs_dim + 4)
        passes = [m.config.update_epochs for m in members]
        for p in range(max(passes)):
            rows = tuple(k for k in range(n) if passes[k] > p)  # the members still passing
            orders = [
                torch.randperm(length, generator=members[k].generator, device=self.device)
                for k in rows
            ]
            if len(rows) == n:
                index, hyper = None, stack.hyper
            else:
                index = torch.tensor(rows, dtype=torch.long, device=self.device)
                hyper = stack.hyper.rows(index)
            offsets = torch.tensor(rows, device=self.device).unsqueeze(1) * length
            shuffled = flat.index_select(0, (torch.stack(orders) + offsets).flatten())
            shuffled = shuffled.view(len(rows), length, obs_dim + 4)
            row_lrs = [lrs[k] for k in rows]
            for start in range(0, length - size + 1, size):
                self._gradient_step(
                    stack, rows, index, hyper, shuffled[:, start : start + size], row_lrs
                )
            for k in rows:
                members[k].run.gradient_steps += length // size
                members[k].run.batch_sizes.add(size)

    def _gradient_step(
        self,
        stack: Stack,
        rows: tuple[int, ...],
        index: torch.Tensor | None,
        hyper: maths.PPOHyper,
        batch: torch.Tensor,
        lrs: list[float],
    ) -> torch.Tensor:
        """One fused step of the members at `rows` on their minibatches `[len(rows), B, W]`;
        their losses."""
        if index is None:
            online = stack.online
        else:  # only the members still passing are computed
            online = aligned(stack.online.detach().index_select(0, index))
        losses = maths.losses(online, stack.shapes, batch, hyper, batch.shape[-1] - 4)
        online.grad = None
        losses.sum().backward()
        grad = online.grad
        maths.clip_grad_norm(grad, hyper.max_grad_norm)
        stack.adam.step_rows(rows, grad, lrs, eps=ADAM_EPS)
        online.grad = None
        return losses.detach()

    # -- the end of an epoch -------------------------------------------------------------------

    def _score(self, members: list[Member], stack: Stack) -> None:
        """Score every member that has taken its share of environment steps for its next
        epoch (all that are left after its last rollout); each reports and saves through its
        own handles. A member whose report or checkpoint raises leaves at that epoch."""
        while True:
            due = [
                row
                for row, m in enumerate(members)
                if m.outcome is None
                and m.epoch < self.epochs
                and (
                    m.run.env_steps >= (m.epoch + 1) * self.steps_per_epoch
                    or m.rollout >= self.total_rollouts
                )
            ]
            if not due:
                return
            for row, value in zip(due, self._values(members, stack, due), strict=True):
                self._report(members[row], stack, row, value)

    def _report(self, member: Member, stack: Stack, row: int, value: float) -> None:
        run, epoch = member.run, member.epoch
        run.history.append(value)
        run.value = value
        try:
            if member.report is not None:
                seconds = time.perf_counter() - run.started
                done = f"{run.env_steps:,} env steps, {run.gradient_steps:,} gradient steps"
                line = trial_log.evaluation_line(epoch, self.task.metric, value, seconds, done)
                log(member.index, line)
                member.report(epoch, value)  # may raise optuna.TrialPruned: it leaves
            if member.checkpoint is not None and member.checkpoint.due(epoch):
                member.checkpoint.save(epoch, self.checkpoint_state(member, stack, row))
        except Exception as error:
            member.outcome = error
        member.epoch += 1

    def checkpoint_state(self, member: Member, stack: Stack, row: int) -> dict[str, Any]:
        return checkpoint_state(member, stack, row, self.device)

    def _values(self, members: list[Member], stack: Stack, due: list[int]) -> list[float]:
        """The scores of the members at rows `due`, as `Task.evaluate` scores each alone: on
        Gymnasium all their episodes in one vector env (`mean_eval_returns`), on trading one
        member after another (each with its own position limit)."""
        task, device = self.task, self.device
        index = torch.tensor(due, device=device)
        scored = stack.online.detach().index_select(0, index)
        if not task.is_trading:
            picked: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}

            def greedy(obs: torch.Tensor, playing: list[int]) -> torch.Tensor:
                key = tuple(playing)
                if key not in picked:  # the rows of the members still playing
                    rows = torch.tensor(playing, device=device)
                    own_rows = aligned(scored.index_select(0, rows)).detach()
                    picked[key] = fused.views(own_rows, stack.shapes)
                own = obs.view(len(playing), -1, obs.shape[-1])
                return maths.greedy(picked[key], own).flatten()

            seed = task.seed + task.eval_seed_offset
            return mean_eval_returns(task.env_id, greedy, len(due), device, seed=seed)
        values = []
        for k, row in enumerate(due):
            own = fused.views(aligned(scored[k : k + 1]).detach(), stack.shapes)

            def policy(obs: torch.Tensor, own: dict = own) -> torch.Tensor:
                return maths.greedy(own, obs.unsqueeze(0)).squeeze(0)

            limit = members[row].config.max_position_absolute
            values.append(task.evaluate(policy, device, max_position=limit))
        return values
