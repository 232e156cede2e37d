"""The out-of-memory policy as pure decisions: how a trial is run again, and what its GPU learns."""

from __future__ import annotations

import pytest

from adapters.base import MemoryModel
from orchestrator.planning.footprint import Footprint
from orchestrator.run.oom_policy import (
    OomAdmitted,
    OomRetry,
    after_oom,
    group_after_oom,
    retry_after_oom,
)
from orchestrator.run.pool.admission import Budget

DECLARED = MemoryModel(model_overhead_mb=500.0, per_sample_mb=2.0)


@pytest.mark.parametrize(
    ("batch", "alone", "expected"),
    [
        (1000, True, OomRetry(True, batch_size=500, batch_limit=999)),  # half, below the limit
        (100, True, OomRetry(True, batch_size=64, batch_limit=99)),  # never under the smallest
        (64, True, OomRetry(False, batch_limit=64)),  # the smallest did not fit: no re-run
        (1000, False, OomRetry(True)),  # crowded out: the same parameters, no limit
        (None, True, OomRetry(True)),  # no batch size to lower
    ],
)
def test_how_a_trial_that_ran_out_of_memory_runs_again(batch, alone, expected):
    assert retry_after_oom(batch, 64, alone=alone) == expected


def _admitted(allowance_mb: float, index: int = 0) -> OomAdmitted:
    return OomAdmitted(number=3, batch_size=1000, planned_mb=2500.0, room_mb=3000.0,
                       admitted_index=index, allowance_mb=allowance_mb)  # fmt: skip


def test_an_oom_raises_the_estimate_and_halves_the_allowance_once_per_crowded_moment():
    footprint = Footprint(DECLARED, "declared")
    budget = Budget.start(16000.0, 8)  # half of the usable memory to start
    assert budget.allowance_mb == 8000.0

    learnt, budget, change = after_oom(footprint, budget, _admitted(8000.0), learn=True)
    assert learnt.planned_mb(1000) > footprint.planned_mb(1000) >= 2500.0  # above the room
    assert (change.reason, change.from_mb, change.to_mb) == ("oom", 8000.0, 4000.0)
    assert "trial 3 ran out of memory with batch size 1000" in change.detail

    # A second OOM of the same moment (admitted under 8000 MB, cut already): no second cut.
    _, again, change = after_oom(learnt, budget, _admitted(8000.0, index=1), learn=True)
    assert change is None and again.allowance_mb == 4000.0


def test_without_learning_the_estimate_stays_and_the_allowance_still_reacts():
    footprint = Footprint(DECLARED, "declared")
    kept, budget, change = after_oom(footprint, Budget.start(16000.0, 8), _admitted(8000.0),
                                     learn=False)  # fmt: skip
    assert kept == footprint and change is not None and budget.allowance_mb == 4000.0


@pytest.mark.parametrize(
    ("members", "cap", "expected"),
    [
        (1, None, None),  # a trial alone: the single trial's rule, no group cap
        (8, None, 4),  # halved
        (3, None, 1),
        (2, 4, 1),
        (8, 2, 2),  # a cap already lower stays
    ],
)
def test_a_fused_group_that_ran_out_of_memory_is_split_in_halves(members, cap, expected):
    assert group_after_oom(members, cap) == expected
