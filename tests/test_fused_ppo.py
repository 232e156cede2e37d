"""PPO trials trained as one fused group (`ppo.adapter.train_fused`, adapters/_rl/fused_ppo*.py).

Real training on CartPole-v1, a few short rollouts an epoch: inside a group of 8 with different
everything but the shape, each member's update is the one `adapters.ppo.update` makes from the
same state, and its first 100 losses are its losses alone; a member pruned at an epoch leaves
while the others finish as alone; checkpoints go both ways between a group and a trial alone;
and `run ppo --fuse 4` through the real command line and trial processes.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

from adapters import ppo
from adapters._rl import frame as _rl
from adapters._rl import fused_ppo_group
from adapters.base import Member
from benchmarks.bench_fused import backpropagated
from orchestrator.record.checkpoints import files as stored
from orchestrator.run.trial.member import shape_of
from tests.cli_helpers import run_cli
from tests.waiting import stored_study

CPU = torch.device("cpu")
OPTIONS = {**ppo.adapter.options, "env": "CartPole-v1", "steps_per_epoch": 512}
# 40 steps of 8 environments: a rollout of 320 transitions, 4 minibatches of 71 per pass (a size
# that starts a member's rows where no multiple of 64 bytes does).
BASE = {**ppo.adapter.default_params, "hidden_size": 32, "batch_size": 71, "rollout_steps": 40}

# Eight members of one shape with different everything else, passes per rollout included.
EIGHT = [
    {**BASE, "learning_rate": lr, "gamma": g, "gae_lambda": lam, "clip_coef": c, "vf_coef": v,
     "entropy_coefficient": ent, "max_grad_norm": clip, "update_epochs": passes}
    for lr, g, lam, c, v, ent, clip, passes in [
        (2.5e-3, 0.99, 0.95, 0.2, 0.5, 0.01, 0.5, 6),
        (1e-3, 0.95, 0.9, 0.1, 0.25, 0.001, 1.0, 5),
        (5e-3, 0.999, 0.99, 0.3, 1.0, 0.05, 2.0, 7),
        (3e-4, 0.9, 0.8, 0.15, 0.7, 0.0001, 0.3, 5),
        (8e-3, 0.97, 0.92, 0.25, 0.4, 0.02, 0.8, 6),
        (2e-3, 0.98, 0.85, 0.12, 0.6, 0.005, 0.4, 5),
        (6e-4, 0.93, 0.97, 0.28, 0.9, 0.08, 1.5, 7),
        (4e-3, 0.995, 0.9, 0.2, 0.3, 0.03, 0.6, 6),
    ]
]  # fmt: skip
THREE = EIGHT[:3]


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


def alone(
    params: dict[str, Any], epochs: int, checkpoint: Any = None, options: Any = OPTIONS
) -> tuple[float, list]:
    reports: list[tuple[int, float]] = []
    value = ppo.adapter.train(
        params, epochs=epochs, device=CPU, options=options, report=reporter(reports),
        checkpoint=checkpoint,
    )  # fmt: skip
    return value, reports


def test_inside_a_group_of_8_each_update_and_the_first_100_losses_are_the_members_own(
    monkeypatch,
):
    """Before each of the group's first updates, each member's state (weights, Adam, generator)
    and its own part of the rollout go to the real `adapters.ppo.update` on copies: its losses
    and its weights after the update must be the fused ones within 1e-5. And each member's
    first 100 losses in the group are its first 100 alone within 1e-5 (relative)."""
    options = {**OPTIONS, "steps_per_epoch": 1600}  # 5 rollouts: 100 to 140 steps a member
    in_group: list[list[float]] = [[] for _ in EIGHT]
    worst = {"loss": 0.0, "weights": 0.0}
    real_update, real_step = (
        fused_ppo_group.GroupRun._update,
        fused_ppo_group.GroupRun._gradient_step,
    )
    current: dict[str, Any] = {}

    def spy_update(self: Any, members: list, stack: Any, rollout: tuple, lrs: list) -> None:
        current["members"] = members
        if current.setdefault("updates", 0) == 2:  # the first two: the whole run is below
            return real_update(self, members, stack, rollout, lrs)
        current["updates"] += 1
        expected = [own_update(m, stack, row, rollout, lrs[row]) for row, m in enumerate(members)]
        first = [len(in_group[m.index]) for m in members]
        real_update(self, members, stack, rollout, lrs)
        for row, (m, (losses, weights)) in enumerate(zip(members, expected, strict=True)):
            fused_losses = in_group[m.index][first[row] :]
            assert len(fused_losses) == len(losses)
            for a, g in zip(losses, fused_losses, strict=True):
                worst["loss"] = max(worst["loss"], abs(a - g) / abs(a))
            moved = (stack.online[row].detach() - weights).abs().max() / weights.abs().max()
            worst["weights"] = max(worst["weights"], float(moved))

    def spy_step(self: Any, stack: Any, rows: tuple, *args: Any) -> torch.Tensor:
        losses = real_step(self, stack, rows, *args)
        for j, k in enumerate(rows):
            in_group[current["members"][k].index].append(float(losses[j]))
        return losses

    monkeypatch.setattr(fused_ppo_group.GroupRun, "_update", spy_update)
    monkeypatch.setattr(fused_ppo_group.GroupRun, "_gradient_step", spy_step)
    members = [Member(p, lambda e, v: None, None) for p in EIGHT]
    entries = ppo.adapter.train_fused(members, epochs=1, device=CPU, options=options)
    monkeypatch.undo()
    assert all(isinstance(e, float) and math.isfinite(e) for e in entries), entries
    assert worst["loss"] < 1e-5 and worst["weights"] < 1e-5, worst
    for index, params in enumerate(EIGHT):
        with backpropagated() as losses:
            value = ppo.adapter.train(
                params, epochs=1, device=CPU, options=options, report=lambda e, v: None
            )
        assert len(in_group[index]) == len(losses) and len(losses) >= 100
        apart = max(
            abs(a - g) / abs(a) for a, g in zip(losses[:100], in_group[index][:100], strict=True)
        )
        assert apart < 1e-5, f"member {index}: first 100 losses differ by {apart:.1e}"
        assert value == entries[index]  # its own episodes, scored as alone


def own_update(
    member: Any, stack: Any, row: int, rollout: tuple, lr: float
) -> tuple[list[float], torch.Tensor]:
    """The real `adapters.ppo.update` of the member from its state in the group, on copies:
    the losses it back-propagates and its weights after."""
    config = member.config
    net = ppo.actor_critic(4, 2, config.hidden_size, CPU)
    with torch.no_grad():
        net.flat.copy_(stack.online[row])
    optimizer = net.optimizer(lr, eps=1e-5)
    state = stack.adam.member_state(row)
    if state is not None:
        optimizer.state[net.flat] = state
    generator = torch.Generator()
    generator.set_state(member.generator.get_state())
    own = ppo.Rollout(*(field[:, row].clone() for field in rollout))
    with backpropagated() as losses:
        ppo.update(config, net, optimizer, own, generator, _rl.Run())
    return losses, net.flat.detach().clone()


def test_a_member_pruned_at_epoch_1_leaves_and_the_others_finish_as_alone():
    reports: list[list[tuple[int, float]]] = [[] for _ in THREE]
    members = [
        Member(THREE[0], reporter(reports[0]), None),
        Member(THREE[1], reporter(reports[1], prune_at=1), None),
        Member(THREE[2], reporter(reports[2]), MemoryHandle(fails=True)),
    ]
    entries = ppo.adapter.train_fused(members, epochs=3, device=CPU, options=OPTIONS)
    assert isinstance(entries[1], optuna.TrialPruned)
    assert [e for e, _ in reports[1]] == [0, 1]  # it left at the epoch it was pruned
    assert isinstance(entries[2], OSError) and [e for e, _ in reports[2]] == [0]
    assert [e for e, _ in reports[0]] == [0, 1, 2]
    # The rows cut out of the group took nothing of the member that stayed.
    assert alone(THREE[0], 3) == (entries[0], reports[0])
    assert reports[1] == alone(THREE[1], 3)[1][:2]  # and the pruned one's scores were its own


def test_an_error_of_the_fused_step_ends_every_member_still_in_the_group(monkeypatch):
    real_step, calls = fused_ppo_group.GroupRun._gradient_step, []

    def failing(self: Any, stack: Any, rows: tuple, *args: Any) -> torch.Tensor:
        calls.append(len(stack.online))
        if len(stack.online) == 2:  # once a member has left, the step fails
            raise RuntimeError("out of memory")
        return real_step(self, stack, rows, *args)

    monkeypatch.setattr(fused_ppo_group.GroupRun, "_gradient_step", failing)
    reports: list[list[tuple[int, float]]] = [[] for _ in THREE]
    members = [
        Member(p, reporter(r, prune_at=0 if i == 0 else None), None)
        for i, (p, r) in enumerate(zip(THREE, reports, strict=True))
    ]
    entries = ppo.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert isinstance(entries[0], optuna.TrialPruned)  # its own ending stays its own
    assert [type(e) for e in entries[1:]] == [RuntimeError, RuntimeError]
    assert str(entries[1]) == "out of memory" and 3 in calls and calls[-1] == 2


def test_checkpoints_go_from_a_group_to_a_trial_alone_and_back():
    # A member's checkpoint, saved in a group, is the one its trial saves alone...
    handles = [MemoryHandle() for _ in THREE[:2]]
    members = [Member(p, lambda e, v: None, h) for p, h in zip(THREE[:2], handles, strict=True)]
    ppo.adapter.train_fused(members, epochs=1, device=CPU, options=OPTIONS)
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
    assert (value, reports) == alone(THREE[1], 2, MemoryHandle(by_itself.saved))
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
    entries = ppo.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert (entries[0], reports_in_group[0]) == resumed_alone
    assert [e for e, _ in reports_in_group[1]] == [0, 1]
    assert alone(THREE[2], 2) == (entries[1], reports_in_group[1])


def assert_same(one: Any, other: Any, where: str = "state") -> None:
    if isinstance(one, dict):
        assert one.keys() == other.keys(), where
        for key in one:
            assert_same(one[key], other[key], f"{where}[{key!r}]")
    elif isinstance(one, list | tuple):
        assert len(one) == len(other), where
        for k, (a, b) in enumerate(zip(one, other, strict=True)):
            assert_same(a, b, f"{where}[{k}]")
    elif isinstance(one, torch.Tensor):
        # Bit for bit on this CPU (docs/fused.md, "PPO's fused loop"); another CPU's products
        # may sum in another order: the equivalence rule's 1e-5 is the bound.
        torch.testing.assert_close(one, other, rtol=1e-5, atol=1e-8, msg=where)
    else:
        assert one == other, where


def test_fuse_key_is_the_shape_the_minibatch_and_the_rollout_length():
    key = ppo.adapter.fuse_key
    assert key(BASE) == key({**BASE, "gamma": 0.9, "update_epochs": 9, "learning_rate": 1e-5})
    assert key(BASE) != key({**BASE, "batch_size": 72})
    assert key(BASE) != key({**BASE, "hidden_size": 64})
    assert key(BASE) != key({**BASE, "rollout_steps": 41})
    # A rollout is never shorter than a minibatch: 32 and 40 steps of 8 for 320 are one length.
    longer = {**BASE, "batch_size": 320}
    assert key({**longer, "rollout_steps": 32}) == key({**longer, "rollout_steps": 40})
    bad = {**OPTIONS, "env": "NoSuchEnv-v0"}
    two = [Member(BASE, lambda e, v: None, None) for _ in range(2)]
    entries = ppo.adapter.train_fused(two, epochs=1, device=CPU, options=bad)
    assert [type(e).__name__ for e in entries] == ["UserError"] * 2  # as `train` raises it
    # The pool's group path fixes, for a group's other members, what the first's key reads.
    assert shape_of(ppo.adapter, BASE) == {"hidden_size": 32, "batch_size": 71, "rollout_steps": 40}
    with pytest.raises(ValueError, match="one fuse_key"):
        ppo.adapter.train_fused(
            [Member({**BASE, "batch_size": b}, lambda e, v: None, None) for b in (71, 128)],
            epochs=1, device=CPU, options=OPTIONS,
        )  # fmt: skip


def test_run_ppo_fuse_4_completes_every_trial_fused(sqlite_url):
    """The real command line, its trial processes and the study's storage."""
    done = run_cli(
        "run", "ppo", "--env", "CartPole-v1", "--trials", "4", "--epochs", "2", "--option",
        "steps_per_epoch=256", "--gpus", "none", "--fuse", "4", "--seed", "1",
        "--storage", sqlite_url, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = stored_study(sqlite_url, "ppo")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    groups: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for trial in study.trials:
        assert sorted(trial.intermediate_values) == [0, 1]  # its own report, every epoch
        groups.setdefault(trial.user_attrs["pid"], []).append(trial)
    for group in groups.values():
        numbers = {t.number for t in group}
        for trial in group:
            assert set(trial.user_attrs.get("fused_with", [])) == numbers - {trial.number}
        for name in ("hidden_size", "batch_size", "rollout_steps"):
            assert len({t.params[name] for t in group}) == 1, [t.params for t in group]
    assert max(len(group) for group in groups.values()) > 1, groups


def test_trading_members_keep_their_own_markets_and_folds_report_as_alone():
    """On the trading env each member trades under its own position limit, costs and hold
    penalty, and scores as it does alone; with folds each member reports its running mean
    after every fold, and a member pruned after a fold trains no further fold."""
    options = {**ppo.adapter.options, "steps_per_epoch": 320, "folds": 2}
    trading = {**ppo.adapter.default_params, "hidden_size": 32, "batch_size": 71}
    params = [
        {**trading, "max_position_absolute": 1, "transaction_cost_multiplier": 2.0,
         "hold_penalty_weight": 0.0},
        {**trading, "max_position_absolute": 7, "transaction_cost_multiplier": 0.5,
         "hold_penalty_weight": 1.5, "learning_rate": 1e-3, "update_epochs": 6},
        {**trading, "max_position_absolute": 3},
    ]  # fmt: skip
    reports: list[list[tuple[int, float]]] = [[] for _ in params]
    members = [
        Member(p, reporter(r, prune_at=0 if i == 2 else None), None)
        for i, (p, r) in enumerate(zip(params, reports, strict=True))
    ]
    entries = ppo.adapter.train_fused(members, epochs=1, device=CPU, options=options)
    assert isinstance(entries[2], optuna.TrialPruned) and [f for f, _ in reports[2]] == [0]
    for index in (0, 1):
        assert [f for f, _ in reports[index]] == [0, 1]  # a report per fold: the running mean
        assert alone(params[index], 1, options=options) == (entries[index], reports[index])
    assert reports[0] != reports[1]  # their own markets: not one member's run twice
