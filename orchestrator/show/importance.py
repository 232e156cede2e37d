"""Parameter importances: the evaluator every chart and ranking uses, and when there are too few
trials to say anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.importance import PedAnovaImportanceEvaluator

# Importances need enough completed trials to say anything; below this the chart is a note.
MIN_TRIALS_FOR_IMPORTANCE = 8


def importance_evaluator() -> PedAnovaImportanceEvaluator:
    # PED-ANOVA needs no scikit-learn (fANOVA, Optuna's default, does).
    from optuna.importance import PedAnovaImportanceEvaluator

    return PedAnovaImportanceEvaluator(target_quantile=0.25)


def importance_note(done: int) -> str:
    """Why the importances chart is missing with only `done` completed trials."""
    from orchestrator.show.text import plural

    return (
        f"skipped: {plural(done, 'completed trial')}, "
        f"importances need at least {MIN_TRIALS_FOR_IMPORTANCE}"
    )
