"""A learning check that could fail: on a market with a known edge, the agents find it.

Strong mean reversion is a regime where a simple rule (sell after a rise, buy after a fall)
earns and buying and holding earns nothing. With their default parameters and the budget of
their own trending-market checks (2 epochs of 6,000 steps for DQN, of 15,000 for PPO: see
tests/test_dqn.py and tests/test_ppo.py), DQN and PPO are trained on everything before the test
part, as the end of a study trains the selected trial, and scored once on the test part, which
no training saw: each must beat buy-and-hold there on every training seed tried.
"""

from __future__ import annotations

import pytest
import torch

from adapters import dqn, ppo
from adapters._rl import frame as _rl

CPU = torch.device("cpu")
SEEDS = (0, 1)

# One thread, as a trial process trains: beside a CPU hog two threads spinning for each other
# took one seed's DQN run from 4 s to 89 s.
torch.set_num_threads(1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "steps_per_epoch"), [(dqn, 6_000), (ppo, 15_000)], ids=["dqn", "ppo"]
)
def test_defaults_beat_buy_and_hold_on_the_test_part_of_a_mean_reverting_market(
    algorithm, steps_per_epoch
):
    for seed in SEEDS:
        options = {"env": "trading", "regime": "mean_reversion", "seed": seed}
        hold = _rl.baselines(options)["buy_and_hold"]["test"]
        config = algorithm.adapter.config()
        run = algorithm.learn(
            config, _rl.test_task(options), epochs=2, steps_per_epoch=steps_per_epoch, device=CPU
        )
        assert run.value > hold + 0.5, (seed, run.history, hold)
