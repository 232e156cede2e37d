"""Admission by bytes and the learnt footprint, driven as values: no processes, no sleeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.base import MemoryModel
from orchestrator.planning.cpu_cores import threads_per_trial
from orchestrator.planning.footprint import (
    OOM_MARGIN,
    WORST_QUANTILE,
    Footprint,
    observe_oom,
    observe_peak,
)
from orchestrator.run.pool.admission import (
    PASS_OVER_LIMIT,
    RECOVERY_TRIALS,
    Budget,
    admit,
    after_trial,
    before_admit,
    next_to_admit,
)

GPU_MB = 10_000.0  # total; 8,000 usable


def _budget(max_trials: int = 8) -> Budget:
    return Budget.start(8_000.0, max_trials)


def _admit(budget, planned, running, free=None, worst=None):
    return admit(
        budget,
        planned_mb=planned,
        worst_mb=planned if worst is None else worst,
        running_mb=running,
        free_mb=free,
        total_mb=GPU_MB,
    )


# --- the budget -------------------------------------------------------------------------------


def test_it_starts_with_half_the_usable_memory_and_ramps_up_after_a_clean_first_wave():
    budget = _budget()
    assert budget.allowance_mb == 4_000.0 and not budget.ramped
    for _ in range(3):
        budget = budget.trial_admitted()  # three trials admitted before the first one finished
    changes = []
    for index in range(3):
        budget, change = after_trial(
            budget,
            oom=False,
            admitted_index=index,
            allowance_at_admission=4_000.0,
            planned_mb=1_000,
        )
        changes.append(change)
    assert changes[:2] == [None, None]
    assert (changes[2].from_mb, changes[2].to_mb, changes[2].reason) == (4_000.0, 8_000.0, "rampup")
    assert budget.allowance_mb == 8_000.0 and budget.ramped


def test_one_trial_at_a_time_has_nothing_to_ramp():
    budget = Budget.start(8_000.0, 1)
    assert budget.allowance_mb == 8_000.0 and budget.ramped
    with pytest.raises(ValueError):
        Budget.start(8_000.0, 0)


@pytest.mark.parametrize(
    ("planned", "worst", "running", "free", "admitted", "why"),
    [
        (3_000.0, None, [], None, True, "alone on the GPU"),
        (9_000.0, None, [], None, True, "alone on the GPU"),  # never a deadlock: alone, it runs
        (1_000.0, None, [2_000.0], None, True, "1000 MB fits in 2000 MB"),
        (2_500.0, None, [2_000.0], None, False, "2500 MB does not fit in 2000 MB yet"),
        # What may happen at worst must fit in what is really free, less 5% of the GPU (500 MB).
        (1_500.0, 4_000.0, [2_000.0], 5_000.0, True, "1500 MB fits in 2000 MB"),
        (
            1_500.0,
            4_800.0,
            [2_000.0],
            5_000.0,
            False,
            "its worst case, 4800 MB, does not fit in 4500 MB free",
        ),
        (100.0, None, [10.0] * 8, None, False, "8 trials at once at most"),
    ],
)
def test_admission_by_bytes(planned, worst, running, free, admitted, why):
    decision = _admit(_budget(), planned, running, free, worst)
    assert (decision.admit, decision.reason) == (admitted, why)


def test_an_oom_halves_the_allowance_once_per_crowded_moment():
    budget = Budget(8_000.0, 8, 8_000.0, ramped=True, admitted=4, first_wave=4)
    budget, change = after_trial(
        budget, oom=True, admitted_index=2, allowance_at_admission=8_000.0, planned_mb=1_000
    )
    assert (change.from_mb, change.to_mb, change.reason) == (8_000.0, 4_000.0, "oom")
    # A second OOM of a trial admitted under the old allowance says nothing new.
    budget, change = after_trial(
        budget, oom=True, admitted_index=3, allowance_at_admission=8_000.0, planned_mb=1_000
    )
    assert change is None and budget.allowance_mb == 4_000.0


def test_cuts_stop_at_one_trial_and_say_for_how_long():
    budget = Budget(8_000.0, 8, 3_000.0, ramped=True, admitted=2, first_wave=2)
    budget, change = after_trial(
        budget, oom=True, admitted_index=1, allowance_at_admission=3_000.0, planned_mb=2_000
    )
    assert change.reason == "degrade" and budget.allowance_mb == 2_000.0
    assert f"one trial at a time until {RECOVERY_TRIALS} run clean" in change.detail
    budget, change = after_trial(
        budget, oom=True, admitted_index=2, allowance_at_admission=2_000.0, planned_mb=2_000
    )
    assert change is None and budget.allowance_mb == 2_000.0


def test_clean_trials_earn_memory_back_an_eighth_at_a_time():
    budget = Budget(8_000.0, 8, 2_000.0, ramped=True, admitted=10, first_wave=2)
    changes = []
    for index in range(RECOVERY_TRIALS):
        budget, change = after_trial(
            budget, oom=False, admitted_index=index, allowance_at_admission=2_000.0, planned_mb=1
        )
        changes.append(change)
    assert changes[:-1] == [None] * (RECOVERY_TRIALS - 1)
    assert (changes[-1].from_mb, changes[-1].to_mb) == (2_000.0, 3_000.0)


def test_the_watchdog_halves_when_free_memory_runs_low():
    budget = Budget(8_000.0, 8, 8_000.0, ramped=True)
    same, change = before_admit(budget, free_mb=1_500.0, total_mb=GPU_MB, floor_mb=500.0)
    assert change is None and same == budget
    budget, change = before_admit(budget, free_mb=900.0, total_mb=GPU_MB, floor_mb=500.0)
    assert (change.to_mb, change.reason) == (4_000.0, "watchdog")
    assert before_admit(budget, free_mb=None, total_mb=None, floor_mb=1.0)[1] is None


@given(
    st.lists(
        st.tuples(st.floats(1, 9_000), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_the_allowance_stays_within_one_trial_and_the_usable_memory(events):
    budget = Budget.start(8_000.0, 8)
    for index, (planned, oom) in enumerate(events):
        budget = budget.trial_admitted()
        budget, _ = after_trial(
            budget,
            oom=oom,
            admitted_index=index,
            allowance_at_admission=budget.allowance_mb,
            planned_mb=planned,
        )
        assert 0 < budget.allowance_mb <= budget.usable_mb


# --- who goes next ----------------------------------------------------------------------------


def test_first_come_first_served_with_a_bounded_pass_over():
    budget = Budget(8_000.0, 8, 8_000.0, ramped=True)
    running = [5_000.0]
    # A large trial first in line does not fit yet; a small one behind it may go ahead.
    waiting = [(4_000.0, 4_000.0, 0), (1_000.0, 1_000.0, 0)]
    assert next_to_admit(waiting, budget, running_mb=running, free_mb=None, total_mb=GPU_MB) == 1
    # Passed over enough, it holds the line until it fits.
    waiting = [(4_000.0, 4_000.0, PASS_OVER_LIMIT), (1_000.0, 1_000.0, 0)]
    assert next_to_admit(waiting, budget, running_mb=running, free_mb=None, total_mb=GPU_MB) is None
    # And it fits, at the latest, when the GPU is empty.
    assert next_to_admit(waiting, budget, running_mb=[], free_mb=None, total_mb=GPU_MB) == 0


# --- the footprint ----------------------------------------------------------------------------


DECLARED = MemoryModel(500.0, 0.5)


def test_a_footprint_starts_as_declared_and_scales_by_what_a_trial_really_used():
    footprint = Footprint(DECLARED, "declared")
    assert footprint.planned_mb(1000) == 1000.0 and not footprint.learnt
    learnt = observe_peak(footprint, 1000, 3000.0)  # 3x the estimate
    assert learnt.planned_mb(1000) == pytest.approx(3000.0)
    assert learnt.planned_mb(2000) == pytest.approx(4500.0)
    assert learnt.describe() == "learnt from 1 trial peak"


def test_an_estimate_that_was_too_cautious_comes_down():
    footprint = Footprint(DECLARED, "declared")
    for batch in (100, 200, 400, 800, 1600):
        footprint = observe_peak(footprint, batch, 0.4 * DECLARED.planned_mb(batch))
    assert footprint.planned_mb(1000) == pytest.approx(400.0)


def test_trials_that_vary_are_expected_at_the_median_and_feared_at_a_high_quantile():
    footprint = Footprint(DECLARED, "declared")
    ratios = [1.0 + i / 100 for i in range(100)] + [5.0]  # one outlier among 101
    for ratio in ratios:
        footprint = observe_peak(footprint, 1000, ratio * 1000.0)
    assert footprint.planned_mb(1000) == pytest.approx(1500.0, rel=0.01)
    assert footprint.worst_mb(1000) == pytest.approx(1750.0, rel=0.01)  # not the outlier's 5000


def test_an_oom_raises_the_estimate_above_the_room_it_did_not_fit_in():
    footprint = Footprint(DECLARED, "declared")
    raised = observe_oom(footprint, 1000, room_mb=2000.0)
    assert raised.planned_mb(1000) == pytest.approx(2000.0 * OOM_MARGIN)
    assert raised.planned_mb(1000) > 2000.0  # never admitted into the same room again
    model = raised.effective_model()
    assert model.planned_mb(1000) >= raised.planned_mb(1000) - 1e-9


@given(st.lists(st.tuples(st.integers(64, 4096), st.floats(1.0, 50_000.0)), max_size=30))
def test_the_worst_case_covers_most_of_the_peaks_it_learnt_from(peaks):
    import math

    footprint = Footprint(DECLARED, "declared")
    for batch, peak in peaks:
        footprint = observe_peak(footprint, batch, peak)
    covered = sum(footprint.worst_mb(batch) >= peak * (1 - 1e-9) for batch, peak in peaks)
    assert covered >= math.ceil(WORST_QUANTILE * len(peaks))


def test_cpu_bound_trials_run_one_thread_each():
    assert threads_per_trial(16, 4, cpu_bound=True) == 1
    assert threads_per_trial(16, 4) == 4
    assert threads_per_trial(2, 8) == 1


def test_a_cpu_has_no_memory_to_guard_and_nothing_to_ramp():
    import math

    budget = Budget.start(math.inf, 2)
    assert budget.ramped and budget.allowance_mb == math.inf
    budget, change = after_trial(
        budget.trial_admitted(),
        oom=False,
        admitted_index=0,
        allowance_at_admission=math.inf,
        planned_mb=300.0,
    )
    assert change is None
