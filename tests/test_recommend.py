"""`samplers.recommend`: the configuration a model of the trials expects best, not the luckiest.

Studies here are Optuna's own, in memory or in SQLite, made by several samplers: the
recommendation reads finished trials and nothing else. How fast it is at 1,000 trials is
measured by benchmarks/bench_recommend.py, how well on real HPO tables by
benchmarks/bench_samplers.py hpo.
"""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

import orchestrator
import samplers
from orchestrator.record.checkpoints import lineage
from orchestrator.record.trials.best import best_of_study, pick_best
from samplers import Recommendation, ranked, recommend, recommend_front, recommendation

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _truth(x: float, y: float) -> float:
    return (x - 0.3) ** 2 + (y + 0.2) ** 2


def _noisy_study(seed: int, n: int = 60, noise: float = 0.5) -> optuna.Study:
    rng = np.random.default_rng(seed)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(trial: optuna.Trial) -> float:
        x, y = trial.suggest_float("x", -1, 1), trial.suggest_float("y", -1, 1)
        return _truth(x, y) + noise * float(rng.standard_normal())

    study.optimize(objective, n_trials=n)
    return study


def test_on_a_noisy_objective_the_recommendation_is_truly_better_than_the_luckiest_draw():
    recommended, luckiest = [], []
    for seed in range(6):
        study = _noisy_study(seed)
        chosen = recommend(study)
        assert chosen.state == TrialState.COMPLETE
        recommended.append(_truth(**chosen.params))
        luckiest.append(_truth(**study.best_trial.params))
    # Better on most seeds, and by a wide margin on the typical one (a model can be wrong).
    assert sum(r < lucky for r, lucky in zip(recommended, luckiest, strict=True)) >= 5
    assert np.median(recommended) < 0.5 * np.median(luckiest)


def test_the_recommendation_names_the_luckiest_trial_beside_it_and_says_why():
    study = _noisy_study(1)
    found = recommendation(study.trials, ["minimize"])
    assert isinstance(found, Recommendation)
    assert found.best_observed.number == study.best_trial.number
    assert found.trial.number != found.best_observed.number
    assert found.repeats == 1 and found.observed == found.trial.value
    assert f"trial {found.best_observed.number} observed" in found.reason
    assert "\n" not in found.reason
    # The expected value is in the objective's units, within what the trials observed.
    values = [t.value for t in study.trials]
    assert min(values) <= found.expected <= max(values)
    # A noiseless bowl: the model agrees with the draw.
    quiet = _noisy_study(1, noise=0.0)
    same = recommendation(quiet.trials, ["minimize"])
    assert same.trial.number == same.best_observed.number
    assert same.reason == "the best observed trial is also the model's best"


def test_ranked_orders_every_configuration_by_the_model_and_starts_with_the_recommendation():
    study = _noisy_study(2)
    order = ranked(study.trials, ["minimize"])
    assert len(order) == len(study.trials)
    assert order[0][0].number == recommend(study).number
    expected = [value for _, value in order]
    assert expected == sorted(expected)  # monotone: the model's order, in objective units


def test_maximising_studies_are_recommended_their_highest_expected_value():
    rng = np.random.default_rng(3)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(3))
    study.optimize(
        lambda t: (
            -_truth(t.suggest_float("x", -1, 1), t.suggest_float("y", -1, 1))
            + 0.5 * rng.standard_normal()
        ),
        n_trials=60,
    )
    order = ranked(study.trials, ["maximize"])
    expected = [value for _, value in order]
    assert expected == sorted(expected, reverse=True)
    assert _truth(**recommend(study).params) < _truth(**study.best_trial.params)


def _trial(params: dict, value: float, dists: dict, **attrs) -> optuna.trial.FrozenTrial:
    return create_trial(params=params, distributions=dists, value=value, user_attrs=attrs)


def _line_study(lucky_repeats: int | None) -> list:
    """Twelve points on a line, true value 0 everywhere; x = 0.5 drew 1.0 below the rest,
    either once or (lucky_repeats) as the mean of that many runs."""
    dists = {"x": FloatDistribution(0.0, 1.0)}
    rng = np.random.default_rng(0)
    trials = [
        _trial({"x": float(x)}, float(0.3 * rng.standard_normal()), dists)
        for x in np.linspace(0, 1, 12)
        if abs(x - 0.5) > 0.01
    ]
    attrs = {} if lucky_repeats is None else {"repeat_values": [-1.0] * lucky_repeats}
    return [*trials, _trial({"x": 0.5}, -1.0, dists, **attrs)]


def test_repeats_lower_a_configurations_noise_so_the_model_trusts_it_more():
    once = recommendation(_line_study(None), ["minimize"])
    many = recommendation(_line_study(8), ["minimize"])
    assert many.trial.params == {"x": 0.5} and many.repeats == 8
    (once_value,) = [v for t, v in ranked(_line_study(None), ["minimize"]) if t.params["x"] == 0.5]
    (many_value,) = [v for t, v in ranked(_line_study(8), ["minimize"]) if t.params["x"] == 0.5]
    assert many_value < once_value  # closer to the -1.0 it observed eight times
    assert once.best_observed.params == {"x": 0.5}


def test_trials_of_the_same_params_pool_as_one_configuration():
    dists = {"x": IntDistribution(0, 20)}
    trials = [_trial({"x": x}, float(abs(x - 10)), dists) for x in range(21)]
    trials += [_trial({"x": 10}, 2.0, dists)]  # the same configuration, run again
    for number, t in enumerate(trials):
        t.number = number
    found = recommendation(trials, ["minimize"])
    assert found.trial.params == {"x": 10}
    assert found.repeats == 2 and found.observed == pytest.approx(1.0)
    assert found.trial.number == 10  # the better run of the two is the one named
    assert len(ranked(trials, ["minimize"])) == 21


def test_values_that_are_not_finite_are_never_recommended_and_nothing_raises():
    study = _noisy_study(4, n=30)
    dists = {"x": FloatDistribution(-1, 1), "y": FloatDistribution(-1, 1)}
    study.add_trial(_trial({"x": 0.3, "y": -0.2}, -math.inf, dists))
    study.add_trial(_trial({"x": 0.31, "y": -0.2}, math.inf, dists))
    chosen = recommend(study)
    assert math.isfinite(chosen.value)
    assert all(math.isfinite(v) for _, v in ranked(study.trials, ["minimize"]))


def test_a_few_trials_are_too_few_for_a_model_and_the_best_observed_stands():
    study = _noisy_study(5, n=4)
    found = recommendation(study.trials, ["minimize"])
    assert found.trial.number == study.best_trial.number == found.best_observed.number
    assert found.reason.startswith("only 4 configurations finished: too few")
    one = recommendation(study.trials[:1], ["minimize"])
    assert one.reason.startswith("only 1 configuration finished: too few")
    assert not found.modelled and not one.modelled


def test_too_few_for_a_model_a_configuration_run_several_times_pools_its_runs():
    """No model below ten configurations, but runs of one configuration (re-runs, --repeats)
    still pool: the lucky draw whose three re-runs came out worse is not named, and the pick
    is the one `ranked` (and so --confirm) puts first."""
    dists = {"x": FloatDistribution(0.0, 1.0)}
    values = [(0.9, -1.4), (0.1, 0.9), (0.2, 0.15), (0.9, 1.7), (0.9, 1.5), (0.9, 1.6)]
    trials = [_trial({"x": x}, v, dists) for x, v in values]
    for number, t in enumerate(trials):
        t.number = number
    found = recommendation(trials, ["minimize"])
    assert found.best_observed.number == 0
    assert found.trial.number == 2 == ranked(trials, ["minimize"])[0][0].number
    assert (found.observed, found.repeats, found.modelled) == (0.15, 1, False)
    assert "trial 0 observed 0.85 on average over 4 runs" in found.reason
    # One configuration run four times: the mean of its runs, said as such.
    alone = recommendation([t for t in trials if t.params["x"] == 0.9], ["minimize"])
    assert alone.repeats == 4 and alone.observed == pytest.approx(0.85)
    assert "also the best on average" in alone.reason
    # --repeats: a trial's value is the mean of its seeds, and counts as that many.
    repeated = recommendation(
        [_trial({"x": 0.5}, 0.4, dists, repeat_values=[0.3, 0.5])], ["minimize"]
    )
    assert repeated.repeats == 2


def test_something_other_than_a_study_is_named_in_the_error():
    for wrong in (None, "noisy_min"):
        with pytest.raises(TypeError, match=r"^recommend\(\) takes an optuna.Study .*not "):
            recommend(wrong)
        with pytest.raises(TypeError, match=r"^recommend_front\(\) takes an optuna.Study"):
            recommend_front(wrong)


def test_errors_are_the_ones_optunas_best_trial_raises():
    empty = optuna.create_study()
    with pytest.raises(ValueError):
        recommend(empty)
    failed = optuna.create_study()
    failed.add_trial(create_trial(state=TrialState.FAIL))
    with pytest.raises(ValueError):
        recommend(failed)
    two = optuna.create_study(directions=["minimize", "minimize"])
    with pytest.raises(RuntimeError):
        recommend(two)
    assert recommendation([], ["minimize"]) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: optuna.samplers.TPESampler(seed=0),
        lambda: optuna.samplers.CmaEsSampler(seed=0, warn_independent_sampling=False),
        lambda: optuna.samplers.GridSampler(
            {"lr": [1e-4, 1e-3, 1e-2], "layers": [1, 2, 3, 4], "act": ["relu", "tanh"]}, seed=0
        ),
        lambda: samplers.PSOSampler(seed=0),
    ],
    ids=["tpe", "cmaes", "grid", "pso"],
)
def test_studies_of_any_sampler_with_log_int_categorical_and_conditional_params(make, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, sampler=make())
    rng = np.random.default_rng(0)

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        layers = trial.suggest_int("layers", 1, 4)
        act = trial.suggest_categorical("act", ["relu", "tanh"])
        value = (math.log10(lr) + 3) ** 2 + 0.1 * layers + (act == "tanh")
        if act == "relu" and not isinstance(study.sampler, optuna.samplers.GridSampler):
            value += trial.suggest_float("slope", 0.0, 0.3)  # only some trials have it
        return value + 0.3 * float(rng.standard_normal())

    study.optimize(objective, n_trials=24)
    stored = optuna.load_study(study_name=study.study_name, storage=storage)
    chosen = recommend(stored)
    assert chosen.state == TrialState.COMPLETE
    assert chosen.number in {t.number for t in stored.trials}
    assert len(ranked(stored.trials, ["minimize"])) == len({str(t.params) for t in stored.trials})


def test_population_based_training_follows_the_best_trial_rule_for_segments():
    dists = {"lr": FloatDistribution(1e-4, 1e-1, log=True)}
    trials = []
    for number in range(16):
        generation = number // 4
        until = 2 * generation + 1  # later generations have trained further
        value = 0.1 * number if generation < 3 else 5.0 - number * 0.1
        t = create_trial(
            params={"lr": 10 ** -(1 + number % 3)},
            distributions=dists,
            value=value,
            user_attrs={
                lineage.PBT_GENERATION: generation,
                lineage.PBT_MEMBER: number % 4,
                lineage.TRAIN_UNTIL_EPOCH: until,
            },
        )
        trials.append(t)
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    expected = best_of_study(study)
    assert recommend(study).number == expected.number
    found = recommendation(study.trials, ["maximize"])
    assert found.trial.number == expected.number
    assert found.best_observed.number == pick_best(study.trials, ["maximize"]).number
    assert "population-based training" in found.reason


def test_several_objectives_recommend_the_front_of_the_models_expected_values():
    rng = np.random.default_rng(0)
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(0)
    )

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        x = trial.suggest_float("x", 0, 1)
        noise = 0.2 * rng.standard_normal(2)
        return x + noise[0], (1 - x) ** 2 + noise[1]

    study.optimize(objective, n_trials=40)
    front = recommend_front(study)
    numbers = [t.number for t in front]
    assert front and numbers == sorted(numbers)
    assert all(t.state == TrialState.COMPLETE for t in front)
    assert recommendation(study.trials, ["minimize", "minimize"]) is None
    # Too few for a model: the front of the observed values.
    few = optuna.create_study(directions=["minimize", "minimize"])
    few.add_trials(study.trials[:5])
    observed = {tuple(t.values) for t in few.best_trials}
    assert {tuple(t.values) for t in recommend_front(few)} == observed


def test_the_package_and_the_orchestrator_name_the_same_functions():
    assert orchestrator.recommend is samplers.recommend
    assert orchestrator.recommend_front is samplers.recommend_front
    categorical = CategoricalDistribution(["a", "b"])
    assert recommendation([_trial({"c": "a"}, 1.0, {"c": categorical})], ["minimize"]).trial
