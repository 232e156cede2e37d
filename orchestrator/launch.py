"""What `run` and `worker` share: open the study, plan this host's GPUs, run the pool, say the result."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters import metric_name
from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study import StudySpec

logger = logging.getLogger(__name__)

SAMPLERS = ("pso", "tpe", "random", "qmc", "cmaes")


def pool_settings(**values: Any) -> argparse.Namespace:
    """The flags of `run`/`worker` about this host as the parser's defaults, with `values` in
    their place: what the Python API hands the same functions the commands use."""
    parser = argparse.ArgumentParser(add_help=False)
    add_pool_arguments(parser)
    settings = parser.parse_args([])
    unknown = set(values) - set(vars(settings)) - {"quiet", "verbose"}
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    for key, value in values.items():
        setattr(settings, key, value)
    return settings


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags about this host: which GPUs, how many trials at once, for how long."""
    from orchestrator.cli import number, user_checked, whole_number
    from orchestrator.gpu import check_gpu_spec
    from orchestrator.planning.workloads import add_workloads_argument
    from orchestrator.record.outage import DEFAULT_RETRY_SECONDS

    parser.add_argument(
        "--gpus",
        default="auto",
        metavar="SPEC",
        type=user_checked(check_gpu_spec),
        help="auto (default), none, indices such as 0,2, or simulated devices sim:MB[,sim:MB...]",
    )
    parser.add_argument(
        "--sim-memory-scale",
        type=number("--sim-memory-scale", above_low=True, example="1.5"),
        default=1.0,
        metavar="F",
        help="a simulated trial holds F times its memory model's MB (default 1.0)",
    )
    parser.add_argument(
        "--concurrency",
        type=whole_number("--concurrency", high=10_000),
        metavar="N",
        help="at most N trials at once per GPU (lowers the plan)",
    )
    parser.add_argument(
        "--timeout",
        type=number("--timeout", above_low=True, example="3600"),
        metavar="SECONDS",
        help="start no trial after this long; running ones finish",
    )
    parser.add_argument(
        "--grace",
        type=number("--grace", example="30"),
        default=30.0,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, running trials get this long to finish before they are stopped and re-queued (default 30)",
    )
    parser.add_argument(
        "--recycle-after",
        type=whole_number("--recycle-after", example=20),
        metavar="N",
        help="a trial process makes way for a fresh one after N trials (default: never; it always "
        "does after an out-of-memory or CUDA error)",
    )
    parser.add_argument(
        "--recycle-memory-mb",
        type=number("--recycle-memory-mb", above_low=True, example="2048"),
        default=2048.0,
        metavar="MB",
        help="a trial process whose resident memory grew by more than MB since its first trial "
        "makes way for a fresh one (default 2048)",
    )
    parser.add_argument(
        "--fresh-process",
        action="store_true",
        help="run every trial in a fresh process, for models that leak (slower: each trial pays "
        "for the imports, the storage connection and the CUDA context)",
    )
    parser.add_argument(
        "--log-dir",
        metavar="DIR",
        help="each trial's stdout and stderr go to DIR/STUDY/trial-N.log (default: beside an SQLite "
        "file, e.g. study-logs/ for study.db; else orchestrator-logs/ in the current directory)",
    )
    parser.add_argument(
        "--storage-retry-seconds",
        type=number("--storage-retry-seconds", example="300"),
        default=DEFAULT_RETRY_SECONDS,
        metavar="SECONDS",
        help="ride out a database outage this long, retrying, before stopping "
        f"(default {DEFAULT_RETRY_SECONDS:g}; 0 stops at once)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_workloads_argument(parser)


def check_storage_for_workers(url: str) -> None:
    """Trial processes open the storage themselves: an in-memory database cannot be shared."""
    from orchestrator.record.storage import is_sqlite, sqlite_path

    if is_sqlite(url) and sqlite_path(url) is None:
        raise UserError(
            "an in-memory SQLite storage cannot be shared with trial processes: "
            "use a file, e.g. --storage sqlite:///study.db"
        )


def check_pool_arguments(args: argparse.Namespace) -> None:
    """What argparse could not check alone, before anything is stored: the GPUs named exist.

    The values themselves were checked as they were parsed (finite, in range, well-formed);
    these lines keep the same promise for callers that build a Namespace by hand."""
    import math
    import os

    from orchestrator.gpu import check_gpus_exist
    from orchestrator.planning.workloads import WORKLOADS_ENV, load_workload_classes
    from orchestrator.record.outage import set_retry_seconds
    from orchestrator.record.storage import heartbeat_settings

    if args.concurrency is not None and args.concurrency < 1:
        raise UserError(f"--concurrency {args.concurrency} must be at least 1")
    if not (math.isfinite(args.sim_memory_scale) and args.sim_memory_scale > 0):
        raise UserError(f"--sim-memory-scale {args.sim_memory_scale} must be more than 0")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        raise UserError(f"--grace {args.grace} must be 0 or more seconds")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout {args.timeout} must be more than 0 seconds")
    if args.recycle_after is not None and args.recycle_after < 1:
        raise UserError(f"--recycle-after {args.recycle_after} must be at least 1")
    if not args.recycle_memory_mb > 0:
        raise UserError(f"--recycle-memory-mb {args.recycle_memory_mb} must be more than 0")
    retry = getattr(args, "storage_retry_seconds", None)
    if retry is not None:
        if not (math.isfinite(retry) and retry >= 0):
            raise UserError(f"--storage-retry-seconds {retry} must be 0 or more seconds")
        set_retry_seconds(retry)
    check_gpus_exist(args.gpus)
    heartbeat_settings()  # a bad value in the environment is refused before anything starts
    if getattr(args, "workloads", None):
        # Checked now (a bad file stops before anything is stored), then named in the
        # environment, where every later read of the workload classes looks, trial processes too.
        load_workload_classes(args.workloads)
        os.environ[WORKLOADS_ENV] = os.path.abspath(args.workloads)


def log_dir_of(url: str, args: argparse.Namespace) -> str:
    """Where trials' logs go: --log-dir, else beside the study's SQLite file or here."""
    from orchestrator.record.trial_logs import default_log_dir

    chosen = getattr(args, "log_dir", None)
    return str(chosen) if chosen else str(default_log_dir(url))


def recycling_of(args: argparse.Namespace) -> Any:
    """When a warm trial process makes way for a fresh one, from the flags."""
    from orchestrator.run.trial_context import Recycling

    after = 1 if getattr(args, "fresh_process", False) else getattr(args, "recycle_after", None)
    return Recycling(
        after_trials=after, memory_growth_mb=getattr(args, "recycle_memory_mb", 2048.0)
    )


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
    failed: int = 0

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
            "ooms": self.ooms,
            "interrupted": self.interrupted,
        }


@dataclass(frozen=True)
class HostPlan:
    """This host's devices and their plans for one adapter, checked to fit before any study work."""

    probe: Any
    devices: list[Any]
    plan: Any  # orchestrator.planning.planner.NodePlan
    cpu_bound: bool


def plan_host(
    *,
    url: str,
    adapter: Any,
    options: dict[str, Any],
    swarm_size: int,
    args: argparse.Namespace,
    sim_dir: str | None = None,
    budget_trials: int | None = None,
) -> HostPlan:
    """Find this host's GPUs and plan them for the adapter; a model that fits nowhere is a UserError."""
    from adapters.base import memory_model_of
    from orchestrator.gpu import select_devices
    from orchestrator.planning.memory import measured_models
    from orchestrator.planning.planner import plan_node, usable_cpu_cores
    from orchestrator.planning.workloads import workload_class

    probe, devices = select_devices(args.gpus, sim_dir=sim_dir)
    declared = memory_model_of(adapter, options)
    measured = measured_models(url, adapter.name, declared, [d.name for d in devices])
    cpu_bound = workload_class(adapter.workload_class).cpu_bound
    plan = plan_node(
        devices,
        declared,
        cpu_bound=cpu_bound,
        cpu_cores=usable_cpu_cores(),
        swarm_size=swarm_size,
        concurrency=args.concurrency,
        budget_trials=budget_trials,
        gpu_memory_models=measured,
    )
    for gpu in plan.gpus:
        where = gpu.device.label if gpu.device else "no GPU (CPU only)"
        if not gpu.fits:
            raise UserError(
                f"{where}: one trial needs about {gpu.per_trial_mb:.0f} MB but only "
                f"{gpu.usable_mb:.0f} MB are usable; use a bigger GPU or a smaller model"
            )
    return HostPlan(probe, devices, plan, cpu_bound)


def run_pool(
    *,
    url: str,
    storage: Any,
    study: optuna.Study,
    spec: StudySpec,
    host: HostPlan,
    args: argparse.Namespace,
    spare: list[Any] | None = None,
) -> Outcome:
    """Run the study's trials on this host's planned GPUs until its budget is used (`spare`:
    trial processes prestarted by `orchestrator.run.processes.prestart`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.planning.memory import refine_from_trials
    from orchestrator.record.study import count_trials
    from orchestrator.run.pool import Pool, TrialsCannotStart

    adapter = spec.resolve_adapter()
    for gpu in host.plan.gpus:
        log_plan(gpu)
    _prepare_tracking(spec, study.study_name, metric_name(adapter, spec.options))

    progress = _progress(args)
    pool = Pool.on_storage(
        storage_url=url,
        engine=storage.engine,
        study=study,
        spec=spec,
        plans=list(host.plan.gpus),
        probe=host.probe,
        cpu_cores=host.plan.cpu_cores,
        cpu_bound=host.cpu_bound,
        sim_memory_scale=args.sim_memory_scale,
        recycling=recycling_of(args),
        log_dir=log_dir_of(url, args),
        spare=spare,
        adapter_name=adapter.name,
        timeout_s=args.timeout,
        grace_s=args.grace,
        metric=metric_name(adapter, spec.options),
        on_update=progress.update if progress else None,
    )
    final = None
    try:
        result = pool.run()
        final = pool.snapshot()
    except TrialsCannotStart as error:
        raise UserError(str(error)) from None
    finally:
        if progress:
            progress.close(final)  # restores the terminal even when the pool raised
    # What trials on real GPUs used refines the memory model that later plans start from; a
    # simulated device only holds what the model said (times a scale), which measures nothing.
    for gpu_name in sorted({d.name for d in host.devices if d.kind == "cuda"}):
        try:
            refine_from_trials(
                storage.engine,
                adapter=adapter.name,
                gpu_name=gpu_name,
                study_names=[study.study_name],
            )
        except SQLAlchemyError as error:
            logger.warning("could not store the memory model measured on %s: %s", gpu_name, error)
    best = _best(study)
    trials = study.get_trials(deepcopy=False)
    count = count_trials(trials)
    return Outcome(
        study_name=study.study_name,
        budget=spec.trials,
        counted=count.counted,
        best_value=best.value if best else None,
        best_trial=best.number if best else None,
        best_params=dict(best.params) if best else {},
        ooms=sum(1 for t in trials if t.user_attrs.get("oom")),
        interrupted=result.interrupted,
        complete=count.complete,
        pruned=count.pruned,
        failed=count.failed,
    )


def _prepare_tracking(spec: StudySpec, study_name: str, metric: str) -> None:
    from orchestrator.record.tracking import tracker_for

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
    url: str,
    storage: Any,
    adapter: Any,
    spec: StudySpec,
    args: argparse.Namespace,
    open_study: Callable[[], optuna.Study],
    spare: list[Any] | None = None,
) -> int:
    """What `run` and `worker` end with: plan this host, open the study (only once the plan
    fits, so a model that fits no GPU stores nothing), run it, print the result; the exit status."""
    outcome = execute(
        url=url,
        storage=storage,
        adapter=adapter,
        spec=spec,
        args=args,
        open_study=open_study,
        spare=spare,
    )
    print_outcome(outcome, metric=metric_name(adapter, spec.options), as_json=args.json)
    return 130 if outcome.interrupted else 0


def execute(
    *,
    url: str,
    storage: Any,
    adapter: Any,
    spec: StudySpec,
    args: argparse.Namespace,
    open_study: Callable[[], optuna.Study],
    spare: list[Any] | None = None,
) -> Outcome:
    """Plan this host, open the study once the plan fits, run the pools: the outcome."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-sim-") as sim_dir:
        host = plan_host(
            url=url,
            adapter=adapter,
            options=spec.options,
            swarm_size=spec.swarm_size,
            args=args,
            sim_dir=sim_dir,
            budget_trials=spec.trials,
        )
        study = open_study()
        return run_pool(
            url=url, storage=storage, study=study, spec=spec, host=host, args=args, spare=spare
        )


def _progress(args: argparse.Namespace) -> Any:
    if getattr(args, "json", False) and not getattr(args, "verbose", False):
        return None
    try:
        from orchestrator.run.progress import make_progress
    except ImportError:
        return None
    return make_progress(
        quiet=bool(getattr(args, "quiet", False)), verbose=bool(getattr(args, "verbose", False))
    )


def _best(study: optuna.Study) -> Any:
    try:
        return study.best_trial
    except ValueError:
        return None


def print_outcome(outcome: Outcome, *, metric: str, as_json: bool) -> None:
    out = _RESULT[0] if _RESULT else sys.stdout
    try:
        _print_outcome(outcome, metric=metric, as_json=as_json, out=out)
    finally:
        out.flush()


def _print_outcome(outcome: Outcome, *, metric: str, as_json: bool, out: Any) -> None:
    def print(*parts: Any) -> None:  # noqa: A001 - the result's lines, to the result stream
        out.write(" ".join(str(part) for part in parts) + "\n")

    if as_json:
        print(json.dumps(outcome.as_dict(), indent=2, default=str))
        return
    state = "interrupted" if outcome.interrupted else "done"
    print(
        f"study {outcome.study_name!r}: {outcome.counted}/{outcome.budget} trials {state} "
        f"({outcome.complete} complete, {outcome.pruned} pruned, {outcome.failed} failed), "
        f"{outcome.ooms} out-of-memory"
    )
    if outcome.best_trial is None:
        print("no trial has completed yet")
        return
    print(f"best trial #{outcome.best_trial}: {metric} = {outcome.best_value:.6g}")
    for name, value in outcome.best_params.items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        print(f"  {name} = {shown}")


_RESULT: list[Any] = []  # the stream `run` and `worker` print their result to (see configure)


def configure(args: argparse.Namespace) -> None:
    """Logging as the flags ask, and stdout kept for the result: whatever else writes to it from
    here on (an adapter's module, a library) goes to stderr, so `--json` output stays JSON."""
    from orchestrator.cli import configure_logging
    from orchestrator.record.trial_logs import reserve_stdout

    if not _RESULT:
        stream = reserve_stdout()
        if stream is not sys.stdout:  # a real file: keep it for the result (once a process)
            _RESULT.append(stream)

    configure_logging(
        verbose=getattr(args, "verbose", False),
        quiet=getattr(args, "quiet", False) or getattr(args, "json", False),
    )
