"""The Python API: a plain Optuna objective through the VRAM-gated pools, in the calls Optuna users know.

    import orchestrator

    def objective(trial, device):          # a module-level function: trial processes import it
        lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        batch = trial.suggest_int("batch_size", 64, 4096, log=True)
        ...                                 # train on `device`, trial.report(value, epoch)
        return loss

    if __name__ == "__main__":             # trial processes start by importing this module
        study = orchestrator.optimize(
            objective, n_trials=40, memory_model=(1500, 0.5), batch_sizes=(64, 4096)
        )
        print(study.best_params)

`optimize` does what `python -m orchestrator run` does, with the same storage, budget and records:
`n_trials` is the study's total (run it again with more to resume), trials run in warm trial
processes admitted by their memory on every GPU of this host (`gpus="sim:24576"` simulates one),
and other nodes join with `python -m orchestrator worker --study NAME --storage URL` when the
objective's module is importable there. It returns the `optuna.Study`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import samplers
from adapters import base as adapter_base
from adapters import objective as adapter_objective
from adapters import study_adapter
from orchestrator import host_options
from orchestrator.api_checks import (
    check_arguments,
    check_artifacts,
    check_host,
    said_as_api,
)
from orchestrator.errors import UserError
from orchestrator.first_failures import ObjectiveRaised, RaiseAtFirstFailure
from orchestrator.imports import LazyImport
from orchestrator.intensify import intensify_problem
from orchestrator.planning import host_plan
from orchestrator.record.store import optuna_objects
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study import adoption, settings_attrs
from orchestrator.record.study.objectives import check_directions, parse_names, plan_objectives
from orchestrator.record.study.spec import (
    PRUNERS,
    StudySpec,
    load_spec,
    pruner_for,
    save_spec,
    set_metric_names,
)
from orchestrator.record.trials.best import directions_of

if TYPE_CHECKING:
    import optuna

    import orchestrator.launch as launch
    from orchestrator.planning.planner import NodePlan
    from orchestrator.show import recommended as show_recommended
else:
    optuna = LazyImport("optuna")
    launch = LazyImport("orchestrator.launch")  # the pool and its processes: 40 modules
    show_recommended = LazyImport("orchestrator.show.recommended")


def optimize(
    objective: Callable[..., Any],
    *,
    n_trials: int,
    study_name: str | None = None,
    storage: str | None = None,
    gpus: str = "auto",
    memory_model: tuple[float, float] = (0.0, 0.0),
    batch_sizes: tuple[int, int] | None = None,
    direction: str = "minimize",
    directions: Sequence[str] | None = None,
    metric: str = "value",
    objectives: Sequence[str] | str | None = None,
    sampler: str | optuna.samplers.BaseSampler = StudySpec.sampler,
    pruner: str | optuna.pruners.BasePruner = StudySpec.pruner,
    callbacks: Sequence[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] = (),
    seed: int | None = None,
    swarm_size: int = StudySpec.swarm_size,
    epochs: int = 1,
    max_retries: int = StudySpec.max_retries,
    intensify: int = 0,
    catch: Iterable[type[Exception]] | type[Exception] = (),
    **host: Any,
) -> optuna.Study:
    """Run `objective(trial, device)` or `objective(trial)` until the study holds `n_trials`.

    `memory_model` is (overhead MB, MB per sample): what one trial needs on a GPU at a batch
    size, which admission counts by; `batch_sizes` is the (low, high) range the objective draws
    "batch_size" from (log scale), drawn before it runs so the trial is admitted by its bytes.
    `epochs`: the pruners' resource, when the objective reports once per epoch. `directions`
    (one per value the objective returns) makes a study of several objectives; `objectives`
    names them and may add "vram_peak_mb" and "seconds", which every trial measures
    (orchestrator.record.study.objectives). `sampler` and `pruner` are names or Optuna objects;
    `callbacks` are called as `callback(study, frozen_trial)` here for every trial that
    finishes; `intensify` trials re-run the recommended one (orchestrator/intensify.py). The
    objective's first error is raised here unless it is one of `catch`. `host`: `run`'s flags
    about this host by their Python names (concurrency, timeout, log_dir, quiet, ...)."""

    ref = adapter_objective.objective_ref(objective)
    caught = check_arguments(
        n_trials=n_trials, epochs=epochs, max_retries=max_retries, swarm_size=swarm_size,
        seed=seed, study_name=study_name, memory_model=memory_model, batch_sizes=batch_sizes,
        catch=catch, callbacks=callbacks, objective=objective, sampler=sampler,
    )  # fmt: skip
    names, all_directions = _objectives(objectives, directions, metric=metric, direction=direction)
    several = len(all_directions) > 1
    spec = StudySpec(
        adapter=ref, adapter_path=True, objective=True, metric=metric, trials=n_trials,
        epochs=epochs, direction=all_directions[0],
        directions=all_directions if several else None, objectives=names if several else None,
        options=_options(memory_model, batch_sizes), seed=seed, swarm_size=swarm_size,
        max_retries=max_retries, intensify=intensify, **_sampler_and_pruner(sampler, pruner),
    )  # fmt: skip
    check_spec(spec)
    name = study_name or default_study_name(objective)
    first = RaiseAtFirstFailure(caught, getattr(objective, "__module__", None))
    try:  # the objective's error is raised outside the pools, once they have stopped
        return _run(spec, name, storage, gpus, host, [first, *callbacks])
    except ObjectiveRaised as raised:
        raise raised.error from None


def _check_intensify(spec: StudySpec) -> None:
    value = spec.intensify
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"intensify={value!r}: give a whole number, e.g. intensify=4")
    problem = intensify_problem(value, spec)
    if problem:
        raise ValueError(f"intensify={value} {problem}")


def _options(memory_model: tuple[float, float], batch_sizes: tuple[int, int] | None) -> dict:
    low, high = batch_sizes if batch_sizes is not None else (0, 0)
    return {
        "overhead_mb": float(memory_model[0]),
        "per_sample_mb": float(memory_model[1]),
        "batch_size_min": int(low),
        "batch_size_max": int(high),
    }


def default_study_name(objective: Callable[..., Any]) -> str:
    """`mlp:objective`: the objective's module (a script's file name) and its name, so that two
    scripts sharing a database do not share a study by accident."""

    module = objective.__module__
    if module in ("__main__", "__mp_main__"):
        path = getattr(sys.modules.get(module), "__file__", None)
        module = Path(path).stem if path else "main"
    return f"{module}:{objective.__qualname__}"


def _objectives(
    objectives: Sequence[str] | str | None,
    directions: Sequence[str] | None,
    *,
    metric: str,
    direction: str,
) -> tuple[list[str], list[str]]:
    if isinstance(directions, str) or (directions is not None and not list(directions)):
        raise ValueError(f"directions={directions!r}: give a list, as in ['maximize', 'minimize']")
    check_directions([direction])  # a ValueError naming it when it is neither
    if isinstance(objectives, str):
        objectives = parse_names(objectives, "objectives")
    return plan_objectives(objectives, directions, metric=metric, direction=direction)


def _sampler_and_pruner(sampler: Any, pruner: Any) -> dict[str, Any]:
    """The spec's sampler and pruner fields: a name, or an Optuna object pickled with its class."""
    chosen: dict[str, Any] = {"sampler": sampler, "pruner": pruner}
    if isinstance(sampler, optuna.samplers.BaseSampler):
        chosen["sampler"] = optuna_objects.sampler_label(sampler)
        chosen["sampler_pickle"] = optuna_objects.pickled(sampler, "sampler")
    elif not isinstance(sampler, str):
        raise ValueError(f"sampler={sampler!r}: give a sampler's name or an Optuna sampler")
    if isinstance(pruner, optuna.pruners.BasePruner):
        chosen["pruner"] = type(pruner).__name__
        chosen["pruner_pickle"] = optuna_objects.pickled(pruner, "pruner")
    elif not isinstance(pruner, str) or pruner not in PRUNERS:
        raise ValueError(f"pruner={pruner!r}: give an Optuna pruner or one of {', '.join(PRUNERS)}")
    return chosen


def _with_checkpoints(spec: StudySpec, host: dict[str, Any]) -> StudySpec:
    """The spec with `checkpoint_every` and `artifacts`, when given among the keyword
    arguments (docs/checkpoints.md: an objective of three arguments gets the trial's handle)."""

    every = host.pop("checkpoint_every", spec.checkpoint_every)
    artifacts = check_artifacts(host.pop("artifacts", None)) or spec.artifacts
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ValueError(f"checkpoint_every={every!r} must be a whole number of epochs, 0: never")
    return spec.updated(checkpoint_every=every, artifacts=artifacts)


def check_spec(spec: StudySpec) -> None:
    """Everything about the spec that can be wrong, found before anything is stored: the
    sampler for this many objectives, the pruner, and settings that must be stored as JSON."""

    if spec.sampler_pickle is None:
        samplers.make_sampler(
            spec.sampler,
            seed=spec.seed,
            swarm_size=spec.swarm_size,
            n_objectives=len(spec.all_directions),
            grid=spec.grid,
        )
    pruner_for(spec)
    try:
        json.dumps(spec.to_attr())
    except TypeError as error:
        raise ValueError(f"the study's settings must be plain values: {error}") from None


def plan(
    *,
    gpus: str = "auto",
    memory_model: tuple[float, float] = (0.0, 0.0),
    batch_sizes: tuple[int, int] = (adapter_base.BATCH_SIZE_MIN, adapter_base.BATCH_SIZE_MAX),
    cpu_bound: bool = False,
    swarm_size: int = StudySpec.swarm_size,
    concurrency: int | None = None,
    n_trials: int | None = None,
) -> NodePlan:
    """What this host would run: per GPU, the trials at once and the batch sizes that fit."""
    return host_plan.host_plan(
        gpus,
        adapter_base.MemoryModel(float(memory_model[0]), float(memory_model[1])),
        cpu_bound=cpu_bound,
        swarm_size=swarm_size,
        concurrency=concurrency,
        budget_trials=n_trials,
        batch_bounds=(batch_sizes[0], batch_sizes[1]),
    ).plan


def _fuse_text(text: str) -> int | str:
    try:
        return host_options.fuse_setting(text)
    except argparse.ArgumentTypeError:
        raise ValueError(
            f"fuse={text!r} must be 'auto' or a whole number from 1 to {host_options.MAX_FUSE}"
        ) from None


def _run(
    spec: Any,
    name: str,
    storage: str | None,
    gpus: str,
    host: dict[str, Any],
    callbacks: list[Callable[..., None]],
) -> Any:
    spec = _with_checkpoints(spec, host)
    _check_intensify(spec)
    check_host(
        {"gpus": gpus, **host}, lambda: sorted(f.name for f in fields(host_options.HostOptions))
    )
    if isinstance(host.get("log_dir"), PathLike):
        host["log_dir"] = str(host["log_dir"])
    if isinstance(host.get("fuse"), str):  # "auto", " 4 ", "AUTO": as `--fuse` and a config take
        host["fuse"] = _fuse_text(host["fuse"])
    with said_as_api():
        settings = host_options.HostOptions(
            gpus=gpus, quiet=quiet_by_default(host.pop("quiet", None)), **host
        )
        host_options.check_host_options(settings)
        location = StorageLocation.resolve(storage)
        host_options.check_storage_for_workers(location)
    spec = spec.updated(fuse=settings.fuse)  # stored with the study, as `run --fuse` stores it
    adapter = study_adapter.resolve_adapter(spec)  # the objective imports here, or says why not
    spare, opened = launch.open_for_trials(location, uses_torch=adapter_base.uses_torch(adapter))
    existing, spec = _resume(opened, name, spec)
    launch.execute(
        location=location,
        storage=opened,
        adapter=adapter,
        spec=spec,
        options=settings,
        open_study=lambda: _store(opened, name, spec, existing),
        spare=spare,
        callbacks=callbacks,
    )
    study = optuna.load_study(study_name=name, storage=opened)
    if not settings.quiet:
        say_recommended(study)
    return study


def say_recommended(study: optuna.Study, stream: Any = None) -> None:
    """The last lines on stderr: the recommended trial beside the best observed one
    (orchestrator/show/recommended.py), as `run` ends."""
    trials = study.get_trials(deepcopy=False)
    rec = show_recommended.recommended_of(trials, directions_of(study))
    if rec is None:
        return
    metric = study.metric_names[0] if study.metric_names else "value"
    for line in show_recommended.lines(rec, metric):
        print(f"[{study.study_name}] {line}", file=stream or sys.stderr)


def quiet_by_default(quiet: bool | None, stream: Any = None) -> bool:
    """`quiet` as given; left out, quiet unless `stream` (stderr, where progress is drawn) is a
    terminal: as study.optimize, progress is shown where someone watches, and a script run
    by cron, CI or `> out.log 2>&1` stays quiet."""

    if quiet is not None:
        return bool(quiet)
    stream = sys.stderr if stream is None else stream
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # not a file, or a closed one
        return True


def _resume(storage: Any, name: str, spec: Any) -> tuple[Any, Any]:
    """The study to resume (None: a new one) and the spec to store, once an existing study of
    that name is checked to tune the same objective (its budget becomes `n_trials`, as
    `run --trials` does), or, made by plain Optuna, to have the same directions and search
    space (orchestrator.record.study.adoption)."""

    existing = None
    with contextlib.suppress(KeyError):
        existing = optuna.load_study(study_name=name, storage=storage)
    if existing is None:
        return None, spec
    stored = load_spec(existing)
    if stored is None:
        problem = adoption.adoption_problem(existing, spec)
        if problem:
            raise UserError(f"study {name!r} cannot be adopted: {problem}")
        return existing, spec
    if stored.adapter != spec.adapter:
        raise UserError(
            f"study {name!r} tunes {stored.adapter}, not {spec.adapter}: give another study_name"
        )
    if stored.all_directions != spec.all_directions:
        raise UserError(
            f"study {name!r} has directions {', '.join(stored.all_directions)}, not "
            f"{', '.join(spec.all_directions)}: give the same, or another study_name"
        )
    return existing, spec


def _store(storage: Any, name: str, spec: Any, existing: Any) -> Any:
    """The study, created (or the one resumed or adopted) with the spec stored and its metric
    names set; a new study whose spec cannot be stored is deleted again, so a corrected call
    is not refused because of it."""
    if existing is not None:
        save_spec(existing, spec)
        settings_attrs.show_settings(existing, spec)  # one user attribute per setting
        set_metric_names(existing, spec)
        return existing
    study = optuna.create_study(
        study_name=name, storage=storage, directions=spec.all_directions, load_if_exists=True
    )
    try:
        save_spec(study, spec)
        settings_attrs.show_settings(study, spec)
        set_metric_names(study, spec)
    except BaseException:
        if not study.trials:
            optuna.delete_study(study_name=name, storage=storage)
        raise
    return study
