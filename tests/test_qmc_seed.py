"""`--sampler qmc` without `--seed`: one seed is drawn, stored, and used by every process.

Scrambled QMC points form one low-discrepancy sequence only if every process scrambles it
alike. A `run` and a `worker` share one study here, each with its own trial processes; every
point QMC drew must be a point of the one scrambled Sobol sequence of the stored seed.
"""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy as sa

from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import SPEC_ATTR, StudySpec, load_spec, save_spec
from tests.cli_helpers import run_cli, start_cli

optuna.logging.set_verbosity(optuna.logging.WARNING)

FAST = (
    "--option",
    "trial_seconds=0.05",
    "--epochs",
    "1",
    "--gpus",
    "sim:24576",
    "--pruner",
    "none",
)


def sobol_points(study: optuna.Study, seed: int, count: int) -> list[dict]:
    """The first `count` points QMCSampler(seed, scramble=True) draws for this study's space,
    computed here as QMCSampler computes them (scipy's Sobol, Optuna's transform)."""
    from optuna._transform import _SearchSpaceTransform
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from scipy.stats import qmc

    first = min(study.get_trials(deepcopy=False), key=lambda t: t.number)
    space = dict(first.distributions)
    pseudo = {
        name: FloatDistribution(0, len(dist.choices))
        for name, dist in space.items()
        if isinstance(dist, CategoricalDistribution)
    }
    transform = _SearchSpaceTransform(space | pseudo, transform_0_1=True)
    engine = qmc.Sobol(len(space), seed=seed, scramble=True)
    return [transform.untransform(row) for row in engine.random(count)]


def in_sequence(params: dict, points: list[dict]) -> bool:
    # x and y are linear floats that no bound maps: they identify a point exactly.
    return any(
        abs(p["x"] - params["x"]) < 1e-9 and abs(p["y"] - params["y"]) < 1e-9 for p in points
    )


def test_a_run_and_a_worker_draw_points_of_one_sequence(sqlite_url):
    # One trial at a time: a second trial drawn while the first runs has no finished trial to read
    # the search space from either, and is drawn by the independent sampler too.
    first = run_cli(
        "run",
        "synthetic",
        "--sampler",
        "qmc",
        "--trials",
        "2",
        "--concurrency",
        "1",
        "--storage",
        sqlite_url,
        *FAST,
    )
    assert first.returncode == 0, first.stderr
    study = optuna.load_study(study_name="synthetic", storage=StorageLocation.parse(sqlite_url).url)
    seed = study.user_attrs[SPEC_ATTR]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**32  # drawn once, stored with the settings

    more = ("--trials", "14", "--storage", sqlite_url, "--concurrency", "1")
    runner = start_cli("run", "synthetic", *more, *FAST)
    worker = run_cli(
        "worker",
        "--study",
        "synthetic",
        "--storage",
        sqlite_url,
        "--concurrency",
        "1",
        "--gpus",
        "sim:24576",
    )
    _, run_err = runner.communicate(timeout=300)
    assert runner.returncode == 0, run_err
    assert worker.returncode == 0, worker.stderr

    study = optuna.load_study(study_name="synthetic", storage=StorageLocation.parse(sqlite_url).url)
    engine = sa.create_engine(StorageLocation.parse(sqlite_url).url)
    with engine.connect() as conn:
        supervisors = conn.execute(sa.select(records.workers.c.pid)).scalars().all()
    engine.dispose()
    assert len(set(supervisors)) == 3  # the first run, then a run and a worker at once

    trials = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(trials) == 14
    # The first trial is drawn by QMC's independent sampler: the sequence starts after it.
    drawn = [t.params for t in trials if t.number > 0]
    points = sobol_points(study, seed, 64)
    assert all(in_sequence(params, points) for params in drawn)
    # A process that scrambled with a seed of its own would draw from another sequence.
    other = sobol_points(study, (seed + 1) % 2**32, 64)
    assert not any(in_sequence(params, other) for params in drawn)


def test_a_study_stored_without_a_seed_derives_one_alike_in_every_process(sqlite_url):
    storage = StorageLocation.parse(sqlite_url).url
    study = optuna.create_study(study_name="old", storage=storage)
    save_spec(
        study,
        StudySpec(adapter="synthetic", trials=4, epochs=1, direction="minimize", sampler="qmc"),
    )
    one = load_spec(optuna.load_study(study_name="old", storage=storage))
    two = load_spec(optuna.load_study(study_name="old", storage=storage))
    assert one.seed is not None and one.seed == two.seed
    other = optuna.create_study(study_name="older", storage=storage)
    save_spec(
        other,
        StudySpec(adapter="synthetic", trials=4, epochs=1, direction="minimize", sampler="qmc"),
    )
    assert load_spec(other).seed != one.seed


@pytest.mark.parametrize("sampler", ["pso", "tpe", "random", "cmaes"])
def test_every_new_study_stores_its_seed(sqlite_url, sampler):
    done = run_cli(
        "run", "synthetic", "--sampler", sampler, "--trials", "1", "--storage", sqlite_url, *FAST
    )
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=StorageLocation.parse(sqlite_url).url)
    assert isinstance(study.user_attrs[SPEC_ATTR]["seed"], int)
