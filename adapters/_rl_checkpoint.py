"""What a DQN or PPO checkpoint holds, and how a run goes on from one.

A checkpoint holds the networks' weights, the optimiser's state, the run's generator and its
counters (environment and gradient steps, the epoch). DQN also keeps the newest `REPLAY_KEPT`
transitions of its replay buffer (not all of it: a million transitions of a wide observation are
hundreds of MB per checkpoint): a resumed run, or a copied population member, trains on at once
instead of refilling its buffer first; their priorities start anew, at the highest. The
environments start new episodes. The learning rate is the trial's own, not the checkpoint's, so
a population-based-training segment that copied another member trains with its explored params.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from adapters._rl import Run
    from adapters._weights import Weights


def restore(
    checkpoint: Any,
    weights: dict[str, Weights],
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: Run,
    learning_rate: float,
) -> dict[str, Any] | None:
    """Load the trial's checkpoint into the run (None: nothing to load, start at epoch 0)."""
    state = None if checkpoint is None else checkpoint.load()
    if state is None:
        return None
    for name, net in weights.items():
        net.flat.data.copy_(state[name].to(net.flat.device))
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    generator.set_state(state["generator"].to(generator.get_state().device))
    run.env_steps = int(state["env_steps"])
    run.gradient_steps = int(state["gradient_steps"])
    return state


REPLAY_KEPT = 100_000


def replay_rows(replay: Any) -> torch.Tensor:
    """The newest `REPLAY_KEPT` transitions of a replay buffer, oldest first (on the CPU)."""
    import torch

    size, position, table = replay.size, replay.position, replay.table
    if size < replay.capacity:
        rows = table[:size]
    else:
        rows = torch.cat((table[position:], table[:position]))
    return rows[-REPLAY_KEPT:].detach().cpu().clone()


def refill(replay: Any, state: dict[str, Any]) -> float:
    """Add a DQN state's saved transitions to a new buffer, in order (its capacity and priority
    may differ); the state's credit of gradient steps."""
    rows = state["replay"].to(replay.table.device)
    d = replay.obs_dim
    for chunk in rows[-replay.capacity :].split(4096):
        obs, next_obs = chunk[:, :d], chunk[:, d : 2 * d]
        action, ret, discount = chunk[:, 2 * d], chunk[:, 2 * d + 1], chunk[:, 2 * d + 2]
        replay.add(obs, action, ret, next_obs, discount)
    return float(state["credit"])


def save(
    checkpoint: Any,
    epoch: int,
    weights: dict[str, Weights],
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: Run,
    replay: Any = None,
    **extra: Any,
) -> None:
    """Save the run as it is after `epoch` when the handle says it is due (with DQN's `replay`
    buffer's newest transitions)."""
    if checkpoint is None or not checkpoint.due(epoch):
        return
    state = {name: net.flat.detach().cpu().clone() for name, net in weights.items()}
    if replay is not None:
        state["replay"] = replay_rows(replay)
    state.update(
        optimizer=optimizer.state_dict(),
        generator=generator.get_state().cpu(),
        env_steps=run.env_steps,
        gradient_steps=run.gradient_steps,
        epoch=epoch,
        **extra,
    )
    checkpoint.save(epoch, state)
