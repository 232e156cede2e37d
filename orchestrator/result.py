"""What `run` and `worker` end with: the study's outcome, printed on stdout as lines or JSON.

stdout is kept for the result alone (`keep_stdout_for_the_result`): whatever else writes to it
once a run starts (an adapter's module, a library) goes to stderr, so `--json` output stays JSON.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.imports import LazyImport
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.best import best_of_study, directions_of, pareto_front
from orchestrator.record.trials.logs import reserve_stdout
from orchestrator.show.final_scores_text import side_by_side
from orchestrator.show.recommended import lines as recommended_lines
from orchestrator.show.recommended import markdown, recommended_of

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study import note
    from orchestrator.record.study.final_scores import FinalScores
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.show.recommended import Recommended
else:
    note = LazyImport("orchestrator.record.study.note")  # optuna-dashboard's, at the end only


@dataclass(frozen=True)
class Outcome:
    study_name: str
    budget: int
    counted: int
    best_value: float | None
    best_trial: int | None
    best_params: dict[str, Any]
    ooms: int
    interrupted: bool
    complete: int = 0
    pruned: int = 0
    failed: int = 0  # final failures: each counts against the budget
    retried: int = 0  # failed and run again (out of memory, stopped, lost): the re-run counts
    pareto_front: int = 0  # trials on the Pareto front of a study of several objectives
    final: FinalScores | None = None  # the selection scored at the study's end (selection.py)
    # The trial to deploy: the configuration the model expects best (show/recommended.py);
    # best_* above is the best observed value, the luckiest run.
    recommended: Recommended | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study_name,
            "trials": self.budget,
            "counted": self.counted,
            "best_value": self.best_value,
            "best_trial": self.best_trial,
            "best_params": self.best_params,
            "complete": self.complete,
            "pruned": self.pruned,
            "failed": self.failed,
            "retried": self.retried,
            "ooms": self.ooms,
            "interrupted": self.interrupted,
            "pareto_front": self.pareto_front,
            "final_scores": None if self.final is None else self.final.as_dict(),
            "recommended": None if self.recommended is None else self.recommended.as_dict(),
        }


def outcome_of(study: optuna.Study, spec: StudySpec, *, interrupted: bool) -> Outcome:
    """The study as it stands once this host's pool has stopped."""
    trials = study.get_trials(deepcopy=False)
    best = best_of_study(study)
    count = count_trials(trials)
    directions = directions_of(study)
    front = pareto_front(trials, directions) if len(directions) > 1 else []
    recommended = recommended_of(trials, directions) if best else None
    if recommended is not None:
        metric = study.metric_names[0] if study.metric_names else "value"
        note.write_study_note(study, markdown(recommended, metric))  # the dashboard's study page
    return Outcome(
        study_name=study.study_name,
        budget=spec.trials,
        counted=count.counted,
        best_value=best.value if best else None,
        best_trial=best.number if best else None,
        best_params=dict(best.params) if best else {},
        ooms=sum(1 for t in trials if t.user_attrs.get(names.OOM)),
        interrupted=interrupted,
        complete=count.complete,
        pruned=count.pruned,
        failed=count.failed,
        retried=count.retried,
        pareto_front=len(front),
        recommended=recommended,
    )


def outcome_lines(outcome: Outcome, *, metric: str, as_json: bool) -> list[str]:
    """The result as a person (or, with --json, a script) reads it."""
    if as_json:
        return [json.dumps(outcome.as_dict(), indent=2, default=str)]
    state = "interrupted" if outcome.interrupted else "done"
    lines = [
        f"study {outcome.study_name!r}: {outcome.counted}/{outcome.budget} trials {state} "
        f"({outcome.complete} complete, {outcome.pruned} pruned, {outcome.failed} failed"
        f"{f'; {outcome.retried} failed and re-run' if outcome.retried else ''}), "
        f"{outcome.ooms} out-of-memory"
    ]
    if outcome.pareto_front:
        n = outcome.pareto_front
        return [
            *lines,
            f"Pareto front: {n} trial{'' if n == 1 else 's'} (`python -m orchestrator best "
            f"--study {outcome.study_name} --format text` lists them)",
        ]
    if outcome.best_trial is None:
        return [*lines, "no trial has completed yet"]
    rec = outcome.recommended
    if rec is None or rec.same:
        lines.append(f"best trial #{outcome.best_trial}: {metric} = {outcome.best_value:.6g}")
        said = [] if rec is None else [f"recommended: the same trial ({rec.reason})"]
    else:  # the trial to deploy, its parameters, then the best observed one and why they differ
        first, *said = recommended_lines(rec, metric)
        lines.append(first)
    for name, value in (outcome.best_params if rec is None else rec.params).items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        lines.append(f"  {name} = {shown}")
    lines += said
    final = outcome.final
    shown = outcome.best_trial if rec is None else rec.trial
    if final is not None and final.confirmed and final.selected_trial != shown:
        # The confirmation's re-runs ranked another trial first: that is the one to deploy.
        lines.append(
            f"selected by the confirmation: trial #{final.selected_trial} (ranked first on "
            f"{len(final.confirmed[0].values)} seeds; `best --format yaml` writes its parameters)"
        )
        for name, value in final.selected_params.items():
            lines.append(f"  {name} = {f'{value:.6g}' if isinstance(value, float) else value}")
    if final is not None:
        lines.append(side_by_side(final))
    return lines


def print_outcome(outcome: Outcome, *, metric: str, as_json: bool) -> None:
    out = _RESULT[0] if _RESULT else sys.stdout
    try:
        for line in outcome_lines(outcome, metric=metric, as_json=as_json):
            out.write(line + "\n")
    finally:
        out.flush()


_RESULT: list[TextIO] = []  # the stream the result is printed to (see keep_stdout_for_the_result)


def keep_stdout_for_the_result() -> None:
    """From here on stdout holds the result alone; other writes to it go to stderr (once a process)."""
    if not _RESULT:
        stream = reserve_stdout()
        if stream is not sys.stdout:  # a real file: keep it for the result
            _RESULT.append(stream)
