"""Steps 3 and 4 of the GPU check: a real study on part of the GPU with a memory model too low,
NVML watching every trial process, then what the storage and the dashboard say about it.

The study runs `python -m orchestrator run` exactly as a user would; everything checked afterwards
is read back from the study's storage (Optuna's trials, our orch_* tables) and from
optuna-dashboard's own API, and judged by the pure functions of gpu_check_compare.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benchmarks.gpu_check_adapter import UndersizedForecaster
from benchmarks.gpu_check_compare import (
    Check,
    GpuReading,
    StudyFacts,
    TrialRecord,
    compare_vram,
    dashboard_checks,
    most_at_once,
    nvml_peaks,
    oom_predictions,
    pids_by_time,
    study_checks,
    supports_gpu_part,
    trials_at_once,
    vram_checks,
)
from benchmarks.gpu_check_run import (
    ADAPTER_PATH,
    STUDY,
    TFT_OPTIONS,
    TINY_OPTIONS,
    CheckRun,
    child,
    options_args,
    orchestrator,
    plan_json,
    run_logged,
    say,
)
from orchestrator.record.store.location import StorageLocation

UNDERSIZE = UndersizedForecaster.options["undersize"]  # the memory model, 50 times too low
CONTEXT_BATCHES = [64, 512]


def study_setup(run: CheckRun, gpu: GpuReading | None) -> tuple[str, list[str], str]:
    """--gpus, the adapter's options, and the words for how the GPU is limited."""
    args = run.args
    if gpu is None:
        spec = f"sim:{args.simulate:g}"
        mode = f"simulated GPU of {args.simulate:,.0f} MB (memory scale {args.sim_memory_scale:g})"
        return spec, [*TINY_OPTIONS, f"undersize={UNDERSIZE}"], mode
    part = f"{args.part_mb:g}"
    options = [*TFT_OPTIONS, f"undersize={UNDERSIZE}", f"part_mb={part}"]
    helped = orchestrator(run, "run-help", "run", "--help", timeout=60)
    if supports_gpu_part(helped.stdout):
        return f"0:{part}", options, f"--gpus 0:{part}, {args.part_mb:,.0f} MB per trial process"
    return "0", options, f"{args.part_mb:,.0f} MB per trial process (memory fraction)"


def context_mb(run: CheckRun, options: Sequence[str]) -> tuple[float | None, list[dict]]:
    """What a trial process holds outside torch's allocator, measured once in a child process."""
    values = dict(option.split("=", 1) for option in options) | {"part_mb": "0"}
    payload = {"adapter": ADAPTER_PATH, "options": values, "batches": CONTEXT_BATCHES}
    try:
        readings = child(run, "context", payload, timeout=min(180, run.remaining()))["readings"]
    except RuntimeError as error:
        return None, [{"error": str(error)}]
    found = [r["context_mb"] for r in readings if r.get("context_mb") is not None]
    return (statistics.median(found) if found else None), readings


def run_study(
    run: CheckRun, spec: str, options: Sequence[str], seconds: float
) -> tuple[int, float]:
    args = run.args
    command = [
        sys.executable, "-m", "orchestrator", "run",
        "--adapter-path", ADAPTER_PATH, "--study", STUDY, "--storage", storage_url(run),
        "--trials", str(args.trials), "--epochs", str(args.epochs),
        "--swarm-size", str(args.swarm_size), "--gpus", spec, "--seed", "0",
        # Start no trial in the last minute, so that the ones running can finish in time.
        "--timeout", f"{max(30.0, seconds - 60):.0f}",
        *options_args(options),
    ]  # fmt: skip
    if spec.startswith("sim:"):
        command += ["--sim-memory-scale", f"{args.sim_memory_scale:g}"]
    say(f"study: {args.trials} trials of {ADAPTER_PATH} on --gpus {spec}")
    started = time.monotonic()
    done = run_logged(run, "study", command, timeout=seconds)
    return done.returncode, time.monotonic() - started


def storage_url(run: CheckRun) -> str:
    return f"sqlite:///{run.work / 'study.db'}"


def stage_study(run: CheckRun, gpu: GpuReading | None) -> None:
    spec, options, mode = study_setup(run, gpu)
    run.results["mode"] = mode
    plan = plan_json(
        run, "plan-study", ADAPTER_PATH, "--gpus", spec,
        "--swarm-size", str(run.args.swarm_size), *options_args(options),
    )  # fmt: skip
    context, readings = context_mb(run, options) if gpu is not None else (None, [])
    seconds = run.remaining() - 30  # what is left, less the time to read the study back
    if seconds < 60:
        run.add([Check("study", "study ran", False, f"time budget spent ({seconds:.0f} s left)")])
        return
    if gpu is None:
        rc, took = run_study(run, spec, options, seconds)
        samples, nvml_note = [], "a simulated GPU has no NVML"
    else:
        from benchmarks.gpu_check_nvml import NvmlSampler

        with NvmlSampler(gpu.uuid) as sampler:
            rc, took = run_study(run, spec, options, seconds)
        samples, nvml_note = sampler.samples, nvml_words(sampler)
    run.results["vram"] = {"context_mb": context, "context_readings": readings, "nvml": nvml_note}
    evaluate(run, gpu, plan, rc, took, samples, context, nvml_note)


def nvml_words(sampler: Any) -> str:
    seen = len({sample.pid for sample in sampler.samples})
    words = f"{sampler.readings} readings, {len(sampler.samples)} samples of {seen} processes"
    return f"{words}; {sampler.error}" if sampler.error else words


# --- reading the study back --------------------------------------------------------------


def trial_records(trials: Sequence[Any]) -> list[TrialRecord]:
    return [
        TrialRecord(
            number=trial.number,
            state=trial.state.name,
            start=trial.datetime_start.timestamp() if trial.datetime_start else None,
            end=trial.datetime_complete.timestamp() if trial.datetime_complete else None,
            user_attrs=dict(trial.user_attrs),
            params=dict(trial.params),
            retry_history=tuple(int(n) for n in trial.system_attrs.get("retry_history", ())),
        )
        for trial in trials
    ]


def dashboard_attrs(storage: Any, study_id: int) -> tuple[dict[int, dict[str, str]] | None, str]:
    """Each trial's user attributes as optuna-dashboard's API serves them to the browser."""
    try:
        from optuna_dashboard import wsgi
    except ImportError:
        return None, "optuna-dashboard is not installed here"
    from wsgiref.util import setup_testing_defaults

    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=f"/api/studies/{study_id}", QUERY_STRING="after=0")
    status: list[str] = []
    body = b"".join(wsgi(storage)(environ, lambda s, h, e=None: status.append(s)))
    if not status or not status[0].startswith("200"):
        return None, f"the dashboard answered {status[:1]}"
    trials = json.loads(body)["trials"]
    return {t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]} for t in trials}, ""


def evaluate(run, gpu, plan, rc, took, samples, context, nvml_note) -> None:
    import optuna

    from orchestrator.record.store import records
    from orchestrator.record.store.storage import create_storage
    from orchestrator.record.study.spec import count_trials, load_spec

    storage = create_storage(StorageLocation.parse(storage_url(run)))
    try:
        study = optuna.load_study(study_name=STUDY, storage=storage)
    except KeyError:
        run.add([Check("study", "study ran", False, f"no study stored; exit status {rc}")])
        return
    frozen = study.get_trials(deepcopy=False)
    trials = trial_records(frozen)
    spec = load_spec(study)
    events = records.list_concurrency_events(storage.engine, STUDY)
    rows = records.list_trial_vram(storage.engine, STUDY)
    facts = StudyFacts(
        trials=trials,
        budget=spec.trials if spec else run.args.trials,
        counted=count_trials(frozen).counted,
        max_retries=spec.max_retries if spec else 2,
        run_exit=rc,
        event_reasons=[(event.reason, event.detail or "") for event in events],
        real_gpu=gpu is not None,
    )
    run.add(study_checks(facts))
    shown, note = dashboard_attrs(storage, study._study_id)
    run.add(dashboard_checks(shown, rows, note))
    if gpu is not None:
        trials = check_vram(run, trials, samples, context, nvml_note)
    learnt = (
        records.load_memory_model(storage.engine, adapter="tft-undersized", gpu_name=gpu.name)
        if gpu
        else None
    )
    run.results["study"] = study_summary(run, plan, facts, trials, samples, took, events, learnt)


def check_vram(run, trials, samples, context, nvml_note) -> list[TrialRecord]:
    """Compare each trial's record with NVML; where no NVML pid is a trial's own, match by time."""
    peaks, method = nvml_peaks(trials, samples), "pid and time window"
    if samples and not peaks:
        guessed = pids_by_time(trials, samples)
        trials = [
            replace(t, user_attrs={**t.user_attrs, "pid": guessed[t.number]})
            if t.number in guessed
            else t
            for t in trials
        ]
        peaks, method = nvml_peaks(trials, samples), "time window only (NVML pids are not ours)"
    note = nvml_note if context is not None else f"{nvml_note}; no CUDA context measured"
    comparisons = compare_vram(trials, peaks, context or 0.0) if context is not None else []
    run.add(vram_checks(trials, comparisons, nvml_note=note))
    errors = [c.error for c in comparisons]
    run.results["vram"].update(
        method=method,
        compared=len(comparisons),
        worst_error=max(errors, key=abs) if errors else None,
        median_error=statistics.median(errors) if errors else None,
        trials=[c.as_dict() for c in comparisons],
    )
    return trials


def study_summary(run, plan, facts, trials, samples, took, events, learnt) -> dict[str, Any]:
    gpu_plan = plan["gpus"][0] if plan else {}
    pids = {t.pid for t in trials if t.pid is not None}
    reasons: dict[str, int] = {}
    for event in events:
        reasons[event.reason] = reasons.get(event.reason, 0) + 1
    calibrated = (run.results.get("calibration") or {}).get("tft", {}).get("measured")
    ooms = [t for t in trials if t.oom]
    return {
        "budget": facts.budget,
        "counted": facts.counted,
        "trial_runs": len(trials),
        "states": {
            s: sum(1 for t in trials if t.state == s) for s in sorted({t.state for t in trials})
        },
        "planned_at_once": gpu_plan.get("slots"),
        "planned_batch_bounds": gpu_plan.get("batch_bounds"),
        "planned_memory_model": gpu_plan.get("memory_model"),
        "achieved_at_once": trials_at_once(trials),
        "nvml_at_once": most_at_once(samples, pids) if samples else None,
        "ooms": len(ooms),
        "cuda_ooms": sum(1 for t in ooms if "(simulated)" not in t.error),
        "reruns": sum(1 for t in trials if t.retry_history),
        "slot_changes": reasons,
        "learnt_memory_model": learnt
        and {
            "model_overhead_mb": learnt.model_overhead_mb,
            "per_sample_mb": learnt.per_sample_mb,
            "source": learnt.source,
        },
        "oom_predictions": oom_predictions(trials, calibrated, run.args.part_mb)
        if calibrated
        else None,
        "seconds": round(took, 1),
    }
