"""What `run` and `worker` share: open the study, plan this host's GPUs, run the pool, say the result."""

from __future__ import annotations

import dataclasses
import logging
import signal
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from adapters import metric_name
from adapters.base import fusing_pays_on, memory_model_of, uses_torch
from adapters.study_adapter import resolve_adapter
from orchestrator.errors import UserError
from orchestrator.flags.common import configure_logging
from orchestrator.imports import LazyImport, import_in_background
from orchestrator.planning.host_plan import host_plan
from orchestrator.planning.memory import save_learnt_model
from orchestrator.planning.workloads import workload_class
from orchestrator.record.spool.spool import deliver_kept
from orchestrator.record.study.spec import count_trials, set_metric_names
from orchestrator.record.trials.retry import stale_trial_callback
from orchestrator.record.trials.tracking import tracker_for
from orchestrator.result import keep_stdout_for_the_result, outcome_of, print_outcome
from orchestrator.run.pool import processes as pool_processes
from orchestrator.run.pool import signals as pool_signals
from orchestrator.run.pool.placement import FUSE_AUTO, auto_group_size
from orchestrator.run.pool.progress import make_progress
from orchestrator.run.pool.trial_endings import TrialsCannotStart
from orchestrator.run.trial.member import unfused_because
from orchestrator.selection import finish_study, may_train_at_the_end

if TYPE_CHECKING:
    import optuna
    import sqlalchemy

    from orchestrator import intensify
    from orchestrator.host_options import HostOptions
    from orchestrator.planning.host_plan import HostPlan
    from orchestrator.planning.planner import GpuPlan
    from orchestrator.record.store import migrate
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.result import Outcome
    from orchestrator.run.pool import loop as pool_loop
    from orchestrator.selection import Selection
else:
    optuna = LazyImport("optuna")
    sqlalchemy = LazyImport("sqlalchemy")
    # Ours, loading SQLAlchemy and Optuna as they load: a command checks its input first.
    migrate = LazyImport("orchestrator.record.store.migrate")
    intensify = LazyImport("orchestrator.intensify")
    pool_loop = LazyImport("orchestrator.run.pool.loop")

logger = logging.getLogger(__name__)


def plan_host(
    *,
    location: StorageLocation,
    adapter: Any,
    spec: StudySpec,
    options: HostOptions,
    sim_dir: str | None = None,
) -> HostPlan:
    """Find this host's GPUs and plan them for the adapter; a model that fits nowhere is a UserError."""

    host = host_plan(
        options.gpus,
        memory_model_of(adapter, spec.options),
        cpu_bound=workload_class(adapter.workload_class).cpu_bound,
        swarm_size=spec.swarm_size,
        concurrency=options.concurrency,
        budget_trials=spec.trials,
        stored_models=(location, adapter.name),
        sim_dir=sim_dir,
    )
    for gpu in host.plan.gpus:
        where = gpu.device.label if gpu.device else "no GPU (CPU only)"
        if not gpu.fits:
            raise UserError(
                f"{where}: one trial needs about {gpu.per_trial_mb:.0f} MB but only "
                f"{gpu.usable_mb:.0f} MB are usable; use a bigger GPU or a smaller model"
            )
    return host


def run_pool(
    *,
    location: StorageLocation,
    storage: Any,
    study: optuna.Study,
    spec: StudySpec,
    host: HostPlan,
    options: HostOptions,
    spare: list[Any] | None = None,
    callbacks: Sequence[Callable[..., None]] = (),
) -> Outcome:
    """Run the study's trials on this host's planned GPUs until its budget is used (`spare`:
    trial processes prestarted by `orchestrator.run.pool.processes.prestart`; `callbacks`: called as
    `callback(study, frozen_trial)` for each trial that finishes meanwhile)."""

    adapter = resolve_adapter(spec)
    metric = metric_name(adapter, spec.options)
    callbacks = [*callbacks, *intensify.callbacks_for(location, spec)]  # re-runs, on any host
    for gpu in host.plan.gpus:
        log_plan(gpu)
    _prepare_tracking(spec, study.study_name, metric)
    set_metric_names(study, spec, metric)
    progress = _progress(options)
    finished = FinishedTrials(study, callbacks) if callbacks else None
    asked = options.fuse if options.fuse is not None else spec.fuse
    fuse = fused_members(adapter, spec, asked, host.plan.gpus)
    pool = pool_loop.Pool.on_storage(
        storage_location=location,
        engine=storage.engine,
        study=study,
        spec=spec,
        plans=list(host.plan.gpus),
        probe=host.probe,
        cpu_cores=host.plan.cpu_cores,
        cpu_bound=host.cpu_bound,
        settings=dataclasses.replace(options.trial_settings(location), fuse=fuse),
        spare=spare,
        adapter=adapter,
        fuse=fuse,
        auto_fuse=asked == FUSE_AUTO and fuse > 1,
        timeout_s=options.timeout,
        grace_s=options.grace,
        metric=metric,
        on_update=_updates(progress, finished),
    )
    final = None
    try:
        result = pool.run()
        final = pool.snapshot()
        if finished is not None:
            finished.call()  # the trials that finished after the last update
    except TrialsCannotStart as error:
        raise UserError(str(error)) from None
    finally:
        if progress:
            progress.close(final)  # restores the terminal even when the pool raised
    learnt = [(s.gpu_name, s.footprint) for s in pool.supervisors]
    _refine_memory_models(storage, adapter.name, study.study_name, host.devices, learnt)
    return outcome_of(study, spec, interrupted=result.interrupted)


def fused_members(adapter: Any, spec: StudySpec, asked: int | str, gpus: Sequence[GpuPlan]) -> int:
    """How many trials one process trains fused here, at most: `asked` (--fuse; auto: the most
    any GPU's plan packs, `placement.auto_group_size`), or 1, with one line saying why, where
    the adapter or the study cannot fuse (docs/fused.md)."""
    if asked == 1:
        return 1
    why = unfused_because(adapter, spec)
    if why is not None:
        log = logger.info if asked == FUSE_AUTO else logger.warning  # auto: where it can
        log("--fuse %s: %s; its trials run one per process", asked, why)
        return 1
    if asked != FUSE_AUTO:
        return int(asked)
    sizes = {
        (gpu.device.label if gpu.device else "cpu"): auto_group_size(gpu)
        if fusing_pays_on(adapter, "cuda" if gpu.device else "cpu")
        else 1
        for gpu in gpus
    }
    said = ", ".join(
        f"up to {size} trials per process on {where}"
        if size > 1
        else f"one trial per process on {where} (fusing does not pay there)"
        for where, size in sizes.items()
    )
    logger.info("--fuse auto: %s", said)
    return max(sizes.values(), default=1)


class FinishedTrials:
    """Calls the user's callbacks once for each trial that finishes from now on, as
    `study.optimize` does, in this process (the trials ran in others)."""

    def __init__(self, study: optuna.Study, callbacks: Sequence[Callable[..., None]]) -> None:
        self.study = study
        self.callbacks = list(callbacks)
        self.seen = {t.number for t in self._finished()}  # a resumed study's earlier trials

    def _finished(self) -> list[Any]:
        states = (
            optuna.trial.TrialState.COMPLETE,
            optuna.trial.TrialState.PRUNED,
            optuna.trial.TrialState.FAIL,
        )
        return self.study.get_trials(deepcopy=False, states=states)

    def call(self) -> None:
        for trial in sorted(self._finished(), key=lambda t: t.number):
            if trial.number not in self.seen:
                self.seen.add(trial.number)
                for callback in self.callbacks:
                    callback(self.study, trial)


def _updates(progress: Any, finished: FinishedTrials | None) -> Callable[[Any], None] | None:
    """What the pool calls with each snapshot (about once a second): the progress display and
    the callbacks; None when there is neither."""
    if progress is None and finished is None:
        return None

    def update(snapshot: Any) -> None:
        if progress is not None:
            progress.update(snapshot)
        if finished is not None:
            finished.call()

    return update


def _refine_memory_models(
    storage: Any,
    adapter: str,
    study_name: str,
    devices: list[Any],
    learnt: Sequence[tuple[str, Any]] = (),
) -> None:
    """What trials on real GPUs used refines the memory model that later plans start from, merged
    with what this run's footprints learnt (`learnt`: GPU name, Footprint), so an OOM's floor is
    kept; a simulated device only holds what the model said (times a scale), which measures
    nothing."""

    for gpu_name in sorted({d.name for d in devices if d.kind == "cuda"}):
        try:
            save_learnt_model(
                storage.engine,
                adapter=adapter,
                gpu_name=gpu_name,
                footprints=[footprint for name, footprint in learnt if name == gpu_name],
                study_names=[study_name],
            )
        except sqlalchemy.exc.SQLAlchemyError as error:
            logger.warning("could not store the memory model measured on %s: %s", gpu_name, error)


def _prepare_tracking(spec: StudySpec, study_name: str, metric: str) -> None:
    tracker = tracker_for(spec, study_name, metric=metric)
    if tracker is not None:
        tracker.prepare()


def log_plan(gpu: Any) -> None:
    """One line per GPU: how it admits trials, and what a trial may be."""
    if gpu.device is None:
        at_once = "1 trial at a time" if gpu.slots == 1 else f"up to {gpu.slots} trials at once"
        logger.info(
            "no GPU (CPU only): %s (limited by %s), batch sizes %d..%d",
            at_once,
            gpu.limited_by,
            *gpu.batch_bounds,
        )
        return
    logger.info(
        "%s: trials admitted by their memory, %.0f MB usable, at most %d at once (limited by %s); "
        "batch sizes %d..%d; about %d at once at the typical size; memory model %s",
        gpu.device.label,
        gpu.usable_mb,
        gpu.slots,
        gpu.limited_by,
        *gpu.batch_bounds,
        gpu.trials_at_once(gpu.typical_trial_mb),
        gpu.memory_model_source,
    )


def plan_and_run(
    *,
    location: StorageLocation,
    storage: Any,
    adapter: Any,
    spec: StudySpec,
    options: HostOptions,
    open_study: Callable[[], optuna.Study],
    spare: list[Any] | None = None,
    selection: Selection | None = None,
    callbacks: Sequence[Callable[..., None]] = (),
) -> int:
    """What `run` and `worker` end with: plan this host, open the study (only once the plan
    fits, so a model that fits no GPU stores nothing), run it, print the result; the exit status.

    `selection` (`run` only, never a worker: one process scores a study's end): once the study
    has used its budget, its best trial is tested and confirmed as asked (orchestrator/selection)."""

    opened: list[optuna.Study] = []

    def open_and_keep() -> optuna.Study:
        study = open_study()
        opened.append(study)
        trains = selection is not None and may_train_at_the_end(study, spec, adapter, selection)
        if trains and uses_torch(adapter):
            # The plan fits: the study's end will train here, and its first optimiser imports
            # TorchDynamo. With torch, 3 s of CPU, taken as the trials start, not after the last.
            import_in_background("torch", "torch._dynamo")
        return study

    outcome = execute(
        location=location,
        storage=storage,
        adapter=adapter,
        spec=spec,
        options=options,
        open_study=open_and_keep,
        spare=spare,
        callbacks=callbacks,
    )
    if selection is not None and opened and not outcome.interrupted:
        final = finish_study(opened[-1], spec, adapter, selection)  # Ctrl-C: `best --confirm`
        outcome = dataclasses.replace(outcome, final=final)
    print_outcome(outcome, metric=metric_name(adapter, spec.options), as_json=options.json)
    if not outcome.interrupted:
        return 0

    return 128 + (pool_signals.first_signal or signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM


def execute(
    *,
    location: StorageLocation,
    storage: Any,
    adapter: Any,
    spec: StudySpec,
    options: HostOptions,
    open_study: Callable[[], optuna.Study],
    spare: list[Any] | None = None,
    callbacks: Sequence[Callable[..., None]] = (),
) -> Outcome:
    """Plan this host, open the study once the plan fits, store the outcomes this host's last
    run kept on disk while the database was away, run the pools: the outcome."""

    with tempfile.TemporaryDirectory(prefix="orchestrator-sim-") as sim_dir:
        host = plan_host(
            location=location, adapter=adapter, spec=spec, options=options, sim_dir=sim_dir
        )
        study = open_study()
        deliver_kept(study, options.log_dir_for(location))  # what the last run here could not store
        return run_pool(
            location=location,
            storage=storage,
            study=study,
            spec=spec,
            host=host,
            options=options,
            spare=spare,
            callbacks=callbacks,
        )


def _progress(options: HostOptions) -> Any:
    if not options.shows_progress:
        return None
    return make_progress(quiet=options.quiet, verbose=options.verbose)


def open_for_trials(location: StorageLocation, *, uses_torch: bool = True) -> tuple[list[Any], Any]:
    """What `run` and `optimize` do once every input is checked: start the trial processes'
    imports (`prestart`: they overlap what follows), then open the study's storage
    (`open_trials_storage`). The prestarted processes and the storage."""
    spare = prestart(uses_torch)
    return spare, open_trials_storage(location)


def prestart(uses_torch: bool) -> list[Any]:
    """Start the trial processes' imports now, with torch where the study's adapter uses it."""
    # `prestart` is read through its module at the call: tests replace it there.
    return pool_processes.prestart(1, uses_torch=uses_torch)


def prestart_for(
    study: optuna.Study | None, spec: StudySpec, *, uses_torch: bool, queued: bool = False
) -> list[Any]:
    """`prestart`, where this host may start a trial of `study` (None: a new one; `queued`:
    sets about to be queued): a `run` or `worker` that finds the budget used imports nothing."""
    if study is None or queued:
        return prestart(uses_torch)
    count = count_trials(study.get_trials(deepcopy=False))
    return prestart(uses_torch) if count.may_ask(spec.trials) else []


def open_trials_storage(location: StorageLocation) -> Any:
    """The study's storage as trials are run on it: migrated, with heartbeats on."""
    return migrate.open_storage(
        location, heartbeat=True, heartbeat_stale_trial_callback=stale_trial_callback
    )


def configure(options: HostOptions) -> None:
    """Logging as the flags ask, and stdout kept for the result (`orchestrator.result`)."""

    keep_stdout_for_the_result()
    configure_logging(verbose=options.verbose, quiet=options.quiet or options.json)
