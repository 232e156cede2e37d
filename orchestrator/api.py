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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.record.study import StudySpec

if TYPE_CHECKING:
    import optuna

    from orchestrator.planning.planner import NodePlan


def optimize(
    objective: Callable[..., float],
    *,
    n_trials: int,
    study_name: str | None = None,
    storage: str | None = None,
    gpus: str = "auto",
    memory_model: tuple[float, float] = (0.0, 0.0),
    batch_sizes: tuple[int, int] | None = None,
    direction: str = "minimize",
    metric: str = "value",
    sampler: str = StudySpec.sampler,
    pruner: str = StudySpec.pruner,
    seed: int | None = None,
    swarm_size: int = StudySpec.swarm_size,
    epochs: int = 1,
    max_retries: int = StudySpec.max_retries,
    **host: Any,
) -> optuna.Study:
    """Run `objective(trial, device)` until the study holds `n_trials` trials; the study.

    `memory_model` is (overhead MB, MB per sample): what one trial needs on a GPU at a batch
    size, which admission counts by; `batch_sizes` is the (low, high) range the objective draws
    "batch_size" from (log scale), drawn before it runs so the trial is admitted by its bytes.
    `epochs` is what pruners take as the resource (Hyperband), when the objective reports one
    value per epoch. `host` takes the flags `run` has about this host, by their Python names:
    concurrency, timeout, grace, sim_memory_scale, log_dir, recycle_after, fresh_process, ...
    """
    from adapters.objective import objective_ref

    ref = objective_ref(objective)
    low, high = batch_sizes if batch_sizes is not None else (0, 0)
    spec = StudySpec(
        adapter=ref,
        adapter_path=True,
        objective=True,
        metric=metric,
        trials=n_trials,
        epochs=epochs,
        direction=direction,
        options={
            "overhead_mb": float(memory_model[0]),
            "per_sample_mb": float(memory_model[1]),
            "batch_size_min": int(low),
            "batch_size_max": int(high),
        },
        sampler=sampler,
        seed=seed,
        swarm_size=swarm_size,
        max_retries=max_retries,
        pruner=pruner,
    )
    return _run(spec, study_name or ref.rpartition(":")[2], storage, gpus, host)


def plan(
    *,
    gpus: str = "auto",
    memory_model: tuple[float, float] = (0.0, 0.0),
    batch_sizes: tuple[int, int] = (64, 4096),
    cpu_bound: bool = False,
    swarm_size: int = 20,
    concurrency: int | None = None,
    n_trials: int | None = None,
) -> NodePlan:
    """What this host would run: per GPU, the trials at once and the batch sizes that fit."""
    from adapters.base import MemoryModel
    from orchestrator.gpu import select_devices
    from orchestrator.planning.cpu_cores import usable_cpu_cores
    from orchestrator.planning.planner import plan_node

    _, devices = select_devices(gpus)
    return plan_node(
        devices,
        MemoryModel(float(memory_model[0]), float(memory_model[1])),
        cpu_bound=cpu_bound,
        cpu_cores=usable_cpu_cores(),
        swarm_size=swarm_size,
        min_batch=batch_sizes[0],
        max_batch=batch_sizes[1],
        concurrency=concurrency,
        budget_trials=n_trials,
    )


def _run(spec: Any, name: str, storage: str | None, gpus: str, host: dict[str, Any]) -> Any:
    import optuna

    from orchestrator.host_options import (
        HostOptions,
        check_host_options,
        check_storage_for_workers,
    )
    from orchestrator.launch import execute
    from orchestrator.record.migrate import open_storage
    from orchestrator.record.retry import stale_trial_callback
    from orchestrator.record.storage_url import parse_url, resolve_storage_url
    from orchestrator.run.processes import prestart

    settings = HostOptions(gpus=gpus, quiet=host.pop("quiet", True), **host)
    check_host_options(settings)
    url = resolve_storage_url(storage)
    parse_url(url)
    check_storage_for_workers(url)
    adapter = spec.resolve_adapter()  # the objective imports here, or says why not
    spare = prestart(1)
    opened = open_storage(url, heartbeat=True, heartbeat_stale_trial_callback=stale_trial_callback)
    spec = _resume(opened, name, spec)
    execute(
        url=url,
        storage=opened,
        adapter=adapter,
        spec=spec,
        options=settings,
        open_study=lambda: _store(opened, name, spec),
        spare=spare,
    )
    return optuna.load_study(study_name=name, storage=opened)


def _resume(storage: Any, name: str, spec: Any) -> Any:
    """The spec to store (this call's), once an existing study of that name is checked to tune
    the same objective: its budget becomes `n_trials`, as `run --trials` does."""
    import contextlib

    import optuna

    from orchestrator.errors import UserError
    from orchestrator.record.study import load_spec

    existing = None
    with contextlib.suppress(KeyError):
        existing = optuna.load_study(study_name=name, storage=storage)
    if existing is None:
        return spec
    stored = load_spec(existing)
    if stored is None or stored.adapter != spec.adapter:
        raise UserError(f"study {name!r} does not tune {spec.adapter}: give another study_name")
    return spec


def _store(storage: Any, name: str, spec: Any) -> Any:
    import optuna

    from orchestrator.record.study import save_spec

    study = optuna.create_study(
        study_name=name, storage=storage, direction=spec.direction, load_if_exists=True
    )
    save_spec(study, spec)
    return study
