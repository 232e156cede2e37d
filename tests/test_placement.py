"""Placement: which GPU of a host the next trial starts on. The rule as a table and as
properties, the pool on its virtual clock with two and eight GPUs (and compute shared on each),
and once through the real command line with two simulated GPUs."""

from __future__ import annotations

import math

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.base import MemoryModel
from orchestrator.gpu.base import Device
from orchestrator.planning.planner import plan_node
from orchestrator.record.store.location import StorageLocation
from orchestrator.run.pool.loop import Pool
from orchestrator.run.pool.placement import GpuLoad, Policy, place
from orchestrator.run.simulated import SimTrial, SimulatedStudy, SimulatedTrials, speed
from tests.cli_helpers import cli_env, run_cli


def _loads(*rows: tuple[bool, int, float]) -> list[GpuLoad]:
    return [GpuLoad(index, *row) for index, row in enumerate(rows)]


@pytest.mark.parametrize(
    ("rows", "spread", "first_fit"),
    [
        # (takes another, our trials, free MB) per GPU -> the GPU chosen by each policy
        ([(True, 0, 12288.0), (True, 0, 24576.0)], 1, 0),  # both empty: the most free
        ([(True, 3, 9000.0), (True, 2, 1000.0)], 1, 0),  # fewest trials beats more free
        ([(True, 1, 5000.0), (True, 1, 5000.0)], 0, 0),  # a full tie: the lower index
        ([(False, 0, 24576.0), (True, 4, 100.0)], 1, 1),  # only one takes another
        ([(False, 0, 1.0), (False, 2, 1.0)], None, None),  # none does
        ([(True, 2, 3000.0), (True, 2, 8000.0), (True, 5, 20000.0)], 1, 0),
        ([(True, 0, math.inf)], 0, 0),  # the CPU: no memory to compare
    ],
)
def test_the_gpu_each_policy_chooses(rows, spread, first_fit):
    loads = _loads(*rows)
    assert place(loads, Policy.SPREAD).index == spread
    assert place(loads, Policy.FIRST_FIT).index == first_fit


def test_the_choice_says_why():
    assert place(_loads((True, 2, 10.0), (True, 1, 5.0))).reason == "fewest trials (1)"
    tied = place(_loads((True, 1, 10.0), (True, 1, 50.0))).reason
    assert tied == "fewest trials (1), most free (50 MB)"
    assert place(_loads((False, 0, 1.0))).reason == "no GPU takes another trial now"


_load_rows = st.lists(
    st.tuples(st.booleans(), st.integers(0, 30), st.floats(-1e5, 1e6, allow_nan=False)),
    min_size=1,
    max_size=8,
)


@given(_load_rows)
def test_spread_first_takes_a_least_loaded_gpu_that_takes_another(rows):
    loads = _loads(*rows)
    placed = place(loads)
    takers = [load for load in loads if load.takes_another]
    if not takers:
        assert placed.index is None
        return
    chosen = loads[placed.index]
    assert chosen.takes_another
    assert chosen.trials == min(load.trials for load in takers)
    assert chosen.free_mb == max(load.free_mb for load in takers if load.trials == chosen.trials)


# -- the pool on its virtual clock ----------------------------------------------------------


def _pool(sizes, trials, policy, *, busy=None, budget=None):
    devices = [
        Device(i, f"Simulated GPU {mb}", f"sim-{i}", mb, kind="sim") for i, mb in enumerate(sizes)
    ]
    plans = plan_node(
        devices, MemoryModel(1000.0, 0.0), cpu_bound=False, cpu_cores=8, swarm_size=20
    ).gpus
    study = SimulatedStudy(budget=budget or len(trials))
    backend = SimulatedTrials(study, trials, devices, busy_fraction=busy)
    pool = Pool(
        study=study,
        plans=list(plans),
        probe=backend,
        backend=backend,
        clock=backend.clock,
        placement=policy,
    )
    return pool, study, backend


def test_six_trials_on_two_gpus_go_three_to_each_and_first_fit_packs_the_first():
    spread, study, backend = _pool([12288, 24576], [SimTrial(64, 1000.0, 60.0)] * 6, Policy.SPREAD)
    spread.run()
    assert study.complete == 6 and backend.admitted_on == [3, 3]
    packed, study, backend = _pool(
        [12288, 24576], [SimTrial(64, 1000.0, 60.0)] * 6, Policy.FIRST_FIT
    )
    packed.run()
    # First fit fills GPU 0's first allowance (half of 9.8 GB usable: 4 trials of 1 GB) first.
    assert study.complete == 6 and backend.admitted_on == [4, 2]


def test_eight_mixed_gpus_each_get_a_trial_before_any_gets_a_second():
    sizes = [12288, 16384, 24576, 24576, 40960, 49152, 81920, 81920]
    pool, study, backend = _pool(sizes, [SimTrial(64, 1000.0, 60.0)] * 8, Policy.SPREAD)
    pool.run()
    assert study.complete == 8 and backend.admitted_on == [1] * 8


def test_spread_first_finishes_a_study_sooner_when_trials_share_compute():
    # Spread: 3 and 3, each GPU 1.5x over full, 150 s; first fit: 4 and 2, the first 200 s.
    trials = [SimTrial(64, 1000.0, 100.0)] * 6
    spread, _, fast = _pool([12288, 24576], trials, Policy.SPREAD, busy=0.5)
    packed, _, slow = _pool([12288, 24576], trials, Policy.FIRST_FIT, busy=0.5)
    spread.run()
    packed.run()
    assert fast.now == pytest.approx(150.0) and slow.now == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("on_gpu", "busy", "expected"),
    [(1, 0.5, 1.0), (2, 0.5, 1.0), (4, 0.5, 0.5), (3, 1.0, 1 / 3), (8, None, 1.0), (1, 1.0, 1.0)],
)
def test_a_trial_slows_only_once_its_gpu_is_full(on_gpu, busy, expected):
    assert speed(on_gpu, busy) == pytest.approx(expected)


def test_trials_beside_each_other_on_a_busy_gpu_take_longer():
    # Two 100 s trials that each keep the GPU busy alone share it: both end at 200 s, not 100 s.
    pool, study, backend = _pool(
        [24576], [SimTrial(64, 1000.0, 100.0)] * 2, Policy.SPREAD, busy=1.0
    )
    pool.run()
    assert study.complete == 2 and backend.now == pytest.approx(200.0)
    pool, study, backend = _pool([24576], [SimTrial(64, 1000.0, 100.0)] * 2, Policy.SPREAD)
    pool.run()
    assert backend.now == pytest.approx(100.0)  # sharing off: as before


# -- the real command line -------------------------------------------------------------------


def test_run_on_two_simulated_gpus_puts_trials_on_both(sqlite_url):
    done = run_cli(
        "run",
        "synthetic",
        "--trials",
        "6",
        "--storage",
        sqlite_url,
        "--gpus",
        "sim:12288,sim:24576",
        "--option",
        "trial_seconds=1",
        "--epochs",
        "1",
        "--pruner",
        "none",
        timeout=600,
        # A grace a busy machine keeps: six trials, none lost to a late heartbeat and re-run.
        env=cli_env(ORCHESTRATOR_GRACE_PERIOD="10"),
    )
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=StorageLocation.parse(sqlite_url).url)
    on_gpu = [t.user_attrs["gpu_index"] for t in study.trials]
    assert len(on_gpu) == 6
    assert on_gpu.count(0) >= 2 and on_gpu.count(1) >= 2, on_gpu
