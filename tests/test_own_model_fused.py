"""The docs' own-model example fused (docs/own-model.md, "Fuse small trials"): its
`train_fused` trains each member as `train` trains it alone, and `run my_mlp --fuse 4` through
the pool makes four trials of one process, each its own.

Why a relative tolerance of 1e-5 and not equality: a member's gradient in the fused step is
summed in another order than alone (batched products over the members, its rows padded with
zeros to the largest batch), so it differs in float32's last bits, and Adam carries that on.
Measured over 2 to 10 epochs, widths 16 to 256, batch sizes 64 to 4096: at most 2.3e-7 apart,
most members bit for bit. The members of the group below end more than 100 times that apart,
so a member trained with another's learning rate, batch size or order fails the test.
"""

from __future__ import annotations

import sys
import tomllib
from itertools import pairwise
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from adapters.base import Member
from tests.cli_helpers import cli_env, run_cli
from tests.waiting import stored_study

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_model_adapter"
TOLERANCE = 1e-5
OPTIONS = {"samples": 1024, "seed": 0}  # 819 training rows: batches of 64 to all of them
# One width (fuse_key), each member its own learning rate and batch size; 100 and 700 leave a
# short last batch, 4096 is the whole training set in one batch.
GROUP = [
    {"learning_rate": lr, "batch_size": batch, "hidden": 24}
    for lr, batch in ((1e-3, 64), (5e-3, 100), (2e-2, 700), (8e-2, 4096))
]


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from my_model_fused import adapter

        yield adapter
    finally:
        sys.path.remove(str(EXAMPLE))


def _alone(adapter, params, epochs: int, options=OPTIONS) -> tuple[float, dict[int, float]]:
    curve: dict[int, float] = {}
    value = adapter.train(
        params, epochs=epochs, device=torch.device("cpu"), options=options,
        report=curve.__setitem__,
    )  # fmt: skip
    return value, curve


def _fused(adapter, group, epochs: int, prune_at=None):
    """Every member's entry and curve; members in `prune_at` (index -> epoch) are pruned there."""
    curves: list[dict[int, float]] = [{} for _ in group]

    def reporter(index):
        def report(epoch, value):
            curves[index][epoch] = value
            if (prune_at or {}).get(index) == epoch:
                raise optuna.TrialPruned(f"pruned at epoch {epoch}")

        return report

    members = [Member(params, reporter(i), None) for i, params in enumerate(group)]
    entries = adapter.train_fused(
        members, epochs=epochs, device=torch.device("cpu"), options=OPTIONS
    )
    return entries, curves


def _assert_as_alone(value, curve, alone_value, alone_curve):
    assert sorted(curve) == sorted(alone_curve)
    for epoch, reported in alone_curve.items():
        assert curve[epoch] == pytest.approx(reported, rel=TOLERANCE), epoch
    assert value == pytest.approx(alone_value, rel=TOLERANCE)


def test_each_member_of_a_group_of_four_trains_as_it_does_alone(example):
    assert {example.fuse_key(params) for params in GROUP} == {24}  # one group
    entries, curves = _fused(example, GROUP, epochs=2)
    alone = [_alone(example, params, epochs=2) for params in GROUP]
    for entry, curve, (value, alone_curve) in zip(entries, curves, alone, strict=True):
        _assert_as_alone(entry, curve, value, alone_curve)
    values = sorted(value for value, _ in alone)
    assert all(b - a > 100 * TOLERANCE * a for a, b in pairwise(values)), values


def test_a_group_of_one_is_train_itself(example):
    entries, curves = _fused(example, GROUP[:1], epochs=2)
    value, curve = _alone(example, GROUP[0], epochs=2)
    assert entries == [value] and curves == [curve]  # exactly: the same call
    entries, curves = _fused(example, GROUP[:1], epochs=2, prune_at={0: 0})
    assert isinstance(entries[0], optuna.TrialPruned) and sorted(curves[0]) == [0]


def test_a_pruned_member_leaves_and_the_others_train_on_as_alone(example):
    entries, curves = _fused(example, GROUP, epochs=3, prune_at={1: 1})
    assert isinstance(entries[1], optuna.TrialPruned)
    assert sorted(curves[1]) == [0, 1]  # it reported epoch 1, was pruned there, trained no more
    first_two = _alone(example, GROUP[1], epochs=2)[1]
    for epoch in (0, 1):
        assert curves[1][epoch] == pytest.approx(first_two[epoch], rel=TOLERANCE)
    for index in (0, 2, 3):
        _assert_as_alone(entries[index], curves[index], *_alone(example, GROUP[index], 3))


def test_run_my_mlp_fuse_4_gives_four_trials_each_its_own(example, tmp_path):
    """Through the CLI and the pool, real processes: the adapter that `my_mlp` names in the
    example's pyproject.toml, loaded by its `module:attribute` as the installed entry point
    loads it (tests/test_user_adapters.py installs the package itself)."""
    pyproject = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["orchestrator.adapters"]["my_mlp"]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "--adapter-path", target, "--study", "my_mlp", "--trials", "4", "--fuse", "4",
        "--epochs", "2", "--gpus", "none", "--quiet", "--storage", storage, cwd=tmp_path,
        env=cli_env(PYTHONPATH=f"{ROOT}:{EXAMPLE}"), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = stored_study(storage, "my_mlp").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    numbers = {t.number for t in trials}
    options = {"samples": 4096, "seed": 0}  # the adapter's defaults, as the run had them
    for trial in trials:
        assert set(trial.user_attrs.get("fused_with", [])) == numbers - {trial.number}
        assert trial.params["hidden"] == trials[0].params["hidden"]  # fuse_key fixed for all
        value, curve = _alone(example, trial.params, epochs=2, options=options)
        _assert_as_alone(trial.value, trial.intermediate_values, value, curve)
    assert len({t.params["learning_rate"] for t in trials}) == 4  # drawn each its own
