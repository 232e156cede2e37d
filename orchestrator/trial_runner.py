"""One trial in its own process: ask, run the adapter on its device, measure VRAM, tell.

The supervisor starts this module's `run_trial` with the `spawn` context (CUDA and fork do not
mix) and learns the outcome from a pipe. Each trial gets a fresh process because only a process
exit gives back everything CUDA held, which matters most after an out-of-memory error.
The trial process knows nothing of concurrency beyond the numbers it records.
"""

from __future__ import annotations

import logging
import os
import signal
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.sharedctypes import Synchronized

    import optuna

    from orchestrator.gpu.base import Device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialJob:
    """Everything a trial process needs, picklable."""

    storage_url: str
    study_name: str
    device: Device | None  # None: run on the CPU
    batch_bounds: tuple[int, int]
    concurrency: int  # slots on this GPU when the trial started
    threads: int  # torch threads for this trial
    host: str
    sim_memory_scale: float = 1.0
    seed_offset: int = 0  # makes Optuna's own samplers differ between processes


@dataclass(frozen=True)
class TrialOutcome:
    trial_number: int | None  # None: the budget was used up, no trial was asked
    state: str  # COMPLETE, PRUNED, FAIL, or NONE
    oom: bool = False
    alone: bool = False
    batch_size: int | None = None
    value: float | None = None
    vram_peak_mb: float | None = None
    error: str | None = None
    requeued: bool = False
    interrupted: bool = False  # stopped by the supervisor: says nothing about memory


class Interrupted(BaseException):
    """The supervisor asked this trial to stop (SIGTERM after its grace period).

    A BaseException, so that an adapter's `except Exception` cannot swallow it."""


class _Stop:
    """SIGTERM raises Interrupted only while the objective runs (`armed`); at any other moment it
    is remembered, so asking, telling and writing records are never cut in half."""

    armed = False
    requested = False


def _on_sigterm(signum: int, frame: Any) -> None:
    _Stop.requested = True
    if _Stop.armed:
        _Stop.armed = False
        raise Interrupted(f"stopped by signal {signum}")


def _arm() -> None:
    _Stop.armed = True
    if _Stop.requested:  # the signal came while the trial was being set up
        _Stop.armed = False
        raise Interrupted(f"stopped by signal {signal.SIGTERM.value}")


def _disarm() -> None:
    _Stop.armed = False


def oom_errors() -> tuple[type[BaseException], ...]:
    import torch

    errors: list[type[BaseException]] = [torch.cuda.OutOfMemoryError]
    generic = getattr(torch, "OutOfMemoryError", None)
    if generic is not None and generic not in errors:
        errors.append(generic)
    return tuple(errors)


def run_trial(job: TrialJob, conn: Connection, had_company: Synchronized) -> None:
    """Process entry point: never raises; always sends one TrialOutcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    if job.device is not None and job.device.kind == "cuda":
        # By UUID: NVML numbers GPUs by PCI bus, CUDA by speed unless told otherwise.
        uuid = job.device.uuid
        os.environ["CUDA_VISIBLE_DEVICES"] = (
            uuid if uuid.startswith("GPU-") else str(job.device.index)
        )
    try:
        outcome = _run(job, had_company, conn)
    except BaseException as error:  # report, never leave the supervisor guessing
        outcome = TrialOutcome(None, "FAIL", error=f"{type(error).__name__}: {error}")
        logger.error("trial process failed: %s", traceback.format_exc())
    try:
        conn.send(outcome)
    finally:
        conn.close()


def _run(job: TrialJob, had_company: Synchronized, conn: Connection) -> TrialOutcome:
    import optuna
    import torch

    from orchestrator.launch import resolve_adapter
    from orchestrator.locks import budget_lock
    from orchestrator.retry import stale_trial_callback
    from orchestrator.storage import create_storage
    from orchestrator.study import count_trials, load_spec, pruner_for

    torch.set_num_threads(max(1, job.threads))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = create_storage(
        job.storage_url, heartbeat=True, heartbeat_stale_trial_callback=stale_trial_callback
    )
    study = optuna.load_study(study_name=job.study_name, storage=storage)
    spec = load_spec(study)
    if spec is None:
        return TrialOutcome(
            None, "FAIL", error=f"study {job.study_name!r} has no orchestrator spec"
        )
    adapter = resolve_adapter(spec)
    study.sampler = _sampler(spec, job, trial_number=0)
    study.pruner = pruner_for(spec)

    with budget_lock(job.storage_url, job.study_name):
        if _Stop.requested:
            return TrialOutcome(None, "NONE")
        optuna.storages.fail_stale_trials(study)
        if not count_trials(study.get_trials(deepcopy=False)).may_ask(spec.trials):
            return TrialOutcome(None, "NONE")
        trial = study.ask()
        # A RUNNING trial with no heartbeat row is never found stale: record one before the lock
        # goes, so that from here on a lost process always leaves a trial someone can fail.
        storage.record_heartbeat(trial._trial_id)
    conn.send(("asked", trial.number))

    if spec.sampler != "pso":
        # Optuna's samplers draw from one RNG per object: seed it by trial number, so that
        # processes, resumed runs and nodes never repeat each other (PSO does this itself).
        study.sampler = _sampler(spec, job, trial_number=trial.number)
    _fit_fixed_batch_size(trial, job.batch_bounds)

    from optuna.storages._heartbeat import get_heartbeat_thread

    heartbeat = get_heartbeat_thread(trial._trial_id, storage)
    heartbeat.start()
    try:
        return _run_trial(job, study, trial, adapter, spec, had_company, storage.engine)
    finally:
        heartbeat.join()


def _sampler(spec, job: TrialJob, *, trial_number: int):  # noqa: ANN001, ANN202
    from samplers import make_sampler

    return make_sampler(
        spec.sampler,
        seed=spec.seed,
        swarm_size=spec.swarm_size,
        bounds={"batch_size": job.batch_bounds},
        independent_seed_offset=trial_number,
    )


def _fit_fixed_batch_size(trial: optuna.Trial, bounds: tuple[int, int]) -> None:
    """A re-run carries its batch size fixed from the GPU it first ran on; on a smaller GPU it
    must still fit this one's plan, so it is brought inside this GPU's bounds (and says so)."""
    fixed = trial._fixed_params  # what Optuna hands out instead of sampling; read at ask()
    batch = fixed.get("batch_size")
    if batch is None:
        return
    low, high = bounds
    fitted = min(max(int(batch), low), high)
    if fitted != batch:
        fixed["batch_size"] = fitted
        trial.set_user_attr("batch_size_fitted_from", int(batch))


def _run_trial(job, study, trial, adapter, spec, had_company, engine) -> TrialOutcome:  # noqa: ANN001
    import optuna
    import torch
    from optuna.trial import TrialState

    from adapters.base import memory_model_of, reporter
    from orchestrator import records
    from orchestrator.gpu.sim import SimLedger, process_holder
    from orchestrator.retry import requeue

    device = job.device
    gpu_name = device.name if device else "cpu"
    torch_device = torch.device("cuda:0" if device is not None and device.kind == "cuda" else "cpu")
    memory = memory_model_of(adapter, spec.options)
    ledger = (
        SimLedger(device.ledger_path, device.total_mb) if device and device.kind == "sim" else None
    )
    trial.set_user_attr("host", job.host)
    trial.set_user_attr("gpu", gpu_name)
    trial.set_user_attr("gpu_index", device.index if device else None)
    trial.set_user_attr("concurrency", job.concurrency)
    trial.set_user_attr("batch_bounds", list(job.batch_bounds))

    batch_size: int | None = None
    planned: float | None = None
    state, value, error, oom, interrupted = TrialState.FAIL, None, None, False, False
    try:
        _arm()
        try:  # only this part can be interrupted: the outcome below is always written whole
            params = adapter.suggest(trial, spec.options)
            batch_size = params.get("batch_size")
            if batch_size is not None:
                planned = memory.planned_mb(int(batch_size))
                trial.set_user_attr("vram_planned_mb", round(planned, 1))
            if torch_device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if ledger is not None:
                held = (planned or memory.model_overhead_mb) * job.sim_memory_scale
                ledger.allocate(process_holder(), held)
            value = float(
                adapter.train(
                    params,
                    epochs=spec.epochs,
                    device=torch_device,
                    options=spec.options,
                    report=reporter(trial),
                )
            )
        finally:
            _disarm()
        state = TrialState.COMPLETE
    except optuna.TrialPruned:
        state = TrialState.PRUNED
    except oom_errors() as caught:
        oom, error = True, f"out of memory: {str(caught).splitlines()[0] if str(caught) else ''}"
    except Interrupted as caught:
        error, interrupted = str(caught), True
    except Exception as caught:
        error = f"{type(caught).__name__}: {caught}"
        logger.warning("trial %d failed: %s", trial.number, traceback.format_exc())
    peak = _peak_mb(torch_device, ledger)
    if ledger is not None:
        ledger.release(process_holder())
    if oom and torch_device.type == "cuda":
        torch.cuda.empty_cache()

    alone = oom and not had_company.value
    requeued = False
    frozen = study._storage.get_trial(trial._trial_id)
    if state == TrialState.FAIL and (oom or interrupted):
        retry_params, reason = None, "interrupted" if not oom else "oom"
        if alone and batch_size is not None:
            # Out of memory with the GPU to itself: this batch size does not fit this GPU.
            low = job.batch_bounds[0]
            records.lower_batch_limit(
                engine,
                study_name=job.study_name,
                gpu_name=gpu_name,
                max_batch_size=max(low, int(batch_size) - 1),
                trial_number=trial.number,
            )
            if int(batch_size) > low:
                retry_params = {"batch_size": max(low, int(batch_size) // 2)}
            else:
                reason = ""  # the smallest batch does not fit: re-running cannot help
        if reason:
            requeue_limit = spec.max_retries if oom else None
            requeued = requeue(
                study, frozen, max_retries=requeue_limit, params=retry_params, reason=reason
            )

    trial.set_user_attr("oom", oom)
    if peak is not None:
        trial.set_user_attr("vram_peak_mb", round(peak, 1))
    if error:
        trial.set_user_attr("error", error[:500])
    study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
    records.record_trial_vram(
        engine,
        study_name=job.study_name,
        trial_number=trial.number,
        host=job.host,
        gpu_index=device.index if device else None,
        gpu_name=gpu_name,
        batch_size=int(batch_size) if batch_size is not None else None,
        vram_planned_mb=planned,
        vram_peak_mb=peak,
        concurrency=job.concurrency,
        oom=oom,
        state=state.name,
    )
    return TrialOutcome(
        trial.number,
        state.name,
        oom=oom,
        alone=alone,
        batch_size=int(batch_size) if batch_size is not None else None,
        value=value,
        vram_peak_mb=peak,
        error=error,
        requeued=requeued,
        interrupted=interrupted,
    )


def _peak_mb(torch_device, ledger) -> float | None:  # noqa: ANN001
    if ledger is not None:
        from orchestrator.gpu.sim import process_holder

        return ledger.held_mb(process_holder())
    if torch_device.type == "cuda":
        import torch

        return torch.cuda.max_memory_reserved() / 2**20
    return None
