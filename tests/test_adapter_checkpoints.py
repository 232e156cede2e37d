"""DQN, PPO and the forecaster go on from a checkpoint: the state saved after an epoch is read
back as the store reads it (`torch.load(weights_only=True)`), and a run that loads it trains only
the epochs after it, with its weights, optimiser, replay (DQN) and counts where they were. The
forecaster, which has no environment to reset, reports exactly what an unbroken run reports."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from adapters import dqn, ppo, tft
from adapters._rl import checkpoint as _rl_checkpoint
from adapters._rl import frame as _rl
from adapters.base import parse_options
from orchestrator.record.checkpoints import files as stored

CPU = torch.device("cpu")
STEPS = 256  # environment steps an epoch: a second or so on a CPU


class MemoryHandle:
    """A checkpoint handle that keeps the encoded files in memory, as a store keeps them."""

    def __init__(self, saved: bytes | None = None) -> None:
        self.saved, self.epochs = saved, []

    def due(self, epoch: int) -> bool:
        return True

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        self.saved = stored.encode(epoch, state)
        self.epochs.append(epoch)

    def load(self) -> dict[str, Any] | None:
        return None if self.saved is None else stored.decode(self.saved)[1]


@pytest.mark.parametrize("algorithm", [dqn, ppo], ids=["dqn", "ppo"])
def test_a_run_goes_on_from_the_epoch_it_saved(algorithm: ModuleType):
    task = _rl.load_task({"env": "CartPole-v1"})
    fewer_updates = {"replay_ratio": 2.0} if algorithm is dqn else {}
    config = algorithm.adapter.config(batch_size=64, **fewer_updates)
    first = MemoryHandle()
    whole = algorithm.learn(
        config, task, epochs=2, steps_per_epoch=STEPS, device=CPU, checkpoint=first
    )
    assert first.epochs == [0, 1]
    after_one = MemoryHandle()
    algorithm.learn(config, task, epochs=1, steps_per_epoch=STEPS, device=CPU, checkpoint=after_one)
    reports: list[int] = []
    resumed = algorithm.learn(
        config, task, epochs=2, steps_per_epoch=STEPS, device=CPU,
        report=lambda epoch, value: reports.append(epoch), checkpoint=MemoryHandle(after_one.saved),
    )  # fmt: skip
    assert reports == [1]  # epoch 0 is not trained again
    assert resumed.env_steps == whole.env_steps  # the counts went on from the checkpoint
    assert len(resumed.history) == 2 and resumed.history[0] == whole.history[0]


def test_dqn_keeps_the_newest_transitions_of_its_replay_with_their_priorities():
    replay = dqn.PrioritizedReplay(100, 2, 0.6, CPU)
    for start in range(0, 130, 10):  # wraps: the newest 100 of 130
        rows = torch.arange(start, start + 10, dtype=torch.float32)
        replay.add(rows[:, None].repeat(1, 2), rows, rows, rows[:, None].repeat(1, 2), rows)
    replay.update(torch.tensor([5]), torch.tensor([7.0]))
    state = _rl_checkpoint.replay_state(replay)
    fresh = dqn.PrioritizedReplay(100, 2, 0.6, CPU)
    _rl_checkpoint.restore_replay(fresh, stored.decode(stored.encode(0, {"r": state}))[1]["r"])
    assert fresh.size == 100
    assert sorted(fresh.table[:, 0].tolist()) == sorted(replay.table[:, 0].tolist())
    assert torch.isclose(fresh.block_sum.sum(), replay.block_sum.sum())
    assert fresh.max_weight == replay.max_weight


def test_the_forecaster_resumed_reports_what_an_unbroken_run_reports():
    torch.set_num_threads(1)
    tiny = {"learning_rate": 3e-3, "batch_size": 64, "width": 16, "depth": 1, "dropout": 0.1,
            "window": 16, "weight_decay": 1e-4}  # fmt: skip
    options = parse_options(tft.adapter, {})

    def train(epochs: int, handle: MemoryHandle) -> tuple[float, list[tuple[int, float]]]:
        reports: list[tuple[int, float]] = []
        value = tft.adapter.train(
            tiny, epochs=epochs, device=CPU, options=options,
            report=lambda e, v: reports.append((e, v)), checkpoint=handle,
        )  # fmt: skip
        return value, reports

    whole_value, whole = train(3, MemoryHandle())
    first = MemoryHandle()
    train(1, first)
    value, resumed = train(3, MemoryHandle(first.saved))
    assert resumed == whole[1:]
    assert value == whole_value
