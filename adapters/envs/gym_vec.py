"""Any Gymnasium environment with a discrete action space, behind the same tensor interface.

Gymnasium's own vector API steps the copies (`gymnasium.make_vec`, synchronous, same-step
autoreset); this wrapper only converts arrays to tensors on the agent's device, fills
`final_obs` where an episode ended, and keeps the returns of finished episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from adapters.envs.base import StepResult
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import gymnasium as gym
    import numpy as np
    import torch
else:
    gym = LazyImport("gymnasium")
    np = LazyImport("numpy")
    torch = LazyImport("torch")


def check_gym_id(env_id: str) -> None:
    """A UserError unless `env_id` is a registered Gymnasium id with a discrete action space."""
    try:
        gym.spec(env_id)
    except Exception as error:  # gymnasium raises several error types for unknown ids
        raise UserError(
            f"--env {env_id!r} is neither 'trading' nor a registered Gymnasium id ({error}); "
            "try --env CartPole-v1"
        ) from None
    env = gym.make(env_id)
    try:
        space = env.action_space
        shape = getattr(env.observation_space, "shape", None)
    finally:
        env.close()
    if not isinstance(space, gym.spaces.Discrete):
        raise UserError(
            f"--env {env_id!r} has a {type(space).__name__} action space; "
            "DQN and PPO here need a Discrete one (try CartPole-v1 or Acrobot-v1)"
        )
    if not shape or len(shape) != 1:
        raise UserError(
            f"--env {env_id!r} has observations of shape {shape}; a flat vector is needed"
        )


class GymVecEnv:
    """`num_envs` copies of a Gymnasium environment, stepped by Gymnasium's vector API.

    `seed` seeds copy i with seed + i; a list seeds each copy with its own (a fused group's
    members each play the episodes their own trial plays alone: docs/fused.md)."""

    def __init__(
        self,
        env_id: str,
        *,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        seed: int | Sequence[int] = 0,
    ) -> None:
        self.env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            # Fresh arrays from every step (so the tensors may share their memory), no checker.
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "copy": True},
            disable_env_checker=True,
        )
        self.env.action_space.seed(seed if isinstance(seed, int) else seed[0])
        self.seed: int | list[int] = seed if isinstance(seed, int) else list(seed)
        self.device = torch.device(device)
        self.num_envs = num_envs
        self.obs_dim = int(self.env.single_observation_space.shape[0])
        self.n_actions = int(self.env.single_action_space.n)
        self.episode_return = np.zeros(num_envs)  # float64, on the host like the environments
        self.finished_returns: list[float] = []

    def _tensor(self, array: Any) -> torch.Tensor:
        if array.dtype != np.bool_:
            array = array.astype(np.float32, copy=False)
        tensor = torch.from_numpy(array)  # shares the step's fresh array: no copy on the host
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)

    def reset(self) -> torch.Tensor:
        obs, _ = self.env.reset(seed=self.seed)
        self.episode_return[:] = 0.0
        return self._tensor(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(actions.cpu().numpy())
        done = terminated | truncated
        self.episode_return += reward
        obs_tensor = final_tensor = self._tensor(obs)
        if done.any():
            final = obs.copy()
            rows = np.flatnonzero(info["_final_obs"])
            final[rows] = np.stack(info["final_obs"][rows])
            final_tensor = self._tensor(final)
            self.finished_returns.extend(self.episode_return[done].tolist())
            self.episode_return[done] = 0.0
        return StepResult(
            obs_tensor,
            self._tensor(reward),
            self._tensor(terminated),
            self._tensor(truncated),
            final_tensor,
        )

    def keep(self, copies: Sequence[int]) -> None:
        """Go on with only these copies (by index), each where it is; the others are closed."""
        kept = set(copies)
        for index, env in enumerate(self.env.envs):
            if index not in kept:
                env.close()
        envs = [self.env.envs[i] for i in copies]
        self.env = gym.vector.SyncVectorEnv(
            [lambda env=env: env for env in envs],
            copy=True,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        seeds = (
            self.seed
            if isinstance(self.seed, list)
            else [self.seed + i for i in range(self.num_envs)]
        )
        self.seed = [seeds[i] for i in copies]
        self.episode_return = self.episode_return[list(copies)]
        self.num_envs = len(envs)

    def close(self) -> None:
        self.env.close()
