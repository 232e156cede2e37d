"""make_sampler for studies of several objectives, and the grid."""

from __future__ import annotations

import optuna
import pytest

from samplers import SAMPLER_NAMES, make_sampler
from samplers._factory import SINGLE_OBJECTIVE_ONLY

optuna.logging.set_verbosity(optuna.logging.WARNING)


def two_objectives(trial: optuna.Trial) -> tuple[float, float]:
    x = trial.suggest_float("x", 0, 1)
    batch = trial.suggest_int("batch_size", 64, 4096, log=True)
    return x, (1 - x) ** 2 + batch / 4096


@pytest.mark.parametrize(
    "name", [n for n in SAMPLER_NAMES if n not in SINGLE_OBJECTIVE_ONLY and n != "grid"]
)
def test_every_sampler_for_several_objectives_searches_them_inside_its_bounds(name: str) -> None:
    sampler = make_sampler(name, seed=0, n_objectives=2, bounds={"batch_size": (128, 256)})
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    study.optimize(two_objectives, n_trials=12)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert all(128 <= t.params["batch_size"] <= 256 for t in study.trials)
    assert study.best_trials


@pytest.mark.parametrize("name", SINGLE_OBJECTIVE_ONLY)
def test_single_objective_samplers_refuse_several_with_the_names_that_can(name: str) -> None:
    with pytest.raises(ValueError, match=f"'{name}' optimises one objective only.*nsga2"):
        make_sampler(name, seed=0, n_objectives=2)


def test_grid_walks_every_point_once_and_needs_a_grid() -> None:
    grid = {"x": [0.25, 0.75], "batch_size": [64, 512]}
    study = optuna.create_study(
        directions=["minimize", "minimize"],
        sampler=make_sampler("grid", seed=3, grid=grid, n_objectives=2),
    )
    study.optimize(two_objectives, n_trials=4)
    points = {(t.params["x"], t.params["batch_size"]) for t in study.trials}
    assert points == {(0.25, 64), (0.25, 512), (0.75, 64), (0.75, 512)}
    with pytest.raises(ValueError, match="'grid' needs the values"):
        make_sampler("grid", seed=0)
    with pytest.raises(ValueError, match="'x' must be a non-empty list"):
        make_sampler("grid", seed=0, grid={"x": []})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_the_number_of_objectives_is_checked(bad) -> None:
    with pytest.raises(ValueError, match="n_objectives"):
        make_sampler("tpe", seed=0, n_objectives=bad)


def test_a_study_s_default_swarm_is_the_swarm_s_own_default() -> None:
    """The study settings (record) may not import the samplers: the one default is the
    sampler's, and the stored setting must say the same."""
    import inspect

    from orchestrator.record.study.spec import StudySpec
    from samplers import PSOSampler

    default = inspect.signature(PSOSampler).parameters["swarm_size"].default
    assert StudySpec.swarm_size == default
    assert make_sampler("pso", seed=0)._swarm.size == default
    assert make_sampler("pso", seed=0, swarm_size=7)._swarm.size == 7
