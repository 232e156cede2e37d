"""What a fused DQN group steps together: its environments and its n-step window.

- `GymGroupEnv`: one Gymnasium vector env of N x `num_envs` copies, member k's seeded as its own
  trial seeds them, so each member plays the episodes it plays alone;
- `StackedEnvs`: the members' own environments behind one step (trading: each member's position
  limit, costs and hold penalty are its own);
- `GroupWindow`: `adapters.dqn.NStepWindow` over `[N, envs]`, each member with its own n and
  gamma; `put` adds a member's rows to its own replay as `PrioritizedReplay.add` does.

Each can cut out the members that leave the group (`keep`). `scores` scores every member after
an epoch, the Gymnasium members' evaluation episodes in one vector env.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from adapters._rl import fused
from adapters._rl.scoring import mean_eval_returns
from adapters.envs import GymVecEnv
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters._rl.fused_members import GroupMember, Stack
    from adapters._rl.task import Task
    from adapters.dqn import PrioritizedReplay
    from adapters.envs import StepResult
else:
    torch = LazyImport("torch")


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


def put(replay: PrioritizedReplay, rows: torch.Tensor) -> None:
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


def scores(
    task: Task, members: list[GroupMember], stack: Stack, device: torch.device
) -> list[float]:
    """Each member's score after an epoch, as `Task.evaluate` scores it alone: on Gymnasium
    all members' episodes in one vector env (`mean_eval_returns`), on trading one member
    after another (each with its own position limit)."""
    n = len(members)
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


def group_env(task: Any, configs: Sequence[Any], envs: int, device: torch.device) -> Any:
    """The environments of a group's members, stepped as one: N x `envs` Gymnasium copies, or
    each member's own trading environment (its position limit, costs and hold penalty)."""
    if not task.is_trading:
        return GymGroupEnv(task.env_id, len(configs), envs, device, task.seed)
    return StackedEnvs(
        [
            task.make_env(
                envs,
                device,
                max_position=c.max_position_absolute,
                cost_multiplier=c.transaction_cost_multiplier,
                hold_penalty_weight=c.hold_penalty_weight,
            )
            for c in configs
        ]
    )
