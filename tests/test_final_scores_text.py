"""The scores to trust as a person reads them: run's last line, the note, the report's section."""

from __future__ import annotations

from orchestrator.record.study.final_scores import Confirmed, FinalScores
from orchestrator.result import Outcome, outcome_lines
from orchestrator.show.final_scores_text import (
    final_score_lines,
    final_scores_html,
    final_scores_markdown,
    side_by_side,
)

BASELINES = {
    "buy_and_hold": {"validation": 0.63, "test": 0.85},
    "flat": {"validation": 0.0, "test": 0.0},
    "random": {"validation": -0.29, "test": 0.02},
}
SCORES = FinalScores(
    selected_trial=7,
    validation=1.26,
    metric="sharpe",
    validation_values=[1.5, 1.02],
    validation_std=0.24,
    seeds=2,
    test=0.41,
    test_std=0.3,
    test_values=[0.71, 0.11],
    baselines=BASELINES,
)


def _outcome(**changes) -> Outcome:
    values = {
        "study_name": "dqn", "budget": 4, "counted": 4, "best_value": 1.26, "best_trial": 7,
        "best_params": {"gamma": 0.9}, "ooms": 0, "interrupted": False, "complete": 4,
    }  # fmt: skip
    return Outcome(**{**values, **changes})


def test_run_ends_with_validation_test_and_buy_and_hold_side_by_side():
    lines = outcome_lines(_outcome(final=SCORES), metric="sharpe", as_json=False)
    assert lines[-1] == (
        "sharpe: validation 1.26 +- 0.24 over 2 seeds (trial #7), test 0.41 +- 0.3; "
        "buy-and-hold: validation 0.63, test 0.85"
    )
    assert outcome_lines(_outcome(), metric="sharpe", as_json=False)[-1] == "  gamma = 0.9"


def test_a_confirmation_s_mean_is_the_validation_figure():
    confirmed = [
        Confirmed(3, 1.1, [0.9, 0.7, 0.8], 0.8, 0.08),
        Confirmed(7, 1.26, [1, 0, 0.5], 0.5, 0.4),
    ]
    scores = FinalScores(3, 1.1, "sharpe", seeds=3, test=0.2, test_std=0.1, confirmed=confirmed)
    assert side_by_side(scores).startswith("sharpe: validation 0.8 +- 0.08 over 3 seeds (trial #3)")
    lines = final_score_lines(scores)
    assert (
        lines[1]
        == "confirmed on 3 seeds, best first: #3 0.8 +- 0.08 (was 1.1), #7 0.5 +- 0.4 (was 1.26)"
    )


def test_a_confirmation_that_ranks_another_trial_first_names_it_and_its_params_at_run_s_end():
    confirmed = [
        Confirmed(3, 1.1, [0.9, 0.7, 0.8], 0.8, 0.08),
        Confirmed(7, 1.26, [1, 0, 0.5], 0.5, 0.4),
    ]
    scores = FinalScores(
        3, 1.1, "sharpe", seeds=3, confirmed=confirmed, complete_trials=4,
        selected_params={"gamma": 0.95},
    )  # fmt: skip
    lines = outcome_lines(_outcome(final=scores), metric="sharpe", as_json=False)
    at = lines.index(
        "selected by the confirmation: trial #3 (ranked first on 3 seeds; "
        "`best --format yaml` writes its parameters)"
    )
    assert lines[at + 1] == "  gamma = 0.95" and lines[-1].endswith("(trial #3)")
    # Where it ranks the shown trial first, nothing more is said.
    same = FinalScores(7, 1.26, "sharpe", seeds=3, confirmed=confirmed[::-1], complete_trials=4)
    said = outcome_lines(_outcome(final=same), metric="sharpe", as_json=False)
    assert not any(line.startswith("selected by") for line in said)
    assert final_score_lines(scores)[0].startswith(
        "selected by the confirmation (ranked first on 3 seeds): trial #3"
    )


def test_scores_older_than_the_study_say_so():
    scores = FinalScores(7, 1.26, "sharpe", complete_trials=24)
    assert len(final_score_lines(scores, valued_now=24)) == len(final_score_lines(scores))
    older = final_score_lines(scores, valued_now=26)[1]
    assert older.startswith("scored when the study had 24 completed trials, it has 26 now")
    assert "`best --confirm 0`" in older


def test_several_objectives_end_with_the_front_not_with_nothing_completed():
    lines = outcome_lines(
        _outcome(best_trial=None, best_value=None, pareto_front=3), metric="x", as_json=False
    )
    assert "no trial has completed yet" not in "\n".join(lines)
    assert lines[-1].startswith("Pareto front: 3 trials") and "best --study dqn" in lines[-1]
    single = outcome_lines(_outcome(best_trial=None, pareto_front=1), metric="x", as_json=False)
    assert single[-1].startswith("Pareto front: 1 trial (")
    nothing = outcome_lines(_outcome(best_trial=None), metric="x", as_json=False)
    assert nothing[-1] == "no trial has completed yet"


def test_the_note_and_the_report_hold_a_row_per_baseline():
    note = final_scores_markdown(SCORES)
    assert "| trial #7 | 1.26 +- 0.24 over 2 seeds | 0.41 +- 0.3 |" in note
    assert "| buy-and-hold | 0.63 | 0.85 |" in note and "| random | -0.29 | 0.02 |" in note
    page = final_scores_html(SCORES)
    assert "<td>buy-and-hold</td><td>0.63</td><td>0.85</td>" in page
    assert final_scores_html(None) == ""
    untested = FinalScores(1, 2.0, "a<b>")  # no test part, no baselines: what it has
    assert "a&lt;b&gt;" in final_scores_html(untested) and "<td>-</td>" in final_scores_html(
        untested
    )
