"""Parameter importances: the evaluator every chart and ranking uses, and when there are too few
trials to say anything."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.show.text import plural

if TYPE_CHECKING:
    import optuna
    from optuna.importance import BaseImportanceEvaluator
    from optuna.trial import FrozenTrial
else:
    optuna = LazyImport("optuna")

# Importances need enough completed trials to say anything; below this the chart is a note.
MIN_TRIALS_FOR_IMPORTANCE = 8


# What PED-ANOVA said of each study still alive: the report asks the same question of the same
# trials up to six times (the chart, its PNG, the parameters ranked for three more charts).
_ANSWERS: weakref.WeakKeyDictionary[Any, dict[tuple, dict[str, float]]] = (
    weakref.WeakKeyDictionary()
)


def importance_evaluator() -> BaseImportanceEvaluator:
    # Made when asked for: its base class is Optuna's, which loads on first use.
    class RememberingEvaluator(optuna.importance.BaseImportanceEvaluator):
        """PED-ANOVA, its answer kept per study and per count of trials (a study that grows
        is asked again)."""

        def __init__(self) -> None:
            # PED-ANOVA needs no scikit-learn (fANOVA, Optuna's default, does).
            self.inner = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=0.25)

        def evaluate(
            self,
            study: optuna.Study,
            params: list[str] | None = None,
            *,
            target: Callable[[FrozenTrial], float] | None = None,
        ) -> dict[str, float]:
            if target is not None:  # one objective of several: not kept
                return self.inner.evaluate(study, params=params, target=target)
            key = (None if params is None else tuple(params), len(study.get_trials(deepcopy=False)))
            answers = _ANSWERS.setdefault(study, {})
            if key not in answers:
                answers[key] = self.inner.evaluate(study, params=params)
            return dict(answers[key])

    return RememberingEvaluator()


def importance_note(done: int) -> str:
    """Why the importances chart is missing with only `done` completed trials."""
    return (
        f"skipped: {plural(done, 'completed trial')}, "
        f"importances need at least {MIN_TRIALS_FOR_IMPORTANCE}"
    )
