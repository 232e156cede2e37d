"""The state of a fused DQN group: what each member keeps of its own, and the stacked rows.

`GroupMember` is one member's trial handles, replay, generator, counts and cadence; `Stack` the
members' online and target networks, Adam and hyperparameters as rows of one tensor each.
`resume` puts a member's checkpoint into its rows, and `checkpoint_state` takes them out again,
both in the format `adapters/_rl/checkpoint.py` reads and writes for one trial: a member saved
in a group goes on alone with `train`, and a trial's checkpoint goes on in a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters._rl import checkpoint as _rl_checkpoint
from adapters._rl import frame as _rl
from adapters._rl import fused
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Checkpoint, Report
    from adapters.dqn import DQNConfig, PrioritizedReplay
else:
    torch = LazyImport("torch")


@dataclass
class GroupMember:
    """What one member keeps of its own: its trial's handles, replay, generator and counts."""

    index: int  # its place in the caller's list
    config: DQNConfig
    report: Report | None
    checkpoint: Checkpoint | None
    replay: PrioritizedReplay
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
        online = fused.aligned(self.online.detach().index_select(0, index))
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


def resume(member: GroupMember, stack: Stack, row: int, device: torch.device) -> None:
    """`_rl_checkpoint.resume_dqn` into the member's rows (its generator, not the process's
    global ones, which the loop does not draw from)."""
    state = None if member.checkpoint is None else member.checkpoint.load()
    if state is None:
        return
    with torch.no_grad():
        stack.online[row] = state["q_net"].to(device)
        stack.target[row] = state["target_net"].to(device)
    saved = state["optimizer"]["state"]
    if saved:
        stack.adam.load_member(row, {k: v.to(device) for k, v in saved[0].items()})
    _rl_checkpoint.restore_replay(member.replay, state["replay"])
    member.generator.set_state(state["randomness"]["generator"])
    _rl_checkpoint.restore_counts(state["counts"], member.run)
    member.epoch, member.credit = int(state["epoch"]) + 1, float(state["update_credit"])


def checkpoint_state(
    member: GroupMember, stack: Stack, row: int, device: torch.device
) -> dict[str, Any]:
    """The member's checkpoint, in `_rl_checkpoint.save_dqn`'s format (its Adam state as a
    `torch.optim.Adam` state dict)."""
    weights = _rl.Weights(stack.shapes, device)
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
