"""What every vectorised environment returns from `step`, whatever simulates it."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


class StepResult(NamedTuple):
    """One step of `num_envs` environments, as tensors on the agent's device.

    `obs` is what the agent acts on next: where an episode ended it is already the first
    observation of the next episode, and `final_obs` is the observation the step really led to
    (equal to `obs` everywhere else), which is what a value target bootstraps from.
    """

    obs: torch.Tensor  # float32 [num_envs, obs_dim]
    reward: torch.Tensor  # float32 [num_envs]
    terminated: torch.Tensor  # bool [num_envs]: the episode reached a terminal state
    truncated: torch.Tensor  # bool [num_envs]: the episode was cut short (time limit, data end)
    final_obs: torch.Tensor  # float32 [num_envs, obs_dim]
