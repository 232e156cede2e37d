"""What DQN and PPO keep in a checkpoint, and how a run goes on from one (docs/checkpoints.md).

Both keep their networks' weights, Adam's state, their random generators (the run's torch
generator, torch's and NumPy's global ones) and their counts (environment and gradient steps, the
scores so far). Neither keeps its environments: they are reset when a run goes on, so episodes in
flight at the checkpoint start again (their n-step window, for DQN, with them). DQN keeps the
newest `REPLAY_KEPT` transitions of its replay with their priorities, not all of it: a full
buffer of a million transitions would make every checkpoint hundreds of megabytes, and the
newest ones are those its current policy made; the rest fills again within an epoch.

A state holds only tensors, numbers and lists, so it is read back with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import torch

    from adapters._rl.frame import Run
    from adapters.base import Checkpoint
else:
    np = LazyImport("numpy")
    torch = LazyImport("torch")

REPLAY_KEPT = 65_536  # transitions of DQN's replay kept in a checkpoint (newest first)


def randomness(generator: torch.Generator) -> dict[str, Any]:
    """The run's generator and the global ones, as tensors and lists."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    return {
        "generator": generator.get_state(),
        "torch": torch.get_rng_state(),
        "numpy": [str(kind), torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss],
    }


def restore_randomness(state: dict[str, Any], generator: torch.Generator) -> None:
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))


def counts(run: Run) -> dict[str, Any]:
    return {
        "env_steps": run.env_steps,
        "gradient_steps": run.gradient_steps,
        "history": list(run.history),
        "batch_sizes": sorted(run.batch_sizes),
    }


def restore_counts(state: dict[str, Any], run: Run) -> None:
    run.env_steps, run.gradient_steps = state["env_steps"], state["gradient_steps"]
    run.history = list(state["history"])
    run.value = run.history[-1] if run.history else run.value
    run.batch_sizes.update(state["batch_sizes"])


# --- DQN --------------------------------------------------------------------------------------


def replay_state(replay: Any) -> dict[str, Any]:
    """The newest transitions of a replay buffer, oldest first, with their priority weights."""
    kept = min(replay.size, REPLAY_KEPT)
    newest = (replay.position - kept + torch.arange(kept)) % replay.capacity
    rows = newest.to(replay.table.device)
    state: dict[str, Any] = {"table": replay.table.index_select(0, rows).cpu()}
    if replay.alpha > 0:
        state["weight"] = replay.weight.index_select(0, rows).cpu()
        state["max_weight"] = replay.max_weight.cpu()
    return state


def restore_replay(replay: Any, state: dict[str, Any]) -> None:
    """Fill an empty replay buffer with a saved one's transitions (as many as it holds)."""
    table = state["table"][-replay.capacity :]
    kept = len(table)
    replay.table[:kept] = table.to(replay.table.device)
    replay.position, replay.size = kept % replay.capacity, kept
    if replay.alpha > 0 and kept:
        if "weight" in state:
            replay.weight[:kept] = state["weight"][-kept:].to(replay.weight.device)
            replay.max_weight = state["max_weight"].to(replay.weight.device)
        else:  # saved by a uniform replay (a PBT member copied one): the highest priority
            replay.weight[:kept] = replay.max_weight
        replay._resum(slice(0, kept))


def save_dqn(
    checkpoint: Checkpoint | None, epoch: int, learner: Any, run: Run, update_credit: float
) -> None:
    if checkpoint is None or not checkpoint.due(epoch):
        return
    checkpoint.save(
        epoch,
        {
            "epoch": epoch,
            "q_net": learner.q_net.flat.detach().cpu(),
            "target_net": learner.target_net.flat.detach().cpu(),
            "optimizer": learner.optimizer.state_dict(),
            "replay": replay_state(learner.replay),
            "randomness": randomness(learner.generator),
            "counts": counts(run),
            "update_credit": update_credit,
        },
    )


def resume_dqn(checkpoint: Checkpoint | None, learner: Any, run: Run) -> tuple[int, float]:
    """(the epoch to start at, the gradient steps owed) after loading the latest state, if any."""
    state = None if checkpoint is None else checkpoint.load()
    if state is None:
        return 0, 0.0
    with torch.no_grad():
        learner.q_net.flat.copy_(state["q_net"])
        learner.target_net.flat.copy_(state["target_net"])
    learner.optimizer.load_state_dict(state["optimizer"])
    restore_replay(learner.replay, state["replay"])
    restore_randomness(state["randomness"], learner.generator)
    restore_counts(state["counts"], run)
    return int(state["epoch"]) + 1, float(state["update_credit"])


# --- PPO --------------------------------------------------------------------------------------


def save_ppo(
    checkpoint: Checkpoint | None,
    epoch: int,
    rollout_index: int,
    net: Any,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: Run,
) -> None:
    if checkpoint is None or not checkpoint.due(epoch):
        return
    checkpoint.save(
        epoch,
        {
            "epoch": epoch,
            "rollout_index": rollout_index,
            "net": net.flat.detach().cpu(),
            "optimizer": optimizer.state_dict(),
            "randomness": randomness(generator),
            "counts": counts(run),
        },
    )


def resume_ppo(
    checkpoint: Checkpoint | None,
    net: Any,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: Run,
) -> tuple[int, int]:
    """(the next rollout, the next epoch) after loading the latest state; (0, 0) from scratch."""
    state = None if checkpoint is None else checkpoint.load()
    if state is None:
        return 0, 0
    with torch.no_grad():
        net.flat.copy_(state["net"])
    optimizer.load_state_dict(state["optimizer"])
    restore_randomness(state["randomness"], generator)
    restore_counts(state["counts"], run)
    return int(state["rollout_index"]) + 1, int(state["epoch"]) + 1


def own_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    """After a load, the trial's own learning rate: the optimiser's state brings the saved one,
    and a population-based-training member that copied another trains with its explored rate
    (the same rate, for a re-run of one trial)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
