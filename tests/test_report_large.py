"""A large study's report stays cheap: the slice and contour draw a sample of the completed trials
(the best always among them) and say so, PED-ANOVA is asked once per study and not once per
chart, and each GPU's timeline is computed once for the page and its PNG."""

from __future__ import annotations

import datetime as dt
import random

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.show import importance
from orchestrator.show.report import optuna_plots as plots
from orchestrator.show.report.charts import gpu_charts, objective_charts
from orchestrator.show.views import StudyDetail


def test_a_sample_is_every_trial_up_to_the_limit_then_the_best_and_a_fixed_draw():
    assert plots.sample_numbers([5, 1, 3], best=3, limit=3) == [1, 3, 5]
    numbers = list(range(3000))
    sample = plots.sample_numbers(numbers, best=2999, limit=1000)
    assert len(sample) == len(set(sample)) == 1000
    assert 2999 in sample and sample == sorted(sample)
    assert sample == plots.sample_numbers(numbers, best=2999, limit=1000)  # report after report
    assert len(plots.sample_numbers(numbers, best=None, limit=10)) == 10
    assert max(sample) - min(sample) > 2500  # spread over the study, not its first trials


def _study(n: int) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    rng = random.Random(1)
    dists = {"x": FloatDistribution(-5, 5), "y": FloatDistribution(-5, 5)}
    start = dt.datetime(2026, 12, 1, 12)
    trials = []
    for number in range(n):
        x, y = rng.uniform(-5, 5), rng.uniform(-5, 5)
        trial = create_trial(
            state=TrialState.COMPLETE, value=(x - 1) ** 2 + y**2, params={"x": x, "y": y},
            distributions=dists, user_attrs={"gpu": "Simulated GPU 24 GB", "gpu_index": 0,
                                             "host": "vm", "vram_peak_mb": 900.0},
        )  # fmt: skip
        trial.datetime_start = start + dt.timedelta(seconds=2 * number)
        trial.datetime_complete = trial.datetime_start + dt.timedelta(seconds=1)
        trials.append(trial)
    study.add_trials(trials)
    return study


def _points(figure) -> int:
    return sum(len(trace.x) for trace in figure.data if trace.type == "scatter" and trace.x)


def test_the_slice_and_contour_of_a_large_study_draw_a_sample_and_say_so():
    study = _study(plots.MAX_PLOTTED + 200)
    charts = {chart.key: chart for chart in objective_charts(study, "loss")}
    expected = f"{plots.MAX_PLOTTED:,} of the {plots.MAX_PLOTTED + 200:,} completed trials"
    assert expected in charts["slice"].note and expected in charts["contour"].note
    assert "the best always among them" in charts["slice"].note
    assert _points(charts["slice"].figure) == 2 * plots.MAX_PLOTTED  # a panel per parameter
    drawn, sampled = plots.plotted(study)
    assert study.best_trial.number in {t.number for t in drawn.trials}
    assert sampled is not None and drawn.direction == study.direction


def test_a_small_study_draws_every_trial_with_the_old_note():
    study = _study(40)
    charts = {chart.key: chart for chart in objective_charts(study, "loss")}
    assert charts["slice"].note.endswith("; each dot a completed trial")
    assert _points(charts["slice"].figure) == 2 * 40
    assert plots.plotted(study) == (study, None)


def test_ped_anova_is_asked_once_per_study_until_it_grows(monkeypatch):
    calls = []
    real = optuna.importance.PedAnovaImportanceEvaluator.evaluate

    def counting(self, study, params=None, *, target=None):
        calls.append(len(study.trials))
        return real(self, study, params=params, target=target)

    monkeypatch.setattr(optuna.importance.PedAnovaImportanceEvaluator, "evaluate", counting)
    study = _study(60)
    objective_charts(study, "loss")  # importances chart, parallel, slice and contour rankings
    assert calls == [60]
    first = optuna.importance.get_param_importances(
        study, evaluator=importance.importance_evaluator()
    )
    assert calls == [60] and set(first) == {"x", "y"}
    study.add_trials(_study(1).trials)  # a study that grows is asked again
    optuna.importance.get_param_importances(study, evaluator=importance.importance_evaluator())
    assert calls == [60, 61]


def test_the_timeline_s_values_travel_with_its_chart_for_the_png():
    study = _study(30)
    detail = StudyDetail(name="s", adapter=None, direction="minimize", budget=30, epochs=1,
                         sampler=None, states={}, counted=30, retried=0, best=None, workers=[],
                         concurrency_events=[], ooms=[], vram=[], vram_by_gpu=[],
                         memory_lines=[])  # fmt: skip
    timeline, memory = gpu_charts(study, detail)
    lanes, until = timeline.data
    assert [len(lane.bars) for lane in lanes] == [30]
    assert until == max(t.datetime_complete for t in study.trials)
    assert memory.data[0] == lanes and memory.data[2] == until
