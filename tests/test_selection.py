"""The selected trial's trusted scores: confirmed on more seeds, tested on the untouched part,
baselines beside; stored with the study and read back."""

from __future__ import annotations

import optuna
import pytest
import torch

from adapters import dqn
from adapters._rl import frame as _rl
from orchestrator.record.study.final_scores import final_scores_of, save_final_scores
from orchestrator.record.study.spec import StudySpec
from orchestrator.selection import score_selection, top_trials
from orchestrator.show.final_scores_text import final_score_lines

CPU = torch.device("cpu")
OPTIONS = {**dqn.adapter.options, "steps_per_epoch": 300, "seed": 3}


@pytest.fixture(scope="module")
def study_and_spec():
    spec = StudySpec(adapter="dqn", trials=3, epochs=1, direction="maximize", options=OPTIONS)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    study.optimize(lambda t: dqn.adapter.objective(t, CPU, 1, OPTIONS), n_trials=3)
    return study, spec


def test_top_trials_are_the_best_completed_ones_first(study_and_spec):
    study, _ = study_and_spec
    values = sorted((t.value for t in study.trials), reverse=True)
    top = top_trials(study.trials, "maximize", 2)
    assert [t.value for t in top] == values[:2]


@pytest.fixture(scope="module")
def confirmed(study_and_spec):
    study, spec = study_and_spec
    return score_selection(study, spec, dqn.adapter, CPU, top=2, seeds=2)


def test_confirmation_reruns_the_top_trials_on_more_seeds_and_tests_the_first(
    study_and_spec, confirmed
):
    study, _ = study_and_spec
    scores = confirmed
    assert scores is not None and len(scores.confirmed) == 2
    assert {c.trial for c in scores.confirmed} == {
        t.number for t in top_trials(study.trials, "maximize", 2)
    }
    means = [c.mean for c in scores.confirmed]
    assert means == sorted(means, reverse=True)  # ranked again on the mean
    assert scores.selected_trial == scores.confirmed[0].trial
    first = scores.confirmed[0]
    # Seed 0 of the confirmation is the study's own seed: it reproduces the trial's value.
    assert first.values[0] == pytest.approx(first.validation)
    assert len(scores.test_values) == 2 and scores.test is not None
    assert scores.baselines == _rl.baselines(OPTIONS)
    assert scores.metric == "sharpe"

    save_final_scores(study, scores)
    assert final_scores_of(study.user_attrs) == scores  # stored and read back whole
    text = "\n".join(final_score_lines(scores))
    assert (
        f"trial #{scores.selected_trial}" in text and "test (a part no trial saw, 2 seeds)" in text
    )
    assert "buy-and-hold" in text


def test_without_confirmation_only_the_best_is_tested_once(study_and_spec, caplog, capsys):
    study, spec = study_and_spec
    with caplog.at_level("INFO", logger="orchestrator.selection"):
        scores = score_selection(study, spec, dqn.adapter, CPU, top=0)
    assert scores.confirmed == [] and len(scores.test_values) == 1
    assert scores.selected_trial == study.best_trial.number
    # The test run says how it gets on, epoch by epoch, as a trial does (not in silence).
    said = [r.getMessage() for r in caplog.records]
    best = study.best_trial.number
    for epoch in range(1, spec.epochs + 1):
        assert any(
            m.startswith(f"test run of trial #{best}: epoch {epoch}/{spec.epochs}, sharpe ")
            for m in said
        ), said
    assert capsys.readouterr().out == ""  # the adapter's log lines stay out of the result
