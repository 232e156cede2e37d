"""PSOSampler's behaviour in one process: start, steps, outcomes, bounds, enqueued trials."""

from __future__ import annotations

import multiprocessing

import numpy as np
import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

import samplers
from samplers import PSOSampler, make_sampler
from samplers._space import to_unit

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -5, 5)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    batch = trial.suggest_int("batch_size", 64, 4096, log=True)
    return x**2 + (np.log10(lr) + 3) ** 2 + abs(np.log2(batch) - 8)


def run_sequence(seed: int | None, n_trials: int = 45, storage: str | None = None) -> list[dict]:
    study = optuna.create_study(
        storage=storage, sampler=PSOSampler(swarm_size=8, seed=seed), study_name="repro"
    )
    study.optimize(objective, n_trials=n_trials)
    return [t.params for t in study.trials]


def test_same_seed_same_sequence_other_seed_other_sequence() -> None:
    first = run_sequence(3)
    assert first == run_sequence(3)
    assert first != run_sequence(4)


def test_same_sequence_in_a_spawned_process() -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(run_sequence, (3,))
    assert spawned == run_sequence(3)


def test_seedless_workers_of_one_study_agree() -> None:
    # Without a seed the stream comes from the study, so two sampler objects agree.
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    dist = FloatDistribution(0, 1)
    a = PSOSampler().sample_independent(study, storage.get_trial(trial._trial_id), "x", dist)
    b = PSOSampler().sample_independent(study, storage.get_trial(trial._trial_id), "x", dist)
    assert a == b


def test_the_start_is_one_latin_hypercube_of_eight_whatever_the_swarm_size() -> None:
    size = 8
    study = optuna.create_study(sampler=PSOSampler(swarm_size=20, seed=5))
    study.optimize(objective, n_trials=size)
    for name in ("x", "lr"):
        dist = study.trials[0].distributions[name]
        strata = sorted(int(to_unit(dist, t.params[name]) * size) for t in study.trials)
        assert strata == list(range(size)), name


def test_values_are_python_numbers_and_the_swarm_improves() -> None:
    study = optuna.create_study(sampler=PSOSampler(swarm_size=10, seed=1))
    study.optimize(objective, n_trials=120)
    for trial in study.trials:
        assert type(trial.params["x"]) is float and type(trial.params["lr"]) is float
        assert type(trial.params["batch_size"]) is int
    start = min(t.value for t in study.trials[:10])
    assert study.best_value < start / 4
    # Trial n moved particle n % swarm_size, and its step was recorded.
    record = study.trials[57].system_attrs["pso"]
    assert record["p"] == 7 and set(record["x"]) == {"x", "lr", "batch_size"}


def test_several_objectives_are_searched_not_refused() -> None:
    # The multi-objective swarm (tests/test_sampler_mopso.py) in the same class.
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=PSOSampler())
    study.optimize(lambda t: (t.suggest_float("x", 0, 1), 1.0), n_trials=3, catch=())
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"swarm_size": 1},
        {"swarm_size": 2.5},
        {"topology": "star"},
        {"seed": -1},
        {"bounds": {"batch_size": (512, 64)}},
        {"bounds": {"batch_size": 64}},
        {"max_velocity": 2},
        {"grid_reach": -1},
        {"grid_reach": float("inf")},
    ],
)
def test_constructor_validates(kwargs) -> None:
    with pytest.raises(ValueError):
        PSOSampler(**kwargs)


def position(trial: optuna.trial.FrozenTrial, name: str) -> float:
    """The particle's position for `name` as the trial recorded it (relative or one parameter)."""
    if "pso" in trial.system_attrs and name in trial.system_attrs["pso"]["x"]:
        return trial.system_attrs["pso"]["x"][name][0]
    return trial.system_attrs["pso:" + name][1]


@pytest.mark.parametrize(("reach", "grid_clamp"), [(2.5, 0.25), (0.0, 0.15)])
def test_a_small_ordered_grid_gets_a_clamp_that_crosses_its_reach(reach, grid_clamp) -> None:
    # Ten grid points: one swarm step may cross 2.5 of them (0.25 of the range), while the
    # continuous parameter keeps the 0.15 clamp.
    from samplers._model.candidates import Particle, Space, swarm_draws
    from samplers._swarm import SwarmCoefficients

    space = Space.of({"x": FloatDistribution(-1, 1), "k": IntDistribution(0, 9)})
    at, far = np.array([0.05, 0.05]), np.array([0.95, 0.95])
    particle = Particle(at, np.zeros(2), own_best=far, holds_best=False)
    rng = np.random.default_rng(0)
    draws = swarm_draws(space, particle, far, SwarmCoefficients(), reach, 0.05, rng, 500)
    step = np.abs(draws - at)
    k, x = space.names.index("k"), space.names.index("x")
    assert step[:, k].max() <= grid_clamp + 1e-12 and step[:, x].max() <= 0.15 + 1e-12
    assert step[:, k].max() > grid_clamp - 0.01  # the clamp is used, not only allowed


def test_bounds_map_proposals_but_positions_stay_unclamped() -> None:
    study = optuna.create_study(
        sampler=PSOSampler(swarm_size=8, seed=2, bounds={"batch_size": (100, 300)})
    )
    study.optimize(objective, n_trials=40)
    sizes = [t.params["batch_size"] for t in study.trials]
    assert all(100 <= s <= 300 for s in sizes)
    dist = IntDistribution(64, 4096, log=True)
    positions = [position(study.trials[i], "batch_size") for i in range(8)]
    # The Latin-hypercube start spans the whole static range, beyond this process's bounds.
    assert max(positions) > to_unit(dist, 300) and min(positions) < to_unit(dist, 100)


def test_enqueued_trials_are_respected_and_move_no_particle() -> None:
    study = optuna.create_study(sampler=PSOSampler(swarm_size=4, seed=0))
    study.optimize(objective, n_trials=6)
    study.enqueue_trial({"x": 0.25, "batch_size": 256})
    study.optimize(objective, n_trials=3)
    guest = study.trials[6]
    assert guest.params["x"] == 0.25 and guest.params["batch_size"] == 256
    assert 1e-5 <= guest.params["lr"] <= 1e-1
    assert not any(key.startswith("pso") for key in guest.system_attrs)
    assert "pso" in study.trials[7].system_attrs


def _batches_after_failure(oom: bool) -> list[int]:
    """A trial fails at batch size 4096 on a study that prefers large batches; what next?"""
    study = optuna.create_study(sampler=PSOSampler(swarm_size=4, seed=4))
    dist = {"x": FloatDistribution(-5, 5), "batch_size": IntDistribution(64, 4096, log=True)}

    def value(trial) -> float:
        return trial.params["x"] ** 2 - np.log2(trial.params["batch_size"])

    for _ in range(10):
        trial = study.ask(dist)
        study.tell(trial, value(trial))
    failed = optuna.trial.create_trial(
        params={"x": 0.0, "batch_size": 4096},
        distributions=dist,
        state=TrialState.FAIL,
        user_attrs={"oom": oom},
    )
    study.add_trial(failed)
    after = []
    for _ in range(8):
        trial = study.ask(dist)
        after.append(trial.params["batch_size"])
        study.tell(trial, value(trial))
    return after


def test_oom_caps_the_batch_size_at_half_of_what_failed() -> None:
    assert max(_batches_after_failure(oom=True)) <= 2048
    assert max(_batches_after_failure(oom=False)) > 2048


def test_small_discrete_space_gets_no_duplicates() -> None:
    study = optuna.create_study(sampler=PSOSampler(swarm_size=4, seed=0))

    def tiny(trial):
        return (trial.suggest_int("a", 0, 3) - 2) ** 2 + (trial.suggest_int("b", 0, 3) - 1) ** 2

    study.optimize(tiny, n_trials=14)
    sets = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(sets)) == len(sets)


def test_make_sampler_names_bounds_and_offsets() -> None:
    with pytest.raises(ValueError, match="pso, tpe, random, qmc, cmaes"):
        make_sampler("hyperband", seed=0, swarm_size=20, bounds=None)
    assert isinstance(make_sampler("pso", seed=0, swarm_size=20, bounds=None), PSOSampler)
    for name in samplers.SAMPLER_NAMES:
        if name == "pbt":  # trains lineages from checkpoints: tests/test_pbt_sampler.py
            continue
        grid = (
            {"x": [0.1, 0.5], "lr": [1e-3], "batch_size": [64, 200, 4096]}
            if name == "grid"
            else None
        )
        sampler = make_sampler(
            name, seed=0, swarm_size=4, bounds={"batch_size": (128, 256)}, grid=grid
        )
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=6)
        assert all(128 <= t.params["batch_size"] <= 256 for t in study.trials), name

    def first_point(offset: int) -> dict:
        study = optuna.create_study(
            sampler=make_sampler(
                "random", seed=0, swarm_size=20, bounds=None, independent_seed_offset=offset
            )
        )
        study.optimize(objective, n_trials=1)
        return study.trials[0].params

    assert first_point(1) == first_point(1) != first_point(2)


def test_importing_the_package_does_not_import_optuna() -> None:
    import subprocess
    import sys

    code = "import sys, samplers; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_history_indexes_match_a_brute_force_reading() -> None:
    from samplers._history import History, parse

    study = optuna.create_study(sampler=PSOSampler(swarm_size=5, seed=3))
    study.optimize(objective, n_trials=40)
    trials = study.get_trials(deepcopy=False)
    history = History()
    history.view(study._storage, study._study_id, trials[:17], 1.0)  # an earlier snapshot first
    view = history.view(study._storage, study._study_id, trials, 1.0)
    records = [parse(t, 1.0) for t in trials]
    for particle in range(5):
        mine = [r for r in records if r.particle == particle]
        assert [r.number for r in view.particle_records(particle)] == [r.number for r in mine]
        best = min(mine, key=lambda r: (r.score, r.number))
        assert view.personal_best(particle, "x").number == best.number
    assert view.best_number("lr") == min(records, key=lambda r: (r.score, r.number)).number
    assert set(view.relative_space) == {"x", "lr", "batch_size"}


def test_a_trial_of_infinite_or_nan_value_is_no_particle_s_best():
    # Optuna completes a trial that returns inf (a diverged loss); the swarm must not follow it.
    import math

    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from samplers._history import parse

    dist = {"x": FloatDistribution(0.0, 1.0)}
    for value in (-math.inf, math.inf):  # Optuna fails a NaN: never COMPLETE
        trial = create_trial(
            params={"x": 0.5}, distributions=dist, value=value, state=TrialState.COMPLETE
        )
        assert parse(trial, 1.0).score is None
        two = create_trial(
            params={"x": 0.5}, distributions=dist, values=[1.0, value], state=TrialState.COMPLETE
        )
        assert parse(two, (1.0, 1.0)).values is None
    assert parse(create_trial(params={"x": 0.5}, distributions=dist, value=2.0), -1.0).score == -2.0
