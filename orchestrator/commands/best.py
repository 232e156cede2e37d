"""`best`: the recommended trial's parameters, ready for a training run (YAML), with the scores
to trust beside its value (JSON and text: the best observed trial beside it and why they differ,
validation, test, baselines, the spread over seeds); for a study of several objectives, its
Pareto front (each trial's values and parameters, and whether it is on the front of the model's
expected values).

The recommended trial is the configuration the study's model expects best
(orchestrator/show/recommended.py); the best observed value is the luckiest of many noisy runs.

`best --confirm K` re-runs the K best configurations by the model on more seeds, tests the first,
as `run --confirm K` does at a study's end, and stores it with the study
(orchestrator/selection.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.flags.common import add_storage_argument, command_parser, study_name
from orchestrator.flags.trust import add_confirm_arguments, check_confirm
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.optuna_private import storage_of, study_id_of
from orchestrator.record.study.final_scores import final_scores_of
from orchestrator.record.study.spec import load_spec
from orchestrator.selection import DEFAULT_CONFIRM_SEEDS, Selection, finish_study

if TYPE_CHECKING:
    import optuna
    import yaml

    from adapters import study_adapter
    from orchestrator.record.checkpoints import files as checkpoint_files
    from orchestrator.record.checkpoints import lineage as checkpoint_lineage
    from orchestrator.record.trials import best as best_trials
    from orchestrator.show import final_scores_text, queries, views
    from orchestrator.show import front as show_front
    from orchestrator.show import recommended as show_recommended
    from orchestrator.show import text as show_text
else:
    optuna = LazyImport("optuna")
    yaml = LazyImport("yaml")
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    study_adapter = LazyImport("adapters.study_adapter")
    checkpoint_files = LazyImport("orchestrator.record.checkpoints.files")
    checkpoint_lineage = LazyImport("orchestrator.record.checkpoints.lineage")
    best_trials = LazyImport("orchestrator.record.trials.best")
    final_scores_text = LazyImport("orchestrator.show.final_scores_text")
    show_front = LazyImport("orchestrator.show.front")
    show_recommended = LazyImport("orchestrator.show.recommended")
    queries = LazyImport("orchestrator.show.queries")
    show_text = LazyImport("orchestrator.show.text")
    views = LazyImport("orchestrator.show.views")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "best",
        help="write the recommended trial's parameters, beside the best observed one "
        "(several objectives: the Pareto front)",
        example="python -m orchestrator best --study dqn --format yaml --out dqn-best.yaml",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        type=study_name,
        help="the study to read (default: the storage's only study)",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "--format",
        choices=("json", "yaml", "text"),
        default="json",
        help="json (default): the recommended trial, its parameters, the best observed trial "
        "and the scores to trust; yaml: the recommended parameters alone, for a training run; "
        "text: both, for a person",
    )
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    add_confirm_arguments(parser, at_the_end=False)
    parser.set_defaults(handler=best_command)


def format_params(params: Any, fmt: str) -> str:
    """The parameters as a JSON object or a YAML mapping, in the order they were declared."""
    if fmt == "yaml":
        return yaml.safe_dump(params, sort_keys=False, default_flow_style=False)
    return json.dumps(params, indent=2) + "\n"


def best_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    storage = queries.open_for_reading(location)
    name = queries.the_study(storage, args.study, location.describe(), "best")
    detail = queries.study_detail(storage, name, location.describe())
    if detail.direction == views.MULTI_OBJECTIVE:
        if args.confirm is not None:
            raise UserError(
                f"study {name!r} has several objectives: its Pareto front has no one trial to "
                "confirm and test; leave --confirm out"
            )
        return _write(args, *_front(storage, name, args.format))
    if detail.best is None:
        complete = detail.states.get("COMPLETE", 0)
        advice = "wait for one" if not complete else "fix the objective and run more trials"
        raise UserError(
            f"study {name!r} has {views.no_best_yet(complete)}: {advice} "
            f"(`python -m orchestrator status --study {name}` shows its progress)"
        )
    if args.confirm is None and args.confirm_seeds is not None:
        check_confirm(args, None)
    scores = _confirmed(storage, name, args) if args.confirm is not None else None
    if scores is None:
        scores = _stored_scores(storage, name)
    best, about = _chosen(storage, name, detail, scores)
    params = best.params
    weights = _weights(storage, name, best)
    if weights is not None:
        about += f"; its final weights: {weights}"
    rec = detail.recommended
    if args.format == "text":
        text = ""
        if rec is not None and best.number != rec.trial:  # a confirmation ranked another first
            text = f"trial #{best.number}, selected by the confirmation; the model's view below\n"
        text += "".join(f"{key}: {value}\n" for key, value in params.items())
        text += "".join(
            f"{line}\n" for line in (show_recommended.lines(rec, detail.metric) if rec else [])
        )
        said = (
            final_scores_text.final_score_lines(scores, valued_now=detail.valued) if scores else []
        )
        text += "".join(f"{line}\n" for line in said)
        text += "".join(f"{line}\n" for line in _lineage_lines(detail.lineage, best.number))
    elif args.format == "yaml":
        text = format_params(params, args.format)
    else:
        text = json.dumps(_record(detail, best, scores, weights), indent=2) + "\n"
    return _write(args, text, about)


def _record(detail: Any, best: Any, scores: Any, weights: str | None) -> dict[str, Any]:
    """`best`'s JSON: the trial to deploy at the top (`trial`, `value`, `params`: the
    recommended one, or the one a confirmation ranked first), the model's view of it under
    `recommended`, and the trial with the best observed value under `best_observed`."""
    observed = detail.best
    record = {
        "trial": best.number,
        "value": best.value,
        "params": best.params,
        "recommended": None if detail.recommended is None else detail.recommended.as_dict(),
        "best_observed": {
            "trial": observed.number,
            "value": observed.value,
            "params": observed.params,
        },
        "final_scores": None if scores is None else scores.as_dict(),
        "weights": weights,
    }
    if detail.lineage is not None and best.number == observed.number:
        record["lineage"] = detail.lineage  # population-based training: params over epochs
    return record


def _lineage_lines(lineage: dict[str, Any] | None, number: int) -> list[str]:
    """Population-based training: the winning lineage's schedule and where its weights are."""
    if lineage is None or lineage["trials"][-1] != number:
        return []
    weights = lineage["weights"]
    where = "no checkpoint saved" if weights is None else json.dumps(weights)
    lines = [f"lineage (trials {', '.join(map(str, lineage['trials']))}):"]
    return [
        *lines,
        *(f"  {line}" for line in checkpoint_lineage.schedule_text(lineage["schedule"])),
        f"weights: {where}",
    ]


def _chosen(storage: Any, name: str, detail: Any, scores: Any) -> tuple[Any, str]:
    """The trial to hand out, and the line that says which: the recommended trial (the
    configuration the study's model expects best; the best observed one where there is no
    model's view), unless a confirmation on more seeds ranked another first (its mean is the
    better-founded figure)."""
    best, rec = detail.best, detail.recommended
    if rec is not None:
        chosen = best if rec.same else _trial(storage, name, rec.trial)
        about = show_recommended.about(rec, name)
    else:
        chosen, about = best, f"best of {name!r}: trial #{best.number}, value {best.value:.6g}"
    if scores is None or not scores.confirmed or scores.selected_trial == chosen.number:
        return chosen, about
    if scores.complete_trials != detail.valued:  # trials completed since: the model decides
        return (
            chosen,
            about + f"; a confirmation older than the study ranked #{scores.selected_trial} first",
        )
    first = scores.confirmed[0]
    trial = _trial(storage, name, scores.selected_trial)
    return trial, (
        f"selected in {name!r}: trial #{trial.number}, ranked first on {len(first.values)} seeds "
        f"(mean {first.mean:.6g}); {about}"
    )


def _trial(storage: Any, name: str, number: int) -> Any:
    """Trial `number` of the study, as the views hold a best trial."""
    study = optuna.load_study(study_name=name, storage=storage)
    trial = storage_of(study).get_trial(
        storage_of(study).get_trial_id_from_study_id_trial_number(study_id_of(study), number)
    )
    return views.BestTrial(
        trial.number, float(trial.value), dict(trial.params), dict(trial.user_attrs)
    )


def _weights(storage: Any, name: str, best: Any) -> str | None:
    """Where the trial's final checkpoint is kept (docs/checkpoints.md), if it still is."""
    saved = best.user_attrs.get("checkpoint")
    if not isinstance(saved, dict) or not isinstance(saved.get("artifact_id"), str):
        return None
    location = checkpoint_files.study_location(optuna.load_study(study_name=name, storage=storage))
    if location is None:
        return None
    path = checkpoint_files.where(location, saved["artifact_id"])
    if "://" not in path and not Path(path).is_file():
        return None  # dropped: a better trial's weights replaced it
    return path


def _stored_scores(storage: Any, name: str) -> Any:
    return final_scores_of(optuna.load_study(study_name=name, storage=storage).user_attrs)


def _confirmed(storage: Any, name: str, args: argparse.Namespace) -> Any:
    """`--confirm K`: the selection scored now, stored with the study."""
    study = optuna.load_study(study_name=name, storage=storage)
    spec = load_spec(study)
    if spec is None:
        raise UserError(
            f"study {name!r} was not made by this tool: --confirm needs the adapter and "
            "options it was run with"
        )
    adapter = study_adapter.resolve_adapter(spec)
    check_confirm(args, adapter)
    selection = Selection(args.confirm, args.confirm_seeds or DEFAULT_CONFIRM_SEEDS)
    scores = finish_study(study, spec, adapter, selection, reuse=False)
    if scores is None:
        print(
            f"study {name!r}: adapter {adapter.name!r} has no test part or baselines to score",
            file=sys.stderr,
        )
    return scores


def _front(storage: Any, name: str, fmt: str) -> tuple[str, str]:
    """The study's Pareto front in `fmt`, and the line that says what it is."""
    study = optuna.load_study(study_name=name, storage=storage)
    directions = best_trials.directions_of(study)
    names = show_front.objective_names(study.metric_names, len(directions))
    front = show_front.front_of(study.get_trials(deepcopy=False), directions, study.metric_names)
    if not front:
        raise UserError(
            f"study {name!r} has no completed trial yet: wait for one "
            f"(`python -m orchestrator status --study {name}` shows its progress)"
        )
    goals = ", ".join(f"{n} ({d[:3]})" for n, d in zip(names, directions, strict=True))
    about = f"Pareto front of {name!r}: {len(front)} trial(s), {goals}"
    # The front of what the model expects of each configuration: the luck of one run set apart.
    expected = show_recommended.front_of(study)
    if fmt == "text":
        said = ", ".join(f"#{n}" for n in expected) or "none (the model could not say)"
        return show_front.front_table(front, names) + f"front of expected values: {said}\n", about
    # Both fronts, each trial once by number: a configuration the model puts on its front of
    # expected values may lie off the observed one (a run less lucky than its neighbours).
    observed = {t.number for t in front}
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    shown = sorted(observed | set(expected))
    rows = [
        {
            "trial": n,
            "values": dict(zip(names, by_number[n].values, strict=True)),
            "params": by_number[n].params,
            "observed_front": n in observed,
            "expected_front": n in expected,
        }
        for n in shown
    ]
    return format_params(show_text.to_jsonable(rows), fmt), about


def _write(args: argparse.Namespace, text: str, about: str) -> int:
    if args.out is None:
        sys.stdout.write(text)
        print(about, file=sys.stderr)
        return 0
    path = Path(args.out)
    try:
        path.write_text(text)
    except OSError as error:
        raise UserError(
            f"cannot write {path}: {error.strerror or error}; choose a writable path with --out"
        ) from None
    print(f"{about}; parameters written to {path}", file=sys.stderr)
    return 0
