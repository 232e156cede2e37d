"""DQN and PPO go on from a checkpoint: what population-based training copies between members.

The handle here is a plain object with the real handle's three calls (load, due, save); the
states pass through `torch.save` and `torch.load(weights_only=True)` as the artifact store's do.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from adapters import dqn, ppo
from adapters._rl import frame as _rl

CPU = torch.device("cpu")


class Handle:
    def __init__(self, state=None) -> None:
        self.state, self.saved = state, {}

    def load(self):
        return self.state

    def due(self, epoch: int) -> bool:
        return True

    def save(self, epoch: int, state) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        self.saved[epoch] = torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    ("algorithm", "base", "changed"),
    [
        (dqn, {}, {"learning_rate": 3e-4, "buffer_size": 20_000, "batch_size": 32, "per_alpha": 0}),
        # Another rollout length: it goes on from the steps taken, not the donor's rollouts.
        (ppo, {"rollout_steps": 16}, {"learning_rate": 1e-3, "rollout_steps": 24}),
    ],
)
def test_a_run_goes_on_from_a_checkpoint_with_other_params(algorithm, base, changed):
    task = _rl.load_task({"env": "CartPole-v1"})
    config = dataclasses.replace(algorithm.adapter.config(), batch_size=32, hidden_size=32, **base)
    first, reports = Handle(), []
    algorithm.learn(
        config, task, epochs=3, steps_per_epoch=200, device=CPU,
        report=lambda e, v: reports.append(e), checkpoint=first,
    )  # fmt: skip
    assert reports == [0, 1, 2] and sorted(first.saved) == [0, 1, 2]
    state = first.saved[0]
    went_on, reports = Handle(state), []
    run = algorithm.learn(
        dataclasses.replace(config, **changed), task, epochs=3, steps_per_epoch=200, device=CPU,
        report=lambda e, v: reports.append(e), checkpoint=went_on,
    )  # fmt: skip
    assert reports == [1, 2]  # it went on at the next epoch
    assert run.env_steps > state["counts"]["env_steps"] >= 200  # the counters came along
    assert run.value == run.value  # a number, not NaN
    assert sorted(went_on.saved) == [1, 2]
