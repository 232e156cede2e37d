"""`run ADAPTER`: create or resume a study and run it on this machine until its budget is used."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import adapters
from adapters.base import uses_torch
from orchestrator.commands.run_checks import check_spec, check_swarm, checked_options
from orchestrator.errors import UserError
from orchestrator.first_failures import watch_first_trials
from orchestrator.flags.checkpoints import add_checkpoint_arguments, checkpoint_settings
from orchestrator.flags.common import (
    add_adapter_arguments,
    add_output_arguments,
    add_storage_argument,
    command_parser,
    study_name,
)
from orchestrator.flags.config_file import add_config_argument
from orchestrator.flags.objectives import grid_of, objectives_of
from orchestrator.flags.study import add_search_arguments, add_size_arguments
from orchestrator.flags.trust import selection_of
from orchestrator.host_options import (
    HostOptions,
    add_host_arguments,
    check_host_options,
    check_storage_for_workers,
)
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import workload_class
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import StudySpec, count_trials, draw_seed, load_spec, save_spec
from samplers import sampler_kind

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

    from orchestrator import enqueue, intensify, launch
    from orchestrator.commands import population
    from orchestrator.enqueue import Queued
    from orchestrator.record.study import drift, settings_attrs
    from orchestrator.record.trials import tracking
else:
    optuna = LazyImport("optuna")
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    population = LazyImport("orchestrator.commands.population")
    enqueue = LazyImport("orchestrator.enqueue")
    intensify = LazyImport("orchestrator.intensify")
    launch = LazyImport("orchestrator.launch")
    drift = LazyImport("orchestrator.record.study.drift")
    settings_attrs = LazyImport("orchestrator.record.study.settings_attrs")
    tracking = LazyImport("orchestrator.record.trials.tracking")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "run",
        help="create or resume a study of ADAPTER and run its trials on this machine's GPUs",
        example="python -m orchestrator run dqn --trials 40 --gpus auto",
    )
    _add_study_arguments(parser)
    add_search_arguments(parser)
    add_checkpoint_arguments(parser)
    add_config_argument(parser)
    add_host_arguments(parser)
    add_output_arguments(parser)
    parser.set_defaults(handler=run_command)


def _add_study_arguments(parser: argparse.ArgumentParser) -> None:
    """What is tuned, where it is stored, and how big the study is."""
    parser.add_argument(
        "adapter",
        nargs="?",
        metavar="ADAPTER",
        help="dqn, ppo, tft, synthetic, or an installed one",
    )
    add_adapter_arguments(parser)
    parser.add_argument(
        "--study", metavar="NAME", type=study_name, help="study name (default: the adapter's name)"
    )
    add_storage_argument(parser)
    add_size_arguments(parser, confirm=True)


def run_command(args: argparse.Namespace) -> int:
    host = HostOptions.from_args(args)
    launch.configure(host)
    # Everything the user typed is checked before anything is stored.
    if not args.adapter and not args.adapter_path:
        raise UserError(
            "name an adapter (python -m orchestrator run dqn) or give --adapter-path module:attribute"
        )
    check_host_options(host)
    location = StorageLocation.resolve(args.storage)
    typed = typed_settings(args, location)
    spare, storage, (existing, spec, queue) = _open_and_read(args, typed, location)
    return launch.plan_and_run(
        location=location,
        storage=storage,
        adapter=typed.adapter,
        spec=spec,
        options=host,
        spare=spare,
        open_study=lambda: store_study(storage, existing, spec, study_of(args, typed), queue, args),
        selection=selection_of(args),
        callbacks=[watch_first_trials(existing, spec, study_of(args, typed))],
    )


def _open_and_read(
    args: argparse.Namespace, typed: TypedSettings, location: StorageLocation
) -> tuple[list[Any], BaseStorage, tuple[optuna.Study | None, StudySpec, list[Queued]]]:
    """The prestarted trial processes, the storage, and what `study_settings` read from it.

    The trial processes' imports (torch: 3 s of CPU) start as early as they can overlap the
    rest, and only where a trial may run: a `run` that finds its study's budget used (to see
    the result again) starts none. A new SQLite file holds no study, and creating its tables
    takes longest: they start before it is opened. Elsewhere the study is read first: tens of
    milliseconds where the tables exist; in a new server database creating them comes first
    (0.7 s on a quiet 2-core machine, 3 s under load), once per database."""
    with_torch = uses_torch(typed.adapter)
    path = location.sqlite_path
    spare = launch.prestart(with_torch) if path is not None and not path.exists() else None
    storage = launch.open_trials_storage(location)
    settings = study_settings(storage, args, typed, location.describe())
    if spare is None:
        existing, spec, queue = settings
        spare = launch.prestart_for(existing, spec, uses_torch=with_torch, queued=bool(queue))
    return spare, storage, settings


@dataclasses.dataclass(frozen=True)
class TypedSettings:
    """What `run` (or `slurm`) was given, checked before the storage is opened."""

    adapter: Any
    options: dict[str, Any]
    queue: list[Queued]
    mlflow_uri: str | None


def typed_settings(args: argparse.Namespace, location: StorageLocation) -> TypedSettings:
    """The adapter, its options and the parameter sets to queue, every flag checked: a one-line
    UserError before anything is opened or stored."""
    adapter = adapters.resolve(args.adapter_path or args.adapter, is_path=bool(args.adapter_path))
    options = checked_options(args, adapter)
    checkpoint_settings(args)  # a refused --artifacts is said before anything is opened
    check_storage_for_workers(location)
    queue = enqueue.planned_queue(
        adapter, options, defaults=args.enqueue_defaults, path=args.enqueue
    )
    workload_class(adapter.workload_class)  # $ORCHESTRATOR_WORKLOADS read before any file is made
    path = location.sqlite_path
    if path is not None and not path.exists():
        # No file yet, so no study: what it would be created with is checked before the file is.
        _check_new_spec(_new_spec(args, adapter, options), adapter)
    return TypedSettings(adapter, options, queue, tracking.tracking_uri_to_store(args.mlflow_uri))


def _check_new_spec(spec: StudySpec, adapter: Any) -> None:
    check_swarm(spec)
    population.check_population(spec, adapter)
    check_spec(spec)
    intensify.check_intensify(spec)


def study_settings(
    storage: BaseStorage, args: argparse.Namespace, typed: TypedSettings, label: str
) -> tuple[optuna.Study | None, StudySpec, list[Queued]]:
    """The study to resume (or None), the spec to store and the sets to queue: read, not stored."""
    existing, spec = _resolve_spec(storage, args, typed.adapter, typed.options, label)
    spec = spec.updated(
        mlflow_uri=typed.mlflow_uri,
        fuse=getattr(args, "fuse", None),  # stored: `worker` and slurm's tasks read it
        **checkpoint_settings(args),
    )
    check_spec(spec)
    intensify.check_intensify(spec)
    return existing, spec, _fitting_queue(typed.queue, existing, spec)


def study_of(args: argparse.Namespace, typed: TypedSettings) -> str:
    """The study's name: --study, else the adapter's."""
    return args.study or typed.adapter.name


def _fitting_queue(
    queue: list[Queued], existing: optuna.Study | None, spec: StudySpec
) -> list[Queued]:
    """The sets not queued before in this study, if the budget has room for them (else a UserError)."""
    trials = existing.get_trials(deepcopy=False) if existing is not None else []
    fresh = enqueue.not_yet_queued(queue, trials)
    count = count_trials(trials)
    room = spec.trials - count.counted - count.running - count.waiting
    if len(fresh) > max(0, room):
        raise UserError(
            f"{len(fresh)} parameter sets to enqueue but the budget has room for {max(0, room)} "
            f"more trials: raise --trials to {spec.trials - room + len(fresh)} or more"
        )
    return fresh


def _resolve_spec(
    storage: BaseStorage,
    args: argparse.Namespace,
    adapter: Any,
    options: dict[str, Any],
    label: str,
) -> tuple[optuna.Study | None, StudySpec]:
    """The study to resume (or None) and the spec this run will store: read only, checked."""
    name = args.study or adapter.name
    existing = None
    with contextlib.suppress(KeyError):
        existing = optuna.load_study(study_name=name, storage=storage)
    if existing is None:
        spec = _new_spec(args, adapter, options)
    else:
        spec = _resumed_spec(existing, name, args, adapter, options, label)
    check_swarm(spec)
    population.check_population(spec, adapter)
    return existing, spec


def _new_spec(args: argparse.Namespace, adapter: Any, options: dict[str, Any]) -> StudySpec:
    """A new study's spec: what was typed, the adapter's and its workload class's defaults, and
    StudySpec's for the rest."""
    grid = grid_of(args, adapter, options)  # --sampler grid: its budget is one walk of the grid
    grid_trials = grid.pop("trials", 0)
    return StudySpec.new(
        adapter=args.adapter_path or adapter.name,
        adapter_path=bool(args.adapter_path),
        trials=args.trials or grid_trials or int(getattr(adapter, "default_trials", 20)),
        epochs=args.epochs or workload_class(adapter.workload_class).default_epochs,
        options=options,
        **objectives_of(args, adapter, options),
        **grid,
        sampler=args.sampler,
        seed=args.seed if args.seed is not None else draw_seed(),
        swarm_size=args.swarm_size,
        # PBT replaces members itself: a pruner would stop segments about to be copied.
        pbt_keep=population.keep_names(args.pbt_keep),
        pruner=args.pruner or sampler_kind(args.sampler).default_pruner,  # the sampler's own
        max_retries=args.max_retries,
        repeats=args.repeats,
        intensify=args.intensify,
    )


def _resumed_spec(
    existing: optuna.Study,
    name: str,
    args: argparse.Namespace,
    adapter: Any,
    options: dict[str, Any],
    label: str,
) -> StudySpec:
    """A resumed study's stored spec, checked to be ours and this adapter's, with what was typed now."""
    adapter_ref = args.adapter_path or adapter.name
    spec = _wait_for_spec(existing)
    if spec is None:
        raise UserError(
            f"study {name!r} in {label} was not made by this tool: choose another --study name"
        )
    if spec.adapter != adapter_ref:
        raise UserError(
            f"study {name!r} tunes {spec.adapter!r}, not {adapter_ref!r}: choose another --study name"
        )
    if args.directions or args.objectives:
        asked = objectives_of(args, adapter, options)
        if asked["objectives"] != spec.objectives or asked["direction"] != spec.direction:
            raise UserError(
                f"study {name!r} optimises {', '.join(spec.objectives or [spec.direction])}: "
                "its objectives cannot change; choose another --study name"
            )
    counted = count_trials(existing.get_trials(deepcopy=False)).counted
    if args.trials is not None and args.trials < counted:
        raise UserError(
            f"study {name!r} already counts {counted} trials: give --trials {counted} "
            "or more to run more of it"
        )
    typed_now = {key: options[key] for key in options if _typed(key, args)}
    wanted = spec.updated(
        trials=args.trials,
        epochs=args.epochs,
        sampler=args.sampler,
        seed=args.seed,
        swarm_size=args.swarm_size,
        pbt_keep=population.keep_names(args.pbt_keep),
        pruner=args.pruner,
        max_retries=args.max_retries,
        repeats=args.repeats,
        intensify=args.intensify,
        options={**spec.options, **typed_now},
    )
    check_swarm(wanted)  # a value no study takes is said as such, not as a drift
    drifts = drift.differences(spec, wanted)
    if drifts and not args.update_settings:
        raise UserError(drift.drift_message(name, drifts))  # before anything starts or is stored
    return wanted


def store_study(
    storage: BaseStorage,
    existing: optuna.Study | None,
    spec: StudySpec,
    name: str,
    queue: Sequence[Queued] = (),
    args: argparse.Namespace | None = None,
) -> optuna.Study:
    """Create the study (or take the one resumed), store this run's spec with it, and queue the
    parameter sets to run first. The stored settings are checked again here: another run may
    have created the study, or updated its settings, since this one read them (`args`: whether
    --update-settings and --seed were given)."""
    update_settings = bool(args and args.update_settings)
    seed_typed = args is None or args.seed is not None

    study = existing or optuna.create_study(
        study_name=name, storage=storage, directions=spec.all_directions, load_if_exists=True
    )
    stored = load_spec(study) if existing is None and not seed_typed else None
    if stored is not None and stored.seed is not None:
        # Another run created the study a moment ago with a seed it drew: this run, which drew
        # its own and was given none, joins that one's sequence instead of refusing a drift.
        spec = dataclasses.replace(spec, seed=stored.seed)
    save_spec(study, spec, update_settings=update_settings)
    settings_attrs.show_settings(study, spec)  # one user attribute per setting
    enqueue.enqueue(study, queue)
    return study


def _wait_for_spec(study: optuna.Study, seconds: float = 10.0) -> StudySpec | None:
    """The study's spec; a study with no spec and no trials may be one another process is creating
    this very moment (create_study and save_spec are two steps), so give it a few seconds."""
    deadline = time.monotonic() + seconds
    while True:
        spec = load_spec(study)
        if spec is not None or study.trials or time.monotonic() > deadline:
            return spec
        time.sleep(0.5)


def _typed(key: str, args: argparse.Namespace) -> bool:
    """Was this option typed now (so it replaces the stored one on resume)?"""
    typed = {item.partition("=")[0].strip() for item in args.option}
    typed |= {flag for flag in ("env", "data") if getattr(args, flag) is not None}
    return key in typed
