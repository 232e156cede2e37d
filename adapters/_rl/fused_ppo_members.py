"""What each member of a fused PPO group keeps of its own (its trial's handles, generator,
counts), the members' stacked rows and Adam, and each member's checkpoint in the format
`adapters/_rl/checkpoint.py` writes for one trial (docs/fused.md, "PPO's fused loop")."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters._rl import checkpoint as _rl_checkpoint
from adapters._rl import frame as _rl
from adapters._rl import fused
from adapters._rl import fused_ppo_maths as maths
from adapters._rl.fused import aligned
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch

    from adapters.base import Checkpoint, Report
    from adapters.ppo import PPOConfig
else:
    torch = LazyImport("torch")

ADAM_EPS = 1e-5  # as `adapters.ppo.learn`'s optimiser


@dataclass(frozen=True)
class Algorithm:
    """What the fused loop takes from `adapters/ppo.py`, handed in by its adapter (ppo.py
    imports the fused modules, so they do not import it back)."""

    config: type  # PPOConfig
    network: Callable[..., Any]  # actor_critic


def rollout_length(rollout_steps: int, batch_size: int, num_envs: int) -> int:
    """The steps per environment of one rollout: never smaller than one minibatch (as
    `adapters.ppo.learn` makes it)."""
    return max(int(rollout_steps), math.ceil(int(batch_size) / int(num_envs)))


@dataclass
class Member:
    """What one member keeps of its own: its trial's handles, generator and counts."""

    index: int  # its place in the caller's list
    config: PPOConfig
    report: Report | None
    checkpoint: Checkpoint | None
    generator: torch.Generator
    run: _rl.Run
    rollout: int = 0  # the next rollout it collects
    epoch: int = 0  # the next epoch it scores
    lr: float | None = None  # the learning rate of its last rollout
    outcome: BaseException | None = None


@dataclass
class Stack:
    """The members' networks as `[N, P]` rows, their Adam, their hyperparameters."""

    online: torch.Tensor  # [N, P], a leaf (rows `aligned`)
    adam: fused.FusedAdam
    shapes: dict[str, tuple[int, ...]]
    hyper: maths.PPOHyper

    def keep(self, rows: list[int]) -> Stack:
        index = torch.tensor(rows, dtype=torch.long, device=self.online.device)
        online = aligned(self.online.detach().index_select(0, index))
        return Stack(online, self.adam.keep(rows, online), self.shapes, self.hyper.rows(index))


def adam_state_dict(
    lr: float, state: dict[str, torch.Tensor] | None, device: torch.device
) -> dict[str, Any]:
    """`Weights.optimizer(lr, eps=ADAM_EPS).state_dict()` of one trial's flat parameter whose
    Adam state is `state` (None before its first step), built from `torch.optim.Adam`'s
    signature instead of an instance: a process's first Adam imports `torch._dynamo` (about
    1.2 s of CPU), which nothing else a group runs needs. tests/test_fused_ppo.py holds it
    equal to the real one."""
    signature = inspect.signature(torch.optim.Adam.__init__).parameters.items()
    group = {name: p.default for name, p in signature if name not in ("self", "params")}
    group |= {"lr": lr, "eps": ADAM_EPS, "fused": torch.device(device).type in ("cpu", "cuda")}
    return {
        "state": {} if state is None else {0: state},
        "param_groups": [{**group, "params": [0]}],
    }


def resume(member: Member, stack: Stack, row: int, device: Any, per_rollout: int) -> None:
    """`_rl_checkpoint.resume_ppo` into the member's rows (its generator, not the process's
    global ones, which the loop does not draw from); `per_rollout`: environment steps of one
    rollout of one member."""
    state = None if member.checkpoint is None else member.checkpoint.load()
    if state is None:
        return
    with torch.no_grad():
        stack.online[row] = state["net"].to(device)
    saved = state["optimizer"]["state"]
    if saved:
        stack.adam.load_member(row, {k: v.to(device) for k, v in saved[0].items()})
    member.generator.set_state(state["randomness"]["generator"])
    _rl_checkpoint.restore_counts(state["counts"], member.run)
    member.rollout, member.epoch = int(state["rollout_index"]) + 1, int(state["epoch"]) + 1
    if member.epoch:  # from the steps taken, as `learn` counts them
        member.rollout = member.run.env_steps // per_rollout


def checkpoint_state(member: Member, stack: Stack, row: int, device: Any) -> dict[str, Any]:
    """The member's checkpoint, in `_rl_checkpoint.save_ppo`'s format (its Adam state as a
    `torch.optim.Adam` state dict, at the learning rate it last stepped with)."""
    lr = member.config.learning_rate if member.lr is None else member.lr
    return {
        "epoch": member.epoch,
        "rollout_index": member.rollout - 1,
        "net": stack.online[row].detach().cpu().clone(),
        "optimizer": adam_state_dict(lr, stack.adam.member_state(row), device),
        "randomness": _rl_checkpoint.randomness(member.generator),
        "counts": _rl_checkpoint.counts(member.run),
    }
