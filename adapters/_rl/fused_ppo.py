"""PPO trials trained as one fused group: the PPO adapter's `train_fused` and `fuse_key`.

docs/fused.md ("PPO's fused loop") has the design. Here is the key, and the entry (`fused_train`, shared with DQN, with the folds);
the loop, `adapters.ppo.learn`'s loop for N members at once, is `fused_ppo_group`, its maths
`fused_ppo_maths`. `adapters/ppo.py` hands them its config and network
(`fused_ppo_group.Algorithm`): it imports these modules, so they do not import it back.

The members of one group share what decides *when* they act and update: hidden width (a
shape), the rollout's length in vector steps, the environments per member and the minibatch
size (so every member takes the same number of minibatches per pass, none padded). Everything
else is each member's own: first weights, generator (its action draws and its shuffles), its
environments' seeds, learning rate and its annealing, gamma, GAE's lambda, clip, value and
entropy weights, gradient clip, passes per rollout, Adam row, counts, reports, checkpoints.

A group of one is `train` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters._rl import fused_train
from adapters._rl.fused_ppo_group import Algorithm, learn_group, rollout_length
from adapters._rl.fused_train import Group
from adapters.base import Member

if TYPE_CHECKING:
    import torch

    from adapters.ppo import PPOConfig


def fuse_key(hidden_size: int, batch_size: int, rollout_steps: int, num_envs: int) -> Hashable:
    """Which PPO trials may train as one group: equal hidden width, minibatch size, rollout
    length (in vector steps: members update at the same steps) and environments per member.

    The minibatch size is keyed exactly, not by band: the pool's group path fixes, for a
    group's other members, every parameter this key reads, so a band would never put two
    sizes in one pool group, and one size gives every member the same minibatches per pass
    with nothing padded (each member's loss is the sum over its own rows, as alone)."""
    steps = rollout_length(rollout_steps, batch_size, num_envs)
    return (int(hidden_size), int(batch_size), steps, int(num_envs))


def _group_key(config: PPOConfig) -> Hashable:
    return fuse_key(config.hidden_size, config.batch_size, config.rollout_steps, config.num_envs)


def train_fused(
    adapter: Any,
    algorithm: Algorithm,
    members: Sequence[Member],
    *,
    epochs: int,
    device: torch.device,
    options: Mapping[str, Any],
) -> list[float | BaseException]:
    """One entry per member, in order: its value, or what ended it (docs/fused.md)."""
    group = Group("PPO", algorithm.config, _group_key, functools.partial(learn_group, algorithm))
    return fused_train.train_fused(
        adapter, group, members, epochs=epochs, device=device, options=options
    )
