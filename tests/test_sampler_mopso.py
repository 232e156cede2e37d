"""The multi-objective swarm: dominance and crowding, leaders, constraints, a shared swarm."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from orchestrator.record.trials.pareto import dominates
from samplers import PSOSampler, make_sampler
from samplers._pareto import crowding_distance, front, tournament, trim

optuna.logging.set_verbosity(optuna.logging.WARNING)

points = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=25).map(
    lambda rows: np.array(rows, dtype=float)
)


@settings(max_examples=60, deadline=None)
@given(points)
def test_the_front_is_exactly_the_points_nothing_dominates(values: np.ndarray) -> None:
    kept = set(front(values).tolist())
    for i, point in enumerate(values):
        dominated = any(dominates(other, point) for other in values)
        assert (i in kept) == (not dominated)


def test_feasible_points_come_first_then_the_least_violation() -> None:
    values = np.array([[0.0, 0.0], [5.0, 5.0], [4.0, 6.0], [1.0, 1.0]])
    # The best values are infeasible: the feasible front leads while there is one.
    assert sorted(front(values, np.array([2.0, 0.0, 0.0, 1.0])).tolist()) == [1, 2]
    # No feasible point: the ones that violate least, among themselves by dominance.
    assert front(values, np.array([2.0, 3.0, 1.0, 1.0])).tolist() == [3]


def test_crowding_keeps_the_extremes_and_trim_drops_the_most_crowded() -> None:
    values = np.array([[0.0, 4.0], [1.0, 3.0], [1.1, 2.9], [4.0, 0.0], [2.0, 2.0]])
    distance = crowding_distance(values)
    assert np.isinf(distance[[0, 3]]).all() and np.isfinite(distance[[1, 2, 4]]).all()
    kept = trim(values, 4).tolist()
    assert len(kept) == 4 and {0, 3, 4} <= set(kept)  # one of the two close ones goes


def test_the_tournament_picks_the_sparser_of_the_two_drawn() -> None:
    crowding = np.array([0.1, 5.0])
    picks = {tournament(crowding, np.random.default_rng(seed)) for seed in range(20)}
    assert picks == {1}


def zdt1(trial: optuna.Trial) -> tuple[float, float]:
    x = np.array([trial.suggest_float(f"x{i}", 0, 1) for i in range(4)])
    g = 1 + 9 * float(np.mean(x[1:]))
    return float(x[0]), g * (1 - float(np.sqrt(x[0] / g)))


def distance_to_front(trial: optuna.trial.FrozenTrial) -> float:
    # ZDT1's front is x1 = x2 = x3 = 0: how far the trial's other coordinates are from it.
    return float(np.mean([trial.params[f"x{i}"] for i in range(1, 4)]))


@pytest.fixture(scope="module")
def zdt1_study() -> optuna.Study:
    sampler = make_sampler("pso", seed=5, swarm_size=10, n_objectives=2)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    study.optimize(zdt1, n_trials=100)
    return study


def test_make_sampler_gives_the_swarm_for_several_objectives_and_it_closes_in_on_the_front(
    zdt1_study,
) -> None:
    assert isinstance(zdt1_study.sampler, PSOSampler)
    start = np.median([distance_to_front(t) for t in zdt1_study.trials[:10]])
    last = np.median([distance_to_front(t) for t in zdt1_study.trials[-30:]])
    assert last < 0.75 * start  # a random sampler stays at about 0.5 on both
    # Several points along the front, not one point of it (ZDT1's front spans f1 in [0, 1]).
    spread = [t.values[0] for t in zdt1_study.best_trials]
    assert len(spread) >= 5 and max(spread) - min(spread) > 0.25


def test_every_trial_after_the_start_is_a_recorded_step(zdt1_study) -> None:
    trials = zdt1_study.trials
    steps = [t for t in trials[10:] if "pso" in t.system_attrs]
    assert len(steps) == len(trials) - 10
    moved = [t for t in steps if any(v != 0 for _, v in t.system_attrs["pso"]["x"].values())]
    assert len(moved) > 0.9 * len(steps)


def test_a_new_sampler_per_trial_moves_the_same_swarm_as_one_long_lived_object() -> None:
    def run(cold: bool) -> list[dict]:
        study = optuna.create_study(
            directions=["minimize", "maximize"], sampler=PSOSampler(swarm_size=4, seed=9)
        )
        for _ in range(30):
            if cold:
                study.sampler = PSOSampler(swarm_size=4, seed=9)
            trial = study.ask()
            first, second = zdt1(trial)
            study.tell(trial, [first, -second])
        return [t.params for t in study.trials]

    assert run(cold=True) == run(cold=False)


def test_constraints_lead_the_swarm_to_the_feasible_region() -> None:
    def objective(trial: optuna.Trial) -> tuple[float, float]:
        first, second = zdt1(trial)
        trial.set_user_attr("c", 0.6 - trial.params["x0"])  # feasible only for x0 >= 0.6
        return first, second

    sampler = PSOSampler(swarm_size=8, seed=2, constraints_func=lambda t: (t.user_attrs["c"],))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    study.optimize(objective, n_trials=80)
    assert all("constraints" in t.system_attrs for t in study.trials)
    feasible = [t.params["x0"] >= 0.6 for t in study.trials]
    # The Latin-hypercube start is about 40% feasible; the led swarm mostly is.
    assert sum(feasible[-24:]) >= 18 > sum(feasible[:8]) + 10


def test_out_of_memory_still_backs_off_the_batch_size_with_several_objectives() -> None:
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=PSOSampler(swarm_size=2, seed=0)
    )
    for _ in range(12):
        trial = study.ask()
        batch = trial.suggest_int("batch_size", 64, 4096, log=True)
        x = trial.suggest_float("x", 0, 1)
        if batch > 1024:
            trial.set_user_attr("oom", True)
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, [x, 1 - x + batch / 4096])
    after_oom = [
        (t, n)
        for t, n in zip(study.trials, study.trials[2:], strict=False)
        if t.state == TrialState.FAIL
    ]
    assert after_oom, "the seed gives no out-of-memory trial: pick another"
    assert all(n.params["batch_size"] <= t.params["batch_size"] / 2 for t, n in after_oom)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000))
def test_the_hypervolume_gain_is_what_a_point_adds_to_the_front(seed: int) -> None:
    from optuna._hypervolume import compute_hypervolume

    from samplers._pareto import hypervolume_gain

    rng = np.random.default_rng(seed)
    points = rng.random((12, 2))
    members = points[front(points)]
    reference = np.array([1.2, 1.3])
    q = rng.random((6, 2))
    gain = hypervolume_gain(members, reference, q)
    base = compute_hypervolume(members, reference)
    for point, got in zip(q, gain, strict=True):
        added = compute_hypervolume(np.vstack([members, point]), reference) - base
        if added > 1e-12:
            assert got == pytest.approx(added, abs=1e-9)
        else:  # adds nothing: scored by how far it is from adding any
            assert got <= 0
