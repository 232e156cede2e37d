"""Forecaster (`tft`) trials trained as one fused group (`tft.adapter.train_fused`,
adapters/_tft_fused.py; docs/fused_tft.md).

Real training on the synthetic price series at the smallest sizes (a width, window and depth of
the smallest search space, a few gradient steps an epoch): every member's every report is the one
it makes alone within the product's 1e-5; a pruned member leaves and the others still match; a
checkpoint goes from a group to a trial alone and back; and `run tft --fuse 4` through the real
command line and processes completes four fused trials.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

from adapters import _tft_fused, tft
from adapters.base import Member, parse_options
from orchestrator.record.checkpoints import files as stored
from orchestrator.run.trial.member import shape_of
from tests.cli_helpers import run_cli
from tests.waiting import stored_study

CPU = torch.device("cpu")
SMALL = ["steps=400", "max_width=16", "max_window=16", "max_depth=1"]
OPTIONS = parse_options(tft.adapter, SMALL)
BASE = {**tft.adapter.default_params, "batch_size": 64, "width": 16, "window": 16, "depth": 1}
# One shape, four learning rates and weight decays, no dropout: each member's run is its own.
FOUR = [
    {**BASE, "learning_rate": lr, "weight_decay": wd, "dropout": 0.0}
    for lr, wd in [(3e-3, 1e-4), (1e-3, 1e-2), (5e-3, 1e-6), (2e-4, 1e-3)]
]
RELATIVE = 1e-5  # the product's equivalence bar


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
    value = tft.adapter.train(
        params, epochs=epochs, device=CPU, options=OPTIONS, report=reporter(reports),
        checkpoint=checkpoint,
    )  # fmt: skip
    return value, reports


def assert_as_alone(entry: Any, reports: list, own: tuple[float, list]) -> None:
    """The same epochs reported, each value and the result within the product's 1e-5."""
    value, own_reports = own
    assert [e for e, _ in reports] == [e for e, _ in own_reports]
    for (_, fused), (_, single) in zip(reports, own_reports, strict=True):
        assert fused == pytest.approx(single, rel=RELATIVE)
    assert entry == pytest.approx(value, rel=RELATIVE)


def test_fuse_key_reads_the_shape_and_the_batch_size_only():
    drawn = {**FOUR[0], "dropout": 0.2}
    assert set(shape_of(tft.adapter, drawn)) == {"width", "depth", "window", "batch_size"}
    other = {**FOUR[3], "dropout": 0.1}  # another rate, decay and learning rate: same group
    assert tft.adapter.fuse_key(drawn) == tft.adapter.fuse_key(other)
    assert tft.adapter.fuse_key(drawn) != tft.adapter.fuse_key({**drawn, "window": 24})
    with pytest.raises(ValueError, match="one fuse_key"):
        members = [Member(p, reporter([]), None) for p in (FOUR[0], {**FOUR[1], "width": 32})]
        tft.adapter.train_fused(members, epochs=1, device=CPU, options=OPTIONS)


def test_every_member_of_four_reports_every_epoch_what_it_reports_alone():
    reports: list[list[tuple[int, float]]] = [[] for _ in FOUR]
    members = [Member(p, reporter(r), None) for p, r in zip(FOUR, reports, strict=True)]
    entries = tft.adapter.train_fused(members, epochs=3, device=CPU, options=OPTIONS)
    assert all(isinstance(e, float) and math.isfinite(e) for e in entries), entries
    assert [min(v for _, v in r) for r in reports] == entries  # the best epoch's value
    for params, entry, own in zip(FOUR, entries, reports, strict=True):
        assert_as_alone(entry, own, alone(params, 3))
    assert len(set(entries)) == 4  # four runs, not one run four times


def test_dropout_rates_are_each_members_own():
    """Members of different rates train together: a member without dropout is still its run
    alone, and a member's rate is applied to it (its run parts from its rate-0 twin's)."""
    rates = [0.0, 0.1, 0.3]
    group = [{**FOUR[0], "dropout": rate} for rate in rates]
    reports: list[list[tuple[int, float]]] = [[] for _ in group]
    members = [Member(p, reporter(r), None) for p, r in zip(group, reports, strict=True)]
    entries = tft.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert_as_alone(entries[0], reports[0], alone(group[0], 2))
    assert all(math.isfinite(e) for e in entries)
    assert reports[1] != reports[0] and reports[2] != reports[0]


def test_a_pruned_member_leaves_and_the_others_still_match_alone():
    reports: list[list[tuple[int, float]]] = [[] for _ in FOUR]
    members = [
        Member(FOUR[0], reporter(reports[0]), None),
        Member(FOUR[1], reporter(reports[1], prune_at=1), None),
        Member(FOUR[2], reporter(reports[2]), MemoryHandle(fails=True)),
        Member(FOUR[3], reporter(reports[3]), None),
    ]
    entries = tft.adapter.train_fused(members, epochs=3, device=CPU, options=OPTIONS)
    assert isinstance(entries[1], optuna.TrialPruned)
    assert [e for e, _ in reports[1]] == [0, 1]  # it left at the epoch it was pruned
    assert isinstance(entries[2], OSError) and [e for e, _ in reports[2]] == [0]
    for k in (0, 3):  # the rows cut out of the stack took nothing of the members that stayed
        assert_as_alone(entries[k], reports[k], alone(FOUR[k], 3))


def test_an_error_of_the_fused_step_ends_every_member_still_in_the_group(monkeypatch):
    real_step, sizes = _tft_fused._Group.step, []

    def failing(self: Any) -> None:
        sizes.append(len(self.runs))
        if len(self.runs) == 2:  # once a member has left, the step fails
            raise RuntimeError("out of memory")
        real_step(self)

    monkeypatch.setattr(_tft_fused._Group, "step", failing)
    members = [
        Member(p, reporter([], prune_at=0 if i == 0 else None), None)
        for i, p in enumerate(FOUR[:3])
    ]
    entries = tft.adapter.train_fused(members, epochs=2, device=CPU, options=OPTIONS)
    assert isinstance(entries[0], optuna.TrialPruned)  # its own ending stays its own
    assert [str(e) for e in entries[1:]] == ["out of memory"] * 2
    assert sizes[0] == 3 and sizes[-1] == 2


def test_checkpoints_go_from_a_group_to_a_trial_alone_and_back():
    # A member's checkpoint, saved in a group, is the one its trial saves alone...
    handles = [MemoryHandle() for _ in FOUR[:2]]
    members = [Member(p, reporter([]), h) for p, h in zip(FOUR[:2], handles, strict=True)]
    tft.adapter.train_fused(members, epochs=1, device=CPU, options=OPTIONS)
    by_itself = MemoryHandle()
    alone(FOUR[1], 1, by_itself)
    in_group, own = handles[1].load(), by_itself.load()
    assert handles[1].epochs == [0] and in_group is not None and own is not None
    assert in_group.keys() == own.keys()
    del in_group["torch"], own["torch"]  # the process's generator, not the member's own
    for name, tensor in own["model"].items():  # a row, not the group's whole stack
        saved = in_group["model"][name]
        assert saved.shape == tensor.shape
        if name.endswith("qkv.bias"):
            # The keys' bias has no gradient in exact arithmetic (softmax ignores a shift equal
            # over the keys): Adam scales its rounding noise to steps of about the learning
            # rate, alone as in a group, each its own. The other weights agree to float32.
            keys = slice(tensor.numel() // 3, 2 * tensor.numel() // 3)
            steps = 5 * FOUR[1]["learning_rate"]
            torch.testing.assert_close(saved[keys], tensor[keys], rtol=0, atol=steps)
            saved, tensor = saved[: keys.start], tensor[: keys.start]
        torch.testing.assert_close(saved, tensor, rtol=RELATIVE, atol=1e-7, msg=name)
    assert in_group["optimizer"]["param_groups"] == own["optimizer"]["param_groups"]
    assert torch.equal(in_group["stream"]["pending"], own["stream"]["pending"])
    assert in_group["best"] == pytest.approx(own["best"], rel=RELATIVE)
    # ... so the trial goes on alone from it, training only the epochs after it.
    whole = alone(FOUR[1], 3)
    value, reports = alone(FOUR[1], 3, MemoryHandle(handles[1].saved))
    assert_as_alone(value, reports, (whole[0], whole[1][1:]))
    # A member whose checkpoint holds its last epoch trains nothing more: its value is its best.
    done: list[tuple[int, float]] = []
    members = [
        Member(FOUR[1], reporter(done), MemoryHandle(handles[1].saved)),
        Member(FOUR[0], reporter([]), None),
    ]
    entries = tft.adapter.train_fused(members, epochs=1, device=CPU, options=OPTIONS)
    assert done == [] and entries[0] == in_group["best"][0]
    # And a group goes on from a trial's checkpoint: that member trains epochs 1 and 2 while a
    # fresh member beside it trains 0, 1 and 2, each as it would alone.
    saved_alone = MemoryHandle()
    alone(FOUR[0], 1, saved_alone)
    reports_in_group: list[list[tuple[int, float]]] = [[], []]
    members = [
        Member(FOUR[0], reporter(reports_in_group[0]), MemoryHandle(saved_alone.saved)),
        Member(FOUR[2], reporter(reports_in_group[1]), None),
    ]
    entries = tft.adapter.train_fused(members, epochs=3, device=CPU, options=OPTIONS)
    resumed = alone(FOUR[0], 3, MemoryHandle(saved_alone.saved))
    assert [e for e, _ in reports_in_group[0]] == [1, 2]
    assert_as_alone(entries[0], reports_in_group[0], resumed)
    assert_as_alone(entries[1], reports_in_group[1], alone(FOUR[2], 3))


def test_run_tft_fuse_4_through_the_command_line(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    options = [arg for option in SMALL for arg in ("--option", option)]
    done = run_cli(
        "run", "tft", "--trials", "4", "--fuse", "4", "--epochs", "2", *options,
        "--gpus", "none", "--pruner", "none", "--storage", url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = stored_study(url, "tft")
    assert len(study.trials) == 4
    assert all(t.state == TrialState.COMPLETE for t in study.trials), study.trials
    numbers = {t.number for t in study.trials}
    for trial in study.trials:
        partners = set(trial.user_attrs.get("fused_with", []))
        assert partners and partners <= numbers - {trial.number}, trial.user_attrs
        assert sorted(trial.intermediate_values) == [0, 1]
        assert trial.value == min(trial.intermediate_values.values())
        group = [t for t in study.trials if t.number in partners]
        for name in ("width", "depth", "window", "batch_size"):  # the group's fuse_key
            assert {t.params[name] for t in group} == {trial.params[name]}
