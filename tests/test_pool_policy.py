"""The supervisor's decisions, driven as values: no processes, no sleeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.slots import SlotPolicy, after_trial, before_spawn, threads_per_trial


def _finish(policy, started_index, *, oom=False, slots_at_start=None):
    return after_trial(
        policy,
        oom=oom,
        started_index=started_index,
        slots_at_start=policy.slots if slots_at_start is None else slots_at_start,
    )


def test_starts_at_half_and_ramps_up_after_a_clean_first_wave():
    policy = SlotPolicy.start(10)
    assert policy.slots == 5
    for _ in range(5):
        policy = policy.trial_started()
    changes = []
    for index in range(5):
        policy, change = _finish(policy, index)
        changes.append(change)
    assert changes[:4] == [None] * 4
    assert (changes[4].from_slots, changes[4].to_slots, changes[4].reason) == (5, 10, "rampup")
    assert policy.slots == 10


def test_odd_plans_round_the_start_up():
    assert SlotPolicy.start(9).slots == 5
    assert SlotPolicy.start(1).slots == 1
    assert SlotPolicy.start(1).ramped
    with pytest.raises(ValueError):
        SlotPolicy.start(0)


def test_an_oom_halves_and_cancels_the_ramp_up():
    policy = SlotPolicy.start(10)
    for _ in range(5):
        policy = policy.trial_started()
    policy, change = _finish(policy, 0, oom=True)
    assert (change.from_slots, change.to_slots, change.reason) == (5, 2, "oom")
    for index in range(1, 4):
        policy, change = _finish(policy, index)
        assert change is None  # the first wave's jump to the plan is off after an OOM
    assert policy.slots == 2


def test_after_a_halving_two_clean_waves_earn_one_slot_back_up_to_the_plan():
    policy = SlotPolicy.start(8)  # 4 slots
    policy, change = _finish(policy, 0, oom=True)
    assert policy.slots == 2
    changes = []
    for index in range(1, 60):
        policy, change = _finish(policy, index)
        if change:
            changes.append((change.from_slots, change.to_slots, change.reason))
    # 2 slots need 4 clean trials, 3 need 6, and so on: additive increase, never past the plan.
    assert changes[:3] == [(2, 3, "rampup"), (3, 4, "rampup"), (4, 5, "rampup")]
    assert policy.slots == 8
    policy, change = _finish(policy, 60, oom=True)
    assert (change.from_slots, change.to_slots) == (8, 4)


def test_several_ooms_of_one_crowded_moment_halve_once():
    policy = SlotPolicy.start(16)  # 8 slots
    for _ in range(8):
        policy = policy.trial_started()
    policy, first = _finish(policy, 0, oom=True, slots_at_start=8)
    policy, second = _finish(policy, 1, oom=True, slots_at_start=8)
    assert first.to_slots == 4
    assert second is None
    assert policy.slots == 4
    policy, third = _finish(policy, 9, oom=True, slots_at_start=4)
    assert third.to_slots == 2


def test_falling_to_one_slot_is_a_degrade_and_never_below_one():
    policy = SlotPolicy.start(4)  # 2 slots
    policy, change = _finish(policy, 0, oom=True)
    assert (change.to_slots, change.reason) == (1, "degrade")
    policy, change = _finish(policy, 1, oom=True)
    assert change is None
    assert policy.slots == 1


def test_watchdog_halves_when_free_vram_is_under_ten_percent():
    policy = SlotPolicy.start(8)
    same, change = before_spawn(policy, free_mb=2400, total_mb=24000)
    assert change is None and same == policy
    policy, change = before_spawn(policy, free_mb=2000, total_mb=24000)
    assert (change.from_slots, change.to_slots, change.reason) == (4, 2, "watchdog")
    assert "2000 of 24000 MB" in change.detail
    unchanged, change = before_spawn(policy, free_mb=None, total_mb=None)
    assert change is None and unchanged == policy


def test_threads_share_the_cores():
    assert threads_per_trial(16, 4) == 4
    assert threads_per_trial(2, 8) == 1
    assert threads_per_trial(8, 0) == 8
    assert threads_per_trial(16, 2, cpu_bound=True) == 1


@given(
    max_slots=st.integers(1, 64),
    events=st.lists(st.tuples(st.booleans(), st.floats(0, 1)), max_size=60),
)
def test_slots_always_between_one_and_the_plan(max_slots, events):
    policy = SlotPolicy.start(max_slots)
    for index, (oom, free_fraction) in enumerate(events):
        policy = policy.trial_started()
        policy, _ = before_spawn(policy, free_mb=free_fraction * 1000, total_mb=1000)
        policy, _ = after_trial(policy, oom=oom, started_index=index, slots_at_start=policy.slots)
        assert 1 <= policy.slots <= max_slots
