"""DQN trials trained as one fused group: the DQN adapter's `train_fused` and `fuse_key`.

docs/fused.md has the design; `adapters/_rl/fused` the maths of one fused gradient step. Here
is the key, and the entry (`fused_train`, shared with PPO, with the folds); the loop around the step, `adapters.dqn.learn`'s loop for N
members at once, is `fused_group`, each member's state `fused_members`, what the members step
together `fused_envs`. `adapters/dqn.py` hands them its config, network and replay
(`fused_group.Algorithm`): it imports these modules, so they do not import it back. In short:

- the members' networks, targets and Adam states are stacked rows (`fused.FusedAdam`); every
  per-member hyperparameter is a value per row, and a member's Adam step is the very kernel its
  trial runs alone (`FusedAdam.step_rows`);
- one act over all members (one batched forward; each member draws its exploration with its own
  generator, so its draws do not depend on the group);
- one vector environment of N x `num_envs` Gymnasium copies, each member's seeded as its own
  trial seeds them (trading: the members' own environments, stepped one after another);
- one n-step window over all members, each with its own n and gamma (`fused_envs.GroupWindow`);
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

import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters._rl import fused_train
from adapters._rl.fused_group import Algorithm, learn_group
from adapters._rl.fused_train import Group
from adapters.base import BATCH_SIZE_MIN, Member

if TYPE_CHECKING:
    import torch

    from adapters.dqn import DQNConfig

BANDS = 6  # batch bands over the study's 64..4096: [64, 128), [128, 256), ..., [2048, 4096]


def batch_band(batch_size: int) -> int:
    """The band of a batch size: 0 for 64..127, 1 for 128..255, ..., 5 for 2048..4096. Within a
    band the largest batch is less than twice the smallest: a fused step pads at most 2x, and
    the members' replay-ratio cadences stay within 2x of each other (docs/fused.md)."""
    return min(max((int(batch_size) // BATCH_SIZE_MIN).bit_length() - 1, 0), BANDS - 1)


def fuse_key(hidden_size: int, batch_size: int) -> Hashable:
    """Which DQN trials may train as one group: equal hidden width and batch band."""
    return (int(hidden_size), batch_band(int(batch_size)))


def _group_key(config: DQNConfig) -> Hashable:
    """`fuse_key`, and the number of environments (fixed unless a trial's parameters set it):
    what the members of one group must share."""
    return (*fuse_key(config.hidden_size, config.batch_size), config.num_envs)


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
    group = Group("DQN", algorithm.config, _group_key, functools.partial(learn_group, algorithm))
    return fused_train.train_fused(
        adapter, group, members, epochs=epochs, device=device, options=options
    )
