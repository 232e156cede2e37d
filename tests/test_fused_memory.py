"""A fused group's memory: what a process pays once (the CUDA context) is counted once, each
member its own weights, optimiser state and batch (docs/fused.md). Pure values and the
supervisor's admission; tests/test_fused_pool.py runs it with real processes."""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planning.footprint import Footprint, envelope, observe_oom, observe_peak
from orchestrator.planning.planner import plan_node
from orchestrator.run.backend import Sized
from orchestrator.run.pool.placement import auto_group_size
from orchestrator.run.pool.supervisor import RunningTrial, Supervisor

# 2,000 MB a trial alone, 1,500 of them the process's own: a member adds 500.
SHARED = MemoryModel(2000.0, 0.0, per_process_mb=1500.0)
SIM = Device(0, "Simulated GPU 8000", "sim-0", 8000.0, kind="sim")  # 6,400 MB usable

models = st.builds(
    lambda overhead, share, per_sample: MemoryModel(overhead, per_sample, overhead * share),
    st.floats(0.0, 5000.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 5.0),
)
batches = st.lists(st.integers(0, 4096), min_size=1, max_size=16)


def test_a_group_pays_the_process_part_once_and_each_member_the_rest():
    assert SHARED.fused_mb([0]) == SHARED.planned_mb(0) == 2000.0
    assert SHARED.fused_mb([0] * 6) == 1500.0 + 6 * 500.0
    assert MemoryModel(2000.0, 0.0).fused_mb([0] * 6) == 6 * 2000.0  # nothing shared: the sum
    # A process part above the overhead is the overhead: a member never costs less than nothing.
    assert MemoryModel(100.0, 1.0, per_process_mb=900.0).fused_mb([10, 20]) == 100.0 + 30.0


@given(models, batches)
def test_a_group_costs_at_most_its_members_alone_and_at_least_its_largest(model, sizes):
    group = model.fused_mb(sizes)
    alone = [model.planned_mb(b) for b in sizes]
    assert max(alone) - 1e-6 <= group <= sum(alone) + 1e-6


def test_the_footprint_counts_a_group_with_its_process_part_once():
    footprint = Footprint(SHARED, "declared")
    assert footprint.planned_mb(0, 6) == pytest.approx(4500.0)
    assert footprint.worst_mb(0, 6) == pytest.approx(4500.0)
    assert footprint.planned_mb(0) == pytest.approx(2000.0)


def test_a_group_that_used_what_its_model_said_teaches_nothing_new():
    """A member's share of the group's peak is what one trial is learnt by: a group of 6 that
    held exactly its 4,500 MB leaves a trial alone at 2,000 (a sixth of the peak, 750, would
    teach the footprint that a trial alone holds 750)."""
    footprint = Footprint(SHARED, "declared")
    share = footprint.member_share(4500.0, 0, 6)
    assert share == pytest.approx(2000.0)
    learnt = observe_peak(footprint, 0, share)
    assert learnt.planned_mb(0) == pytest.approx(2000.0)
    assert learnt.planned_mb(0, 6) == pytest.approx(4500.0)
    twice = observe_peak(footprint, 0, footprint.member_share(9000.0, 0, 6))
    assert twice.planned_mb(0, 6) == pytest.approx(9000.0)  # twice the model: a group twice too
    nothing_shared = Footprint(MemoryModel(2000.0, 0.0), "declared")
    assert nothing_shared.member_share(12000.0, 0, 6) == pytest.approx(2000.0)


def test_a_group_that_ran_out_of_memory_is_never_admitted_into_that_room_again():
    footprint = Footprint(SHARED, "declared")
    room = 4000.0  # the group of 6 (4,500 by the model) was let into 4,000 and ran out
    raised = observe_oom(footprint, 0, footprint.member_share(room, 0, 6))
    assert raised.planned_mb(0, 6) > room
    assert raised.worst_mb(0, 6) > room


@given(st.lists(models, min_size=1, max_size=4), batches)
def test_the_envelope_of_models_covers_each_of_their_groups(many, sizes):
    line = envelope(many)
    for model in many:
        assert line.fused_mb(sizes) >= model.fused_mb(sizes) - 1e-6


def test_the_plan_fits_more_trials_in_one_group_than_in_processes_of_their_own():
    (gpu,) = plan_node([SIM], SHARED, cpu_bound=False, cpu_cores=2, swarm_size=20).gpus
    assert gpu.slots == 3  # 6,400 // 2,000: processes of their own
    assert gpu.group_members == 9  # (6,400 - 1,500) // 500: one process
    assert auto_group_size(gpu) == 9
    (budget,) = plan_node(
        [SIM], SHARED, cpu_bound=False, cpu_cores=2, swarm_size=20, budget_trials=6
    ).gpus
    assert budget.group_members == 6  # the budget caps a group as it caps the slots
    (alone,) = plan_node([SIM], MemoryModel(2000.0, 0.0), cpu_bound=False, cpu_cores=2).gpus
    assert alone.group_members == alone.slots == 3  # nothing shared: what processes pack


def test_the_supervisor_admits_a_group_by_its_fused_bytes():
    """Six members of 2,000 MB alone: 12,000 counted once per member would never fit a GPU of
    6,400 usable; with the 1,500 the process pays counted once, 4,500 is admitted."""
    (gpu,) = plan_node([SIM], SHARED, cpu_bound=False, cpu_cores=2, swarm_size=20).gpus
    supervisor = Supervisor.for_plan(0, gpu)
    supervisor.running[1] = RunningTrial(1, members=6)
    supervisor.heard(Sized(handle=1, batch_size=0, members=6))
    admitted, _ = supervisor.next_admission(free_mb=8000.0)
    assert admitted is not None and admitted.planned_mb == pytest.approx(4500.0)


def test_a_group_is_cut_to_what_fits_the_gpu_before_it_starts():
    """--fuse 8 of trials of 2,000 MB alone, on 6,400 MB usable: a group of 8 could only wait
    for the GPU to empty and then run out of memory; the supervisor starts groups of 3. With
    the process's 1,500 MB counted once, 9 fit; after an OOM the learnt estimate fits fewer.
    Without a GPU there are no bytes to cut by."""
    (alone,) = plan_node([SIM], MemoryModel(2000.0, 0.0), cpu_bound=False, cpu_cores=2).gpus
    supervisor = Supervisor.for_plan(0, alone)
    assert [supervisor.members_that_fit(n) for n in (1, 2, 3, 8)] == [1, 2, 3, 3]
    (shared,) = plan_node([SIM], SHARED, cpu_bound=False, cpu_cores=2, swarm_size=20).gpus
    supervisor = Supervisor.for_plan(0, shared)
    assert supervisor.members_that_fit(16) == 9
    supervisor.footprint = observe_oom(supervisor.footprint, 0, 2000.0)  # 2,000 was too little
    assert 1 <= supervisor.members_that_fit(16) < 9
    cpu = types.SimpleNamespace(device=None)
    assert Supervisor.members_that_fit(cpu, 16) == 16
