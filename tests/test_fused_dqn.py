"""DQN trials trained as one fused group (`dqn.adapter.train_fused`, adapters/_rl/fused_*.py).

Real training on CartPole-v1, a few hundred steps an epoch: every member reports every epoch and
gets its value; a member pruned at an epoch leaves while the others finish; a member whose
checkpoint fails ends alone; checkpoints go both ways between a group and a trial alone; and the
maths of the fused loop is each member's own (docs/fused.md, "The equivalence rule"), checked
inside a real group of 8 with different batch sizes, replay kinds and hyperparameters.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import optuna
import pytest
import torch

from adapters import dqn
from adapters._rl import fused, fused_dqn, fused_group
from adapters.base import Member
from benchmarks.bench_fused import backpropagated
from orchestrator.record.checkpoints import files as stored
from orchestrator.run.trial.member import shape_of

CPU = torch.device("cpu")
STEPS = (
    400  # environment steps an epoch: learning starts at 100, then a gradient step or two a step
)
OPTIONS = {**dqn.adapter.options, "env": "CartPole-v1", "steps_per_epoch": STEPS}
BASE = {**dqn.adapter.default_params, "hidden_size": 64}

# Three members of one batch size (so a member's run is bit for bit its run alone: see the
# equivalence test for padded batches) with different everything else, prioritised and uniform.
THREE = [
    {**BASE, "batch_size": 64, "learning_rate": 1e-3, "n_step": 3, "per_alpha": 0.6},
    {**BASE, "batch_size": 64, "learning_rate": 3e-4, "n_step": 1, "per_alpha": 0.0,
     "gamma": 0.95, "entropy_coefficient": 0.03, "target_update_period": 60},
    {**BASE, "batch_size": 64, "learning_rate": 2e-3, "n_step": 5, "per_alpha": 0.3,
     "huber_delta": 2.0, "exploration_fraction": 0.1},
]  # fmt: skip

# Eight members of one band (64..127): padding, a cadence per member, targets refreshed within
# the first 100 steps, prioritised and uniform replay, the soft backup and double DQN.
EIGHT = [
    {**BASE, "batch_size": b, "learning_rate": lr, "n_step": n, "per_alpha": a, "gamma": g,
     "entropy_coefficient": e, "huber_delta": d, "target_update_period": t}
    for b, lr, n, a, g, e, d, t in [
        (64, 1e-3, 3, 0.6, 0.97, 0.0, 10.0, 30),
        (71, 3e-4, 1, 0.0, 0.95, 0.05, 1.0, 50),
        (80, 2e-3, 5, 0.3, 0.99, 0.0, 5.0, 40),
        (90, 5e-4, 2, 0.0, 0.9, 0.02, 10.0, 25),
        (100, 1e-3, 4, 0.9, 0.97, 0.0, 2.0, 70),
        (110, 7e-4, 3, 0.0, 0.93, 0.0, 20.0, 35),
        (120, 4e-3, 1, 0.5, 0.98, 0.01, 3.0, 45),
        (127, 1e-4, 2, 0.0, 0.96, 0.0, 10.0, 55),
    ]
]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a trial process trains
    yield
    torch.set_num_threads(threads)


class MemoryHandle:
    """A checkpoint handle that keeps the encoded file in memory, as a store keeps it."""

    def __init__(self, saved: bytes | None = None, *, fails: bool = False) -> None:
        self.saved, self.epochs, self.fails = saved, [], fails

    def due(self, epoch: int) -> bool:
        return True

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        if self.fails:
            raise OSError("the disk is full")
        self.saved = stored.encode(epoch, state)
        self.epochs.append(epoch)

    def load(self) -> dict[str, Any] | None:
        return None if self.saved is None else stored.decode(self.saved)[1]


def reporter(into: list[tuple[int, float]], prune_at: int | None = None) -> Any:
    def report(epoch: int, value: float) -> None:
        into.append((epoch, value))
        if epoch == prune_at:
            raise optuna.TrialPruned(f"pruned at epoch {epoch}")

    return report


def alone(params: dict[str, Any], epochs: int, checkpoint: Any = None) -> tuple[float, list]:
    reports: list[tuple[int, float]] = []
    value = dqn.adapter.train(
        params, epochs=epochs, device=CPU, options=OPTIONS, report=reporter(reports),
        checkpoint=checkpoint,
    )  # fmt: skip
    return value, reports


def test_every_member_reports_every_epoch_and_gets_what_it_gets_alone():
    reports: list[list[tuple[int, float]]] = [[] for _ in THREE]
    members = [Member(p, reporter(r), None) for p, r in zip(THREE, reports, strict=True)]
    entries = dqn.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert all(isinstance(e, float) and math.isfinite(e) for e in entries), entries
    assert [[epoch for epoch, _ in r] for r in reports] == [[0, 1]] * 3
    assert [r[-1][1] for r in reports] == entries  # the value is the last epoch's score
    for params, entry, own in zip(THREE, entries, reports, strict=True):
        assert alone(params, 2) == (entry, own)  # bit for bit, every epoch


def test_a_pruned_member_leaves_and_a_failing_checkpoint_ends_only_its_member():
    reports: list[list[tuple[int, float]]] = [[] for _ in THREE]
    members = [
        Member(THREE[0], reporter(reports[0]), None),
        Member(THREE[1], reporter(reports[1], prune_at=0), None),
        Member(THREE[2], reporter(reports[2]), MemoryHandle(fails=True)),
    ]
    entries = dqn.adapter.train_fused(members, epochs=3, device=CPU, options=OPTIONS)
    assert isinstance(entries[1], optuna.TrialPruned)
    assert [e for e, _ in reports[1]] == [0]  # it left at the epoch it was pruned
    assert isinstance(entries[2], OSError) and [e for e, _ in reports[2]] == [0]
    assert [e for e, _ in reports[0]] == [0, 1, 2]
    # The rows cut out of the group took nothing of the member that stayed.
    assert alone(THREE[0], 3) == (entries[0], reports[0])


def test_an_error_of_the_fused_step_ends_every_member_still_in_the_group(monkeypatch):
    real_step, calls = fused_group.GroupRun._gradient_step, []

    def failing(self: Any, members: list, *args: Any) -> None:
        calls.append(len(members))
        if len(members) == 2:  # once a member has left, the step fails
            raise RuntimeError("out of memory")
        real_step(self, members, *args)

    monkeypatch.setattr(fused_group.GroupRun, "_gradient_step", failing)
    reports: list[list[tuple[int, float]]] = [[] for _ in THREE]
    members = [
        Member(p, reporter(r, prune_at=0 if i == 0 else None), None)
        for i, (p, r) in enumerate(zip(THREE, reports, strict=True))
    ]
    entries = dqn.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert isinstance(entries[0], optuna.TrialPruned)  # its own ending stays its own
    assert [type(e) for e in entries[1:]] == [RuntimeError, RuntimeError]
    assert str(entries[1]) == "out of memory" and 3 in calls and calls[-1] == 2


def test_checkpoints_go_from_a_group_to_a_trial_alone_and_back():
    # A member's checkpoint, saved in a group, is the one its trial saves alone...
    handles = [MemoryHandle() for _ in THREE[:2]]
    members = [Member(p, lambda e, v: None, h) for p, h in zip(THREE[:2], handles, strict=True)]
    dqn.adapter.train_fused(members, epochs=1, device=CPU, options=OPTIONS)
    by_itself = MemoryHandle()
    alone(THREE[1], 1, by_itself)
    in_group, own = handles[1].load(), by_itself.load()
    assert handles[1].epochs == [0]
    for state in (in_group, own):
        del state["randomness"]["torch"], state["randomness"]["numpy"]  # the process's, not its own
    assert_same(in_group, own)
    # ... so the trial goes on alone from it, training only the epoch after it.
    value, reports = alone(THREE[1], 2, MemoryHandle(handles[1].saved))
    assert [e for e, _ in reports] == [1] and math.isfinite(value)
    # And a group goes on from a trial's checkpoint: that member trains its epoch 1 while a
    # fresh member beside it trains epochs 0 and 1, each as it would alone.
    saved_alone = MemoryHandle()
    alone(THREE[0], 1, saved_alone)
    resumed_alone = alone(THREE[0], 2, MemoryHandle(saved_alone.saved))
    reports_in_group: list[list[tuple[int, float]]] = [[], []]
    members = [
        Member(THREE[0], reporter(reports_in_group[0]), MemoryHandle(saved_alone.saved)),
        Member(THREE[2], reporter(reports_in_group[1]), None),
    ]
    entries = dqn.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert (entries[0], reports_in_group[0]) == resumed_alone
    assert [e for e, _ in reports_in_group[1]] == [0, 1]
    assert alone(THREE[2], 2) == (entries[1], reports_in_group[1])


def assert_same(one: Any, other: Any, where: str = "state") -> None:
    if isinstance(one, dict):
        assert one.keys() == other.keys(), where
        for key in one:
            assert_same(one[key], other[key], f"{where}[{key!r}]")
    elif isinstance(one, torch.Tensor):
        # Bit for bit on some CPUs; on others (an AMD EPYC) the batched products' summation
        # order moves a last bit (6e-8 relative): the equivalence rule's 1e-5 is the bound.
        torch.testing.assert_close(one, other, rtol=1e-5, atol=1e-8, msg=where)
    else:
        assert one == other, where


def test_a_fused_step_inside_a_group_of_8_is_each_members_own_step():
    """docs/fused.md's rule, in the real loop: before every fused step of the members' first
    100, each member's state (weights, target, Adam, replay, generator) is handed to the real
    `Learner.gradient_step`, and its loss and clipped gradient must equal the fused step's."""
    worst = {k: [0.0, 0.0] for k in range(len(EIGHT))}
    steps = {k: 0 for k in range(len(EIGHT))}
    real_step, real_adam = fused_group.GroupRun._gradient_step, fused.FusedAdam.step_rows
    taken: dict[str, Any] = {}

    def spy_adam(self: fused.FusedAdam, rows: Any, grads: torch.Tensor, lrs: Any) -> None:
        taken["grads"] = grads.clone()
        real_adam(self, rows, grads, lrs)

    def spy_step(self: Any, members: list, stack: Any, owed: tuple, betas: list) -> None:
        expected = {}
        for j, k in enumerate(owed):
            m = members[k]
            if steps[m.index] < 100:
                expected[j] = own_step(m, stack, k, betas[k])
                steps[m.index] += 1
        losses: list[torch.Tensor] = []
        real_losses = fused.dqn_losses

        def spy_losses(*args: Any) -> Any:
            result = real_losses(*args)
            losses.append(result[0].detach())
            return result

        fused.dqn_losses = spy_losses
        try:
            real_step(self, members, stack, owed, betas)
        finally:
            fused.dqn_losses = real_losses
        for j, (loss, grad) in expected.items():
            index = members[owed[j]].index
            loss_diff = abs(float(losses[0][j]) - loss) / abs(loss)
            grad_diff = float((taken["grads"][j] - grad).abs().max() / grad.norm())
            worst[index] = [max(worst[index][0], loss_diff), max(worst[index][1], grad_diff)]

    fused_group.GroupRun._gradient_step = spy_step
    fused.FusedAdam.step_rows = spy_adam
    try:
        members = [Member(p, lambda e, v: None, None) for p in EIGHT]
        options = {**OPTIONS, "steps_per_epoch": 1200}
        entries = dqn.adapter.train_fused(members, epochs=1, device=CPU, options=options)
    finally:
        fused_group.GroupRun._gradient_step = real_step
        fused.FusedAdam.step_rows = real_adam
    assert all(isinstance(e, float) for e in entries), entries
    assert all(count == 100 for count in steps.values()), steps
    for index, (loss, grad) in worst.items():
        assert loss < 1e-5, f"member {index}: loss differs by {loss:.1e} (relative)"
        assert grad < 1e-5, f"member {index}: gradient differs by {grad:.1e} of its norm"


def own_step(member: Any, stack: Any, row: int, beta: float) -> tuple[float, torch.Tensor]:
    """The real `Learner.gradient_step` of the member from its state in the group, on copies
    (its replay, generator and weights go on untouched): its loss and clipped gradient."""
    config = member.config
    q_net = dqn.q_network(4, 2, config.hidden_size, CPU)
    with torch.no_grad():
        q_net.flat.copy_(stack.online[row])
    target = q_net.frozen_copy()
    target.flat.copy_(stack.target[row])
    optimizer = q_net.optimizer(config.learning_rate)
    state = stack.adam.member_state(row)
    if state is not None:
        optimizer.state[q_net.flat] = state
    generator = torch.Generator()
    generator.set_state(member.generator.get_state())
    learner = dqn.Learner(q_net, target, optimizer, copy.deepcopy(member.replay), generator)
    with backpropagated() as losses:
        learner.gradient_step(config, beta)
    return losses[0], q_net.grad.clone()


def test_with_uniform_replay_a_member_alone_and_in_a_group_of_8_agree_for_100_steps():
    """The literal rule, on uniform replay: each member's first 100 losses alone and inside
    the group agree within 1e-5 (relative). Members padded to the band's largest batch sum
    their rows in another order, so they part in the last bits (about 1e-7 here); prioritised
    replay amplifies such bits (docs/fused.md) and is held to the rule above instead."""
    uniform = [{**p, "per_alpha": 0.0} for p in EIGHT]
    options = {**OPTIONS, "steps_per_epoch": 1200}
    in_group: list[list[float]] = [[] for _ in uniform]
    real_step = fused_group.GroupRun._gradient_step

    def spy_step(self: Any, members: list, stack: Any, owed: tuple, betas: list) -> None:
        real_losses = fused.dqn_losses

        def spy_losses(*args: Any) -> Any:
            losses, td = real_losses(*args)
            for j, k in enumerate(owed):
                in_group[members[k].index].append(float(losses[j].detach()))
            return losses, td

        fused.dqn_losses = spy_losses
        try:
            real_step(self, members, stack, owed, betas)
        finally:
            fused.dqn_losses = real_losses

    fused_group.GroupRun._gradient_step = spy_step
    try:
        members = [Member(p, lambda e, v: None, None) for p in uniform]
        dqn.adapter.train_fused(members, epochs=1, device=CPU, options=options)
    finally:
        fused_group.GroupRun._gradient_step = real_step
    for index, params in enumerate(uniform):
        with backpropagated() as losses:
            dqn.adapter.train(
                params, epochs=1, device=CPU, options=options, report=lambda e, v: None
            )
        assert len(losses) >= 100 and len(in_group[index]) == len(losses)
        worst = max(
            abs(a - g) / abs(a) for a, g in zip(losses[:100], in_group[index][:100], strict=True)
        )
        assert worst < 1e-5, f"member {index}: first 100 losses differ by {worst:.1e}"


def test_trading_members_keep_their_own_markets_and_folds_report_as_alone():
    """On the trading env each member trades under its own position limit, costs and hold
    penalty; with folds each member reports its running mean after every fold, as `train`
    does, and a member pruned after a fold trains no further fold."""
    options = {**dqn.adapter.options, "steps_per_epoch": 200, "folds": 2}
    params = [
        {**dqn.adapter.default_params, "batch_size": 64, "max_position_absolute": 1,
         "transaction_cost_multiplier": 2.0, "hold_penalty_weight": 0.0},
        {**dqn.adapter.default_params, "batch_size": 64, "max_position_absolute": 7,
         "transaction_cost_multiplier": 0.5, "hold_penalty_weight": 1.5},
        {**dqn.adapter.default_params, "batch_size": 64, "max_position_absolute": 3},
    ]  # fmt: skip
    reports: list[list[tuple[int, float]]] = [[] for _ in params]
    members = [
        Member(p, reporter(r, prune_at=0 if i == 2 else None), None)
        for i, (p, r) in enumerate(zip(params, reports, strict=True))
    ]
    entries = dqn.adapter.train_fused(members, epochs=1, device=CPU, options=options)
    assert isinstance(entries[2], optuna.TrialPruned) and [f for f, _ in reports[2]] == [0]
    for entry, own in zip(entries[:2], reports[:2], strict=True):
        assert isinstance(entry, float) and math.isfinite(entry)
        assert [f for f, _ in own] == [0, 1] and own[-1][1] == entry  # the mean of both folds
    assert reports[0] != reports[1]  # their own markets: not one member's run twice


def test_fuse_key_is_the_hidden_width_and_the_batch_band():
    key = dqn.adapter.fuse_key
    assert [fused_dqn.batch_band(b) for b in (64, 127, 128, 255, 2048, 4095, 4096)] == [
        0, 0, 1, 1, 5, 5, 5,
    ]  # fmt: skip
    assert key({**BASE, "batch_size": 64}) == key({**BASE, "batch_size": 127, "gamma": 0.9})
    assert key({**BASE, "batch_size": 64}) != key({**BASE, "batch_size": 128})
    assert key({**BASE, "batch_size": 64}) != key({**BASE, "batch_size": 64, "hidden_size": 128})
    bad = {**OPTIONS, "env": "NoSuchEnv-v0"}
    two = [Member({**BASE, "batch_size": 64}, lambda e, v: None, None) for _ in range(2)]
    entries = dqn.adapter.train_fused(two, epochs=1, device=CPU, options=bad)
    assert [type(e).__name__ for e in entries] == ["UserError"] * 2  # as `train` raises it
    # The pool's group path fixes, for a group's other members, what the first's key reads.
    assert shape_of(dqn.adapter, THREE[0]) == {"batch_size": 64, "hidden_size": 64}
    with pytest.raises(ValueError, match="one fuse_key"):
        dqn.adapter.train_fused(
            [Member({**BASE, "batch_size": b}, lambda e, v: None, None) for b in (64, 128)],
            epochs=1, device=CPU, options=OPTIONS,
        )  # fmt: skip
