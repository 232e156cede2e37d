"""Scores to trust for the trial a study selected: confirmed on more seeds, tested once.

A study's best value is the best of many noisy runs, picked on the part of the data it is then
quoted on. At the end of a study (`run --confirm K`, and `best --confirm K` any time after):

1. the K best configurations by the study's model (`samplers/_model/recommend.ranked`, not the
   K luckiest runs) are trained again with `seeds` seeds each (the adapter's `seed` option,
   seed .. seed + seeds - 1, as `--repeats` does; seeds a configuration already ran on in the
   study are not trained again) and ranked again on the mean: the re-run that decides is the
   intensification step of SMAC and similar tuners;
2. the trial ranked first is trained again with each seed on everything before the test part and
   scored once on the test part, which no trial has seen (`adapter.final_scores`);
3. the adapter's baselines are scored on the same validation and test parts.

With K = 0 only steps 2 and 3 run, with the study's own seed, for the recommended trial. An adapter without a test part or
baselines gives what it has. The result is stored with the study (`record/study/final_scores`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters import metric_name
from adapters.repeats import REPEAT_VALUES_ATTR, seeded
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import workload_class
from orchestrator.record.checkpoints.lineage import is_segment
from orchestrator.record.study.final_scores import (
    Confirmed,
    FinalScores,
    final_scores_of,
    is_current,
    save_final_scores,
    valued_trials,
)
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna.trial import FrozenTrial

    from orchestrator.record.checkpoints import files as checkpoint_files
    from orchestrator.record.study import note
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.show import final_scores_text
    from orchestrator.show import recommended as show_recommended
    from samplers._model import recommend
else:
    optuna = LazyImport("optuna")
    torch = LazyImport("torch")
    # Used when scores are stored; `--help` loads this module (the flags name a Selection).
    note = LazyImport("orchestrator.record.study.note")
    final_scores_text = LazyImport("orchestrator.show.final_scores_text")
    show_recommended = LazyImport("orchestrator.show.recommended")
    recommend = LazyImport("samplers._model.recommend")
    checkpoint_files = LazyImport("orchestrator.record.checkpoints.files")

logger = logging.getLogger(__name__)

DEFAULT_CONFIRM_SEEDS = 3


@dataclass(frozen=True)
class Selection:
    """What a study's end scores: `run --confirm K --confirm-seeds S`, and `best --confirm`."""

    top: int = 0
    seeds: int = DEFAULT_CONFIRM_SEEDS


def scores_anything(adapter: Any, selection: Selection) -> bool:
    """Whether there is more to say than the study's own best value: a test part, baselines, or
    a confirmation asked for. Plain adapters (a test function, a supervised model) have none."""
    return bool(
        selection.top
        or callable(getattr(adapter, "final_scores", None))
        or callable(getattr(adapter, "baselines", None))
    )


def trains_at_the_end(spec: StudySpec, adapter: Any, selection: Selection) -> bool:
    """Whether `finish_study` will train in this process: a single objective (a Pareto front has
    no one trial to test) and something to score."""
    return len(spec.all_directions) == 1 and scores_anything(adapter, selection)


def scoring_device(adapter: Any) -> torch.device:
    """Where the end-of-study runs train, in the process that ran the study: RL is CPU-bound
    (its trials run on CPU cores too); anything else on the first CUDA GPU when there is one."""
    kind = getattr(adapter, "workload_class", "supervised")
    if workload_class(kind).cpu_bound or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 0)


def finish_study(
    study: optuna.Study,
    spec: StudySpec,
    adapter: Any,
    selection: Selection,
    *,
    reuse: bool = True,
) -> FinalScores | None:
    """Score the study's selection (when the adapter has anything to score) and store it with the
    study, and in its optuna-dashboard note; None when nothing was scored. `reuse`: scores stored
    for the same selection are kept instead (`run` on a study whose budget was used already)."""
    if not trains_at_the_end(spec, adapter, selection):
        return None
    stored = _still_current(study, spec, selection) if reuse else None
    if stored is not None:
        return stored  # a run that found the budget used: its end was scored already
    what = (
        f"confirming the top {selection.top} trials on {selection.seeds} seeds, then testing "
        "the first"
        if selection.top
        else "testing the best trial on the part no trial saw, and the baselines"
    )
    logger.info("study %r: %s", study.study_name, what)
    scores = score_selection(
        study,
        spec,
        adapter,
        scoring_device(adapter),
        top=selection.top,
        seeds=selection.seeds,
    )
    if scores is not None:
        save_final_scores(study, scores)
        trials = study.get_trials(deepcopy=False)
        rec = show_recommended.recommended_of(trials, spec.all_directions)
        head = "" if rec is None else show_recommended.markdown(rec, scores.metric) + "\n"
        note.write_study_note(study, head + final_scores_text.final_scores_markdown(scores))
    return scores


def progress(what: str, epochs: int, metric: str) -> Callable[[int, float], None]:
    """A report that prunes nothing (re-runs are not trials of the study) and says, epoch by
    epoch, how the run is getting on: the test run trains as long as a trial, and a silent
    half hour looks like a hang."""
    started = time.monotonic()

    def report(step: int, value: float) -> None:
        seconds = time.monotonic() - started
        logger.info(
            "%s: epoch %d/%d, %s %.4g (%.0f s)", what, step + 1, epochs, metric, value, seconds
        )

    return report


@contextlib.contextmanager
def _no_trial_log() -> Iterator[None]:
    """An adapter writes each report to its trial's log (stdout); here the progress line says it."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def _completed(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The completed trials with a finite value: those a selection chooses from."""
    return [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.value is not None
        and math.isfinite(t.value)
    ]


def top_trials(trials: list[FrozenTrial], direction: str, count: int) -> list[FrozenTrial]:
    """The `count` best configurations by the study's model, best first, each as the trial the
    model names for it (samplers/_model/recommend.ranked): not the luckiest runs. By observed
    value where the model has no view (population-based training's segments)."""
    done = _completed(trials)
    if done and not any(is_segment(t) for t in done):
        try:
            ranked = recommend.ranked(done, [direction])
        except (ValueError, ArithmeticError) as error:
            logger.warning("ranking by observed values: the model could not be fitted (%s)", error)
            ranked = []
        if ranked:
            return [trial for trial, _ in ranked[: max(count, 1)]]
    sign = -1.0 if direction == "maximize" else 1.0
    return sorted(done, key=lambda t: (sign * float(t.value), t.number))[: max(count, 1)]


def runs_by_seed(trial: FrozenTrial, trials: list[FrozenTrial]) -> dict[int, float]:
    """What the trial's configuration scored in the study, by seed offset: its own runs (seed,
    seed + 1, ... with --repeats) and those of every completed trial with the same parameters,
    `--intensify`'s re-runs among them, each on the seeds its `seed_offset` says."""
    runs: dict[int, float] = {}
    for other in sorted(_completed(trials), key=lambda t: t.number):
        if other.number != trial.number and other.params != trial.params:
            continue
        stored = other.user_attrs.get(REPEAT_VALUES_ATTR)
        values = stored if isinstance(stored, list) and stored else [other.value]
        first = int(other.user_attrs.get(names.SEED_OFFSET, 0) or 0)
        for i, value in enumerate(values):
            runs.setdefault(first + i, float(value))
    return runs


def confirm(
    adapter: Any,
    spec: StudySpec,
    trials: list[FrozenTrial],
    device: torch.device,
    *,
    top: int,
    seeds: int,
) -> list[Confirmed]:
    """The `top` configurations by the model re-run with `seeds` seeds each, ranked again on
    their mean. The seeds a configuration already ran on in the study (its own, its --repeats,
    its --intensify re-runs) are not trained again: their scores are taken as stored."""
    confirmed = []
    metric = str(metric_name(adapter, spec.options))
    for trial in top_trials(trials, spec.direction, top):
        runs = runs_by_seed(trial, trials)
        for offset in (o for o in range(seeds) if o not in runs):
            what = f"confirming trial #{trial.number}, seed {offset + 1}/{seeds}"
            with _no_trial_log():
                runs[offset] = float(
                    adapter.train(
                        trial.params,
                        epochs=spec.epochs,
                        device=device,
                        options=seeded(spec.options, offset),
                        report=progress(what, spec.epochs, metric),
                    )
                )
        values = [runs[offset] for offset in range(seeds)]
        mean, std = _spread(values)
        confirmed.append(Confirmed(trial.number, float(trial.value), values, mean, std))
        logger.info("trial #%d confirmed on %d seeds: %.4g +- %.3g", trial.number, seeds, mean, std)
    sign = -1.0 if spec.direction == "maximize" else 1.0
    return sorted(confirmed, key=lambda c: (sign * c.mean, c.trial))


def may_train_at_the_end(
    study: optuna.Study, spec: StudySpec, adapter: Any, selection: Selection
) -> bool:
    """Whether `finish_study` may train once this run's trials end: it trains at the end
    (`trains_at_the_end`), and the study has budget left or no stored scores that answer
    `selection` (a run that finds the budget used and scored trains nothing)."""
    if not trains_at_the_end(spec, adapter, selection):
        return False
    used = count_trials(study.get_trials(deepcopy=False)).finished(spec.trials)
    return not (used and _still_current(study, spec, selection) is not None)


def _still_current(study: optuna.Study, spec: StudySpec, selection: Selection) -> Any:
    """The stored scores, when no trial has completed since they were scored and they answer
    what is asked now (no confirmation, or the same one)."""
    stored = final_scores_of(study.user_attrs)
    if stored is None:
        return None
    same_trials = is_current(stored, study.get_trials(deepcopy=False))
    same_ask = not selection.top or (
        selection.top == len(stored.confirmed) and selection.seeds == stored.seeds
    )
    return stored if same_trials and same_ask else None


def _test_score(
    adapter: Any,
    spec: StudySpec,
    selected: FrozenTrial,
    device: Any,
    offset: int,
    runs: int,
    study: optuna.Study,
) -> float:
    """One test run of the selected trial, its progress said as a trial's (when the adapter's
    final_scores takes a report), from the trial's final weights where the adapter scores them
    (`scores_kept_weights`: its `final_scores` takes them as `final_state`) and the study kept
    them."""
    kwargs: dict[str, Any] = {}
    takes = inspect.signature(adapter.final_scores).parameters
    scores_weights = getattr(adapter, "scores_kept_weights", None)
    if offset == 0 and callable(scores_weights) and scores_weights(spec.options):
        state = final_state(study, spec, selected)
        if state is not None:
            kwargs["final_state"] = state
            logger.info(
                "test run of trial #%d: its final weights, as the study kept them", selected.number
            )
    if "report" in takes:
        what = f"test run of trial #{selected.number}" + (
            f", seed {offset + 1}/{runs}" if runs > 1 else ""
        )
        metric = str(metric_name(adapter, spec.options))
        kwargs["report"] = progress(what, spec.epochs, metric)
    with _no_trial_log():
        scores = adapter.final_scores(
            selected.params,
            epochs=spec.epochs,
            device=device,
            options=seeded(spec.options, offset),
            **kwargs,
        )
    return float(scores["test"])


def final_state(study: optuna.Study, spec: StudySpec, trial: FrozenTrial) -> dict[str, Any] | None:
    """What `trial` saved after its last epoch, where the study kept it and it is the run a test
    run would train again: one run on the study's own seed (not `--repeats`, nor a re-run on
    another seed). None otherwise, or when it cannot be read (the test run then trains)."""
    saved = checkpoint_files.recorded(trial)
    one_run = not trial.user_attrs.get(REPEAT_VALUES_ATTR)
    own_seed = not int(trial.user_attrs.get(names.SEED_OFFSET, 0) or 0)
    if saved is None or saved.epoch != spec.epochs - 1 or not (one_run and own_seed):
        return None
    location = checkpoint_files.study_location(study)
    if location is None:
        return None
    try:
        return checkpoint_files.read(checkpoint_files.open_store(location), saved)
    except Exception as error:  # gone (not among the leaders), unreadable, a store away
        logger.info("trial #%d: its final weights cannot be read (%s)", trial.number, error)
        return None


def score_selection(
    study: optuna.Study,
    spec: StudySpec,
    adapter: Any,
    device: torch.device,
    *,
    top: int = 0,
    seeds: int = DEFAULT_CONFIRM_SEEDS,
) -> FinalScores | None:
    """Steps 1-3 of the module's docstring; None while no trial has completed."""

    trials = study.get_trials(deepcopy=False)
    if not top_trials(trials, spec.direction, 1):
        return None
    confirmed = confirm(adapter, spec, trials, device, top=top, seeds=seeds) if top else []
    selected = (
        next(t for t in trials if t.number == confirmed[0].trial)
        if confirmed
        else top_trials(trials, spec.direction, 1)[0]
    )
    # Tested on as many seeds as its value stands on: the confirmation's, else the study's repeats.
    runs = seeds if confirmed else max(1, int(getattr(spec, "repeats", 1) or 1))
    test_values: list[float] = []
    if callable(getattr(adapter, "final_scores", None)):
        for offset in range(runs):
            test_values.append(_test_score(adapter, spec, selected, device, offset, runs, study))
    baselines = (
        adapter.baselines(spec.options) if callable(getattr(adapter, "baselines", None)) else {}
    )
    test, test_std = _spread(test_values) if test_values else (None, None)
    metric = metric_name(adapter, spec.options)

    # Its validation: every run of its configuration in the study (--repeats, --intensify).
    seen = list(runs_by_seed(selected, trials).values())
    several = len(seen) > 1
    return FinalScores(
        selected_trial=selected.number,
        validation=statistics.fmean(seen) if several else float(selected.value),
        validation_values=seen if several else [],
        validation_std=statistics.pstdev(seen) if several else None,
        metric=str(metric),
        seeds=runs,
        test=test,
        test_std=test_std,
        test_values=test_values,
        confirmed=confirmed,
        baselines=baselines,
        complete_trials=valued_trials(trials),
        selected_params=dict(selected.params),
    )
