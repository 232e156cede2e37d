"""Population-based training's decisions (samplers._pbt_rules): exploit, explore, the schedule."""

from __future__ import annotations

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from samplers._pbt_rules import (
    Segment,
    Settings,
    default_interval,
    explore,
    free_members,
    next_segment,
    perturb,
    pick_member,
    quantiles,
)

LR = FloatDistribution(1e-5, 1e-1, log=True)
BATCH = IntDistribution(16, 512, log=True)
GAMMA = CategoricalDistribution([0.9, 0.95, 0.99, 0.999])
DISTS = {"lr": LR, "batch_size": BATCH, "gamma": GAMMA}


def seg(number, member, score, *, until=5, start=0, generation=0, state="complete", params=None):
    return Segment(
        number=number,
        member=member,
        generation=generation,
        start=start,
        until=until,
        state=state,
        score=score if state == "complete" else None,
        params=params or {"lr": 0.001 * (member + 1), "batch_size": 64, "gamma": 0.99},
        distributions=DISTS,
    )


SETTINGS = Settings(population=4, interval=5, epochs=20)


def test_quantiles_follow_ray_tunes_split():
    scores = {0: 3.0, 1: 1.0, 2: 4.0, 3: 2.0}
    assert quantiles(scores, 0.25) == ([2], [1])  # ceil(4 * 0.25) = 1 each side
    assert quantiles({0: 1.0, 1: 2.0}, 0.5) == ([1], [0])
    assert quantiles({m: float(m) for m in range(5)}, 0.5) == ([3, 4], [0, 1])  # at most half
    assert quantiles({0: 1.0}, 0.25) == ([], [])


def test_a_member_without_a_complete_segment_starts_fresh():
    plan = next_segment([seg(0, 1, 1.0)], 0, SETTINGS, np.random.default_rng(0))
    assert (plan.generation, plan.start, plan.until, plan.parent, plan.params) == (
        0,
        0,
        5,
        None,
        None,
    )


def test_a_middle_member_continues_from_its_own_checkpoint_with_its_own_params():
    segments = [seg(0, 0, 1.0), seg(1, 1, 2.0), seg(2, 2, 3.0), seg(3, 3, 4.0)]
    plan = next_segment(segments, 1, SETTINGS, np.random.default_rng(0))
    assert plan.parent == 1 and not plan.exploited
    assert (plan.generation, plan.start, plan.until) == (1, 5, 10)
    assert plan.params == dict(segments[1].params)


def test_the_bottom_member_copies_the_top_ones_checkpoint_and_perturbs_its_params():
    segments = [seg(0, 0, 1.0), seg(1, 1, 2.0), seg(2, 2, 3.0), seg(3, 3, 4.0)]
    for s in range(20):
        plan = next_segment(segments, 3, SETTINGS, np.random.default_rng(s))
        assert plan.exploited and plan.parent == 0  # member 0 is the only top one
        assert (plan.generation, plan.start, plan.until) == (1, 5, 10)
        assert plan.params is not None and plan.params != dict(segments[3].params)


def test_a_member_ranks_by_its_latest_complete_segment_and_failed_ones_retry_from_it():
    segments = [
        seg(0, 0, 9.0),  # member 0 was bad, then good
        seg(4, 0, 0.5, start=5, until=10, generation=1),
        seg(1, 1, 2.0),
        seg(2, 2, 3.0),
        seg(3, 3, 4.0),
        seg(5, 3, None, start=5, until=10, generation=1, state="failed"),
    ]
    plan = next_segment(segments, 3, SETTINGS, np.random.default_rng(1))
    assert plan.exploited and plan.parent == 4  # the top member's latest checkpoint (epoch 10)
    assert (plan.generation, plan.start, plan.until) == (2, 10, 15)


def test_the_last_segment_ends_at_the_last_epoch_and_a_finished_lineage_takes_up_the_best():
    settings = Settings(population=3, interval=8, epochs=20)
    segments = [seg(0, 0, 1.0, start=8, until=16, generation=1), seg(1, 1, 2.0, until=8)]
    assert next_segment(segments, 0, settings, np.random.default_rng(0)).until == 20
    done = [
        seg(0, 0, 1.0, start=16, until=20, generation=2),
        seg(1, 1, 3.0, until=8),
        seg(2, 2, 2.0, until=8),
    ]
    plan = next_segment(done, 0, settings, np.random.default_rng(0))
    assert plan.exploited and plan.parent == 2  # the best member that can still train
    assert (plan.generation, plan.start, plan.until) == (1, 8, 16)
    all_done = [done[0], seg(1, 1, 3.0, start=8, until=20, generation=1)]
    plan = next_segment(all_done, 0, settings, np.random.default_rng(0))
    assert plan.parent is None and plan.generation == 0 and plan.until == 8


def test_a_finished_lineage_is_never_copied():
    settings = Settings(population=2, interval=10, epochs=20)
    segments = [seg(0, 0, 0.1, start=10, until=20, generation=1), seg(1, 1, 5.0, until=10)]
    plan = next_segment(segments, 1, settings, np.random.default_rng(0))
    assert plan.parent == 1 and not plan.exploited  # nothing to copy that can still train


def test_free_members_are_those_with_nothing_running():
    segments = [seg(0, 0, 1.0), seg(1, 1, None, state="running"), seg(2, 2, None, state="failed")]
    assert free_members(segments, 4) == [0, 2, 3]


def test_perturb_scales_numbers_by_the_factors_inside_their_range():
    rng = np.random.default_rng(0)
    seen = {perturb(LR, 0.001, (1.2, 0.8), rng) for _ in range(50)}
    assert sorted(seen) == pytest.approx([0.0008, 0.0012])
    assert perturb(LR, 0.1, (1.2,), rng) == 0.1  # clipped at the top of its range
    assert {perturb(BATCH, 100, (1.2, 0.8), rng) for _ in range(50)} == {80, 120}
    assert perturb(BATCH, 512, (1.2,), rng) == 512


def test_a_small_integer_moves_one_step_instead_of_standing_still():
    small = IntDistribution(1, 8)
    rng = np.random.default_rng(0)
    assert perturb(small, 2, (1.2,), rng) == 3
    assert perturb(small, 2, (0.8,), rng) == 1
    stepped = IntDistribution(16, 256, step=16)
    assert perturb(stepped, 64, (1.2,), rng) == 80  # 76.8 snapped to the step
    assert perturb(stepped, 256, (1.2,), rng) == 256


def test_a_choice_moves_to_a_neighbour():
    rng = np.random.default_rng(0)
    seen = {perturb(GAMMA, 0.95, (1.2, 0.8), rng) for _ in range(50)}
    assert seen == {0.9, 0.99}
    assert {perturb(GAMMA, 0.999, (1.2, 0.8), rng) for _ in range(50)} == {0.99, 0.999}


def test_explore_resamples_with_its_probability_and_keeps_every_value_valid():
    params = {"lr": 0.001, "batch_size": 64, "gamma": 0.99}
    always = Settings(4, 5, 20, resample_probability=1.0)
    never = Settings(4, 5, 20, resample_probability=0.0)
    rng = np.random.default_rng(3)
    resampled = [explore(params, DISTS, always, rng) for _ in range(200)]
    lrs = [p["lr"] for p in resampled]
    assert min(lrs) < 1e-4 and max(lrs) > 1e-2  # drawn over the whole (log) range
    perturbed = [explore(params, DISTS, never, rng) for _ in range(50)]
    assert {p["batch_size"] for p in perturbed} <= {51, 77}
    for p in resampled + perturbed:
        for name, dist in DISTS.items():
            assert dist._contains(dist.to_internal_repr(p[name]))


def test_default_interval_is_a_quarter_of_the_epochs():
    assert [default_interval(e) for e in (1, 4, 10, 20)] == [1, 1, 3, 5]


def test_the_member_furthest_behind_goes_first_and_a_failed_one_before_its_equals():
    segments = [
        seg(0, 0, 1.0, until=10, start=5, generation=1),
        seg(1, 1, 2.0),
        seg(2, 2, 3.0),
        seg(3, 2, None, start=5, until=10, generation=1, state="failed"),
    ]
    rng = np.random.default_rng(0)
    assert {pick_member(segments, [0, 1, 2], rng) for _ in range(20)} == {2}
    assert {pick_member(segments, [0, 1, 3], rng) for _ in range(20)} == {3}  # never ran: 0 epochs
    assert {pick_member(segments, [0, 1], rng) for _ in range(20)} == {1}


def test_explore_never_changes_what_shapes_the_checkpoint():
    dists = {**DISTS, "hidden_size": CategoricalDistribution([64, 128, 256])}
    params = {"lr": 0.001, "batch_size": 64, "gamma": 0.99, "hidden_size": 128}
    always = Settings(4, 5, 20, resample_probability=1.0)
    rng = np.random.default_rng(0)
    assert {explore(params, dists, always, rng)["hidden_size"] for _ in range(50)} == {128}


def test_the_bottom_member_never_copies_a_donor_behind_it():
    """Workers at different speeds: the best member is a segment behind the worst one; copying
    it would train the same epochs again, so the bottom member goes on from its own."""
    segments = [
        seg(0, 0, 0.9, until=10, start=5, generation=1),  # bottom, at epoch 10
        seg(1, 1, 0.1, until=5),  # top, at epoch 5
        seg(2, 2, 0.5, until=10, start=5, generation=1),
        seg(3, 3, 0.6, until=10, start=5, generation=1),
    ]
    plan = next_segment(segments, 0, SETTINGS, np.random.default_rng(0))
    assert not plan.exploited and plan.parent == 0 and plan.start == 10
