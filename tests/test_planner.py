"""The planner: four model and GPU cases, its invariants over wide inputs, and whole-node plans."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planning.cpu_cores import (
    _cgroup_quota_cores,
    cores_from_quota,
    share_cores,
    usable_cpu_cores,
)
from orchestrator.planning.hardware_budget import SAFETY_MARGIN, HardwareBudget, HyperoptStrategy
from orchestrator.planning.planner import NodePlan, plan_node

DQN = MemoryModel(300.0, 0.0002)
TFT = MemoryModel(2000.0, 0.05)
L4_MB = 24576
H100_MB = 81920


def gpu(index: int, total_mb: float, name: str | None = None) -> Device:
    return Device(
        index=index, name=name or f"GPU {total_mb:g}", uuid=f"GPU-{index}", total_mb=total_mb
    )


# --- the four cases: a tiny and a large model on an L4, the CPU, an H100 ----------------------


def test_tiny_model_high_concurrency_on_l4() -> None:
    strategy = HardwareBudget(L4_MB).plan_hyperopt(300.0, 0.0002, 64.0, 4096.0, 20)
    assert 10 <= strategy.max_concurrent_trials <= 20


def test_large_model_low_concurrency_on_l4() -> None:
    strategy = HardwareBudget(L4_MB).plan_hyperopt(2000.0, 0.05, 64.0, 4096.0, 20)
    assert 1 <= strategy.max_concurrent_trials <= 9


def test_cpu_only_is_sequential() -> None:
    strategy = HardwareBudget.cpu_only().plan_hyperopt(300.0, 0.0002, 64.0, 4096.0, 20)
    assert strategy.max_concurrent_trials == 1
    assert strategy.batch_size_bounds == (64.0, 4096.0)


def test_h100_maxes_out_the_swarm() -> None:
    strategy = HardwareBudget(H100_MB).plan_hyperopt(300.0, 0.0002, 64.0, 4096.0, 20)
    assert strategy.max_concurrent_trials == 20


def test_the_formula_by_hand() -> None:
    # 24576 x 0.8 = 19660.8 usable; 2000 + 64 x 0.05 = 2003.2 per trial -> 9 fit;
    # 19660.8 / 9 - 2000 = 184.53 MB for the batch -> 3690 samples.
    strategy = HardwareBudget(L4_MB).plan_hyperopt(2000.0, 0.05, 64, 4096, 20)
    assert strategy == HyperoptStrategy(
        9, (64, 3690), pytest.approx(2003.2), pytest.approx(9 * 2003.2)
    )


@pytest.mark.parametrize(
    "args",
    [
        (-1.0, 0.1, 64, 4096, 20),
        (1.0, -0.1, 64, 4096, 20),
        (1.0, 0.1, 0, 4096, 20),
        (1.0, 0.1, 64, 32, 20),
        (1.0, 0.1, 64, 4096, 0),
    ],
)
def test_bad_inputs_are_refused(args: tuple) -> None:
    with pytest.raises(ValueError):
        HardwareBudget(L4_MB).plan_hyperopt(*args)


# --- invariants over wide inputs --------------------------------------------------------------

vram = st.floats(min_value=0.0, max_value=2_000_000.0, allow_nan=False)
overhead = st.floats(min_value=0.0, max_value=100_000.0, allow_nan=False)
per_sample = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)
batches = st.tuples(st.integers(1, 100_000), st.integers(0, 100_000)).map(
    lambda t: (t[0], t[0] + t[1])
)
swarm = st.integers(1, 500)


@settings(max_examples=300, deadline=None)
@given(vram, overhead, per_sample, batches, swarm)
def test_every_slot_at_the_upper_bound_fits_the_budget(mb, over, each, bounds, size) -> None:
    budget = HardwareBudget(mb)
    assume(mb > 0 and over + bounds[0] * each <= budget.available_mb)  # one trial fits at all
    strategy = budget.plan_hyperopt(over, each, bounds[0], bounds[1], size)
    upper = strategy.batch_size_bounds[1]
    used = strategy.max_concurrent_trials * (over + upper * each)
    assert used <= mb * (1 - SAFETY_MARGIN) * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(vram, overhead, per_sample, batches, swarm)
def test_bounds_are_ordered_and_inside_the_static_range(mb, over, each, bounds, size) -> None:
    strategy = HardwareBudget(mb).plan_hyperopt(over, each, bounds[0], bounds[1], size)
    low, high = strategy.batch_size_bounds
    assert bounds[0] == low <= high <= bounds[1]
    assert 1 <= strategy.max_concurrent_trials <= size


@settings(max_examples=300, deadline=None)
@given(vram, st.floats(min_value=0.0, max_value=1_000_000.0), overhead, per_sample, batches, swarm)
def test_more_vram_never_plans_fewer_slots(mb, extra, over, each, bounds, size) -> None:
    small = HardwareBudget(mb).plan_hyperopt(over, each, bounds[0], bounds[1], size)
    large = HardwareBudget(mb + extra).plan_hyperopt(over, each, bounds[0], bounds[1], size)
    assert large.max_concurrent_trials >= small.max_concurrent_trials


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=1.0, max_value=200_000.0), min_size=1, max_size=8),
    overhead,
    per_sample,
    st.integers(1, 256),
    st.booleans(),
    swarm,
    st.one_of(st.none(), st.integers(1, 64)),
)
def test_node_plans_respect_cpu_user_and_vram(
    sizes, over, each, cores, cpu_bound, size, user
) -> None:
    devices = [gpu(i, mb) for i, mb in enumerate(sizes)]
    plan = plan_node(
        devices,
        MemoryModel(over, each),
        cpu_bound=cpu_bound,
        cpu_cores=cores,
        swarm_size=size,
        concurrency=user,
    )
    assert len(plan.gpus) == len(devices)
    if cpu_bound:
        assert plan.total_slots <= max(cores, len(devices))
    for one in plan.gpus:
        assert 1 <= one.slots <= one.strategy.max_concurrent_trials
        if user is not None:
            assert one.slots <= user
        low, high = one.batch_bounds
        assert 64 == low <= high <= 4096
        assert one.limited_by in ("vram", "swarm", "cpu", "user", "budget")
        if one.fits:  # one trial at the upper batch fits the usable VRAM alone
            assert one.largest_trial_mb <= one.usable_mb * (1 + 1e-9)
            if high < 4096:  # and the bound is the largest that does
                assert one.memory_model.planned_mb(high + 1) > one.usable_mb


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=10), st.integers(1, 300))
def test_cores_are_shared_fairly(wants, cores) -> None:
    shares = share_cores(wants, cores)
    assert all(1 <= got <= want for got, want in zip(shares, wants, strict=True))
    assert sum(shares) <= max(cores, len(wants))
    if sum(wants) <= cores:
        assert shares == wants
    short = [got for got, want in zip(shares, wants, strict=True) if got < want]
    if short:  # nobody left wanting got more than one core above anyone else left wanting
        assert sum(shares) == max(cores, len(wants))
        assert max(short) - min(short) <= 1
        assert all(got <= min(short) + 1 for got in shares)


# --- whole nodes ------------------------------------------------------------------------------


def test_two_gpus_of_different_sizes_get_different_plans() -> None:
    plan = plan_node([gpu(0, 24576), gpu(1, 49152)], TFT, cpu_bound=False, cpu_cores=2)
    small, large = plan.gpus
    assert (small.slots, large.slots) == (9, 19)  # 2,003.2 MB at the smallest batch
    # Both fit the whole range alone: 2000 + 4096 x 0.05 = 2,204.8 MB.
    assert small.batch_bounds == large.batch_bounds == (64, 4096)
    assert small.limited_by == large.limited_by == "vram"
    assert plan.total_slots == 28
    assert small.as_dict()["at_once"] == {"smallest": 9, "typical": 9, "largest": 8}


def test_a_large_model_is_bounded_by_what_fits_alone() -> None:
    model = MemoryModel(1500.0, 10.0)  # 10 MB per sample
    (one,) = plan_node([gpu(0, 24576)], model, cpu_bound=False, cpu_cores=2).gpus
    # (19,660.8 - 1,500) / 10 = 1,816 samples fit one trial alone; 9 of the smallest fit at once.
    assert one.batch_bounds == (64, 1816)
    assert one.slots == 9
    assert one.trials_at_once(one.largest_trial_mb) == 1


def test_the_study_s_budget_caps_the_trials_at_once() -> None:
    (one,) = plan_node([gpu(0, 81920)], DQN, cpu_bound=False, cpu_cores=2, budget_trials=12).gpus
    assert (one.slots, one.limited_by) == (12, "budget")
    (cpu,) = plan_node([], DQN, cpu_bound=True, cpu_cores=16, budget_trials=3).gpus
    assert (cpu.slots, cpu.limited_by) == (3, "budget")


def test_no_gpu_gives_cpu_bound_work_a_slot_per_core() -> None:
    (only,) = plan_node([], DQN, cpu_bound=True, cpu_cores=16).gpus
    assert only.device is None and only.slots == 16 and only.limited_by == "cpu"
    assert only.batch_bounds == (64, 4096)
    assert only.fits
    (capped,) = plan_node([], DQN, cpu_bound=True, cpu_cores=16, concurrency=8).gpus
    assert (capped.slots, capped.limited_by) == (8, "user")
    (swarm,) = plan_node([], DQN, cpu_bound=True, cpu_cores=16, swarm_size=4).gpus
    assert (swarm.slots, swarm.limited_by) == (4, "swarm")


def test_no_gpu_runs_other_work_one_at_a_time() -> None:
    (only,) = plan_node([], DQN, cpu_bound=False, cpu_cores=16, concurrency=8).gpus
    assert only.slots == 1 and only.limited_by == "no gpu"


def test_cpu_bound_work_is_capped_by_cores_and_shared() -> None:
    devices = [gpu(0, H100_MB), gpu(1, H100_MB), gpu(2, L4_MB)]
    plan = plan_node(devices, DQN, cpu_bound=True, cpu_cores=7)
    assert [g.slots for g in plan.gpus] == [3, 2, 2]
    assert all(g.limited_by == "cpu" for g in plan.gpus)
    assert all(g.strategy.max_concurrent_trials == 20 for g in plan.gpus)
    # The same work, GPU-bound, ignores the cores.
    free = plan_node(devices, DQN, cpu_bound=False, cpu_cores=7)
    assert [g.slots for g in free.gpus] == [20, 20, 20]
    assert [g.limited_by for g in free.gpus] == ["swarm"] * 3


def test_a_cap_on_trials_at_once_never_shrinks_the_batch_range() -> None:
    model = MemoryModel(1000.0, 1.0)  # 1 MB per sample: the batch bound is VRAM-bound
    vram_only = plan_node([gpu(0, 40960)], model, cpu_bound=False, cpu_cores=1)
    capped = plan_node([gpu(0, 40960)], model, cpu_bound=True, cpu_cores=4)
    assert vram_only.gpus[0].slots == 20 and capped.gpus[0].slots == 4
    assert vram_only.gpus[0].batch_bounds == capped.gpus[0].batch_bounds == (64, 4096)


def test_user_concurrency_lowers_but_never_raises() -> None:
    lowered = plan_node([gpu(0, L4_MB)], TFT, cpu_bound=False, cpu_cores=64, concurrency=3)
    assert lowered.gpus[0].slots == 3 and lowered.gpus[0].limited_by == "user"
    raised = plan_node([gpu(0, L4_MB)], TFT, cpu_bound=False, cpu_cores=64, concurrency=50)
    assert raised.gpus[0].slots == 9 and raised.gpus[0].limited_by == "vram"
    with pytest.raises(ValueError):
        plan_node([gpu(0, L4_MB)], TFT, cpu_bound=False, cpu_cores=4, concurrency=0)


def test_measured_model_replaces_the_declared_one_on_its_gpu_only() -> None:
    measured = {"NVIDIA L4": (MemoryModel(4000.0, 0.1), "measured (calibration, 2 samples)")}
    plan = plan_node(
        [gpu(0, L4_MB, "NVIDIA L4"), gpu(1, L4_MB, "Other")],
        TFT,
        cpu_bound=False,
        cpu_cores=8,
        gpu_memory_models=measured,
    )
    l4, other = plan.gpus
    assert l4.memory_model_source.startswith("measured") and l4.slots == 4
    assert other.memory_model_source == "declared" and other.slots == 9


def test_a_model_too_big_for_the_gpu_still_plans_one_slot_and_says_it_does_not_fit() -> None:
    plan = plan_node([gpu(0, 4096)], MemoryModel(8000.0, 0.1), cpu_bound=False, cpu_cores=4)
    (one,) = plan.gpus
    assert one.slots == 1 and not one.fits and one.batch_bounds == (64, 64)


def test_swarm_size_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="swarm_size"):
        plan_node([gpu(0, L4_MB)], DQN, cpu_bound=False, cpu_cores=4, swarm_size=0)


def test_plan_as_dict_round_trips_the_numbers() -> None:
    plan = plan_node([gpu(0, L4_MB)], TFT, cpu_bound=False, cpu_cores=8)
    data = plan.as_dict()
    assert isinstance(plan, NodePlan)
    assert data["total_slots"] == 9
    assert data["gpus"][0]["batch_bounds"] == [64, 4096]
    assert data["gpus"][0]["memory_model"]["source"] == "declared"


# --- usable CPU cores -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [
        ("max", "100000", None),
        ("200000", "100000", 2),
        ("150000", "100000", 1),
        ("50000", "100000", 1),
        ("-1", "100000", None),
    ],
)
def test_cgroup_quota_in_whole_cores(quota: str, period: str, cores: int | None) -> None:
    assert cores_from_quota(quota, period) == cores


def test_cgroup_v2_and_v1_files_are_read(tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("300000 100000\n")
    assert _cgroup_quota_cores(tmp_path) == 3
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cgroup_quota_cores(v1) == 4
    assert _cgroup_quota_cores(tmp_path / "nothing") is None


def test_usable_cpu_cores_is_within_the_affinity() -> None:
    import os

    cores = usable_cpu_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert math.isfinite(cores)
