"""The maths of fused training (adapters/_rl/fused.py): one fused step is each member's own step.

A group of DQN members with different learning rates, batch sizes (so padding), Huber deltas,
soft-backup temperatures, target periods and replay kinds takes 100 gradient steps; before
each, the group is set to the members' own state and draws the same rows, and its loss and
clipped gradient are compared with the real `adapters.dqn.Learner.gradient_step`'s. The fused
Adam is compared with torch's, a learning rate per member, a member left out keeping its state.
docs/fused.md says why the rule is one step from the same state and not a whole trajectory.
"""

from __future__ import annotations

import pytest
import torch

from adapters._rl import fused
from benchmarks.bench_fused import equivalence_configs, lockstep_differences

TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a trial process trains
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("per_alpha", [0.0, 0.6], ids=["uniform", "prioritised"])
def test_a_fused_step_is_each_members_own_step(per_alpha: float) -> None:
    cfgs = equivalence_configs(4, hidden=64, per_alpha=per_alpha)
    assert len({c.batch_size for c in cfgs}) == 4  # padding is exercised
    worst = lockstep_differences(cfgs, steps=100, device=torch.device("cpu"))
    for member, (loss, grad) in enumerate(worst):
        assert loss < TOLERANCE, f"member {member}: loss differs by {loss:.1e} (relative)"
        assert grad < TOLERANCE, f"member {member}: gradient differs by {grad:.1e} of its norm"


def test_fused_adam_is_torch_adam_with_a_learning_rate_per_member() -> None:
    draws = torch.Generator().manual_seed(0)
    start = torch.randn(3, 50, generator=draws)
    lr = torch.tensor([1e-3, 3e-2, 5e-4])
    alone = [start[i].clone().requires_grad_() for i in range(3)]
    adams = [torch.optim.Adam([p], lr=float(lr[i]), fused=True) for i, p in enumerate(alone)]
    stacked = start.clone()
    adam = fused.FusedAdam(stacked)
    for step in range(100):
        grads = torch.randn(3, 50, generator=draws)
        active = torch.tensor([True, step % 3 != 0, True])  # member 1 sits out every third step
        for i in range(3):
            if active[i]:
                alone[i].grad = grads[i].clone()
                adams[i].step()
        adam.step(grads, lr, active=active)
    for i in range(3):
        difference = float((stacked[i] - alone[i].detach()).abs().max() / alone[i].detach().norm())
        assert difference < 1e-6, f"member {i} differs from torch's Adam by {difference:.1e}"
        assert int(adam.steps[i]) == int(adams[i].state[alone[i]]["step"])


def test_a_member_left_out_of_a_step_keeps_its_state() -> None:
    params = torch.randn(2, 10)
    adam = fused.FusedAdam(params)
    adam.step(torch.randn(2, 10), torch.tensor([1e-2, 1e-2]))
    before = [t.clone() for t in (params, adam.exp_avg, adam.exp_avg_sq, adam.steps)]
    adam.step(torch.randn(2, 10), torch.tensor([1e-2, 1e-2]), active=torch.tensor([False, True]))
    after = (params, adam.exp_avg, adam.exp_avg_sq, adam.steps)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old[0], new[0])  # the member left out: untouched
        assert not torch.equal(old[1], new[1])  # the other: stepped


def test_batch_bands_keep_each_band_within_twice_its_smallest() -> None:
    sizes = [4096, 64, 300, 100, 128, 257]
    bands = fused.batch_bands(sizes)
    assert bands == [[1, 3, 4], [5, 2], [0]]
    for band in bands:
        assert max(sizes[i] for i in band) <= 2 * min(sizes[i] for i in band)
