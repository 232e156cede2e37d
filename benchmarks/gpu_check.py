"""The GPU acceptance run: one command that proves the GPU side of the orchestrator on a real GPU.

    PYTHONPATH=. python benchmarks/gpu_check.py        # at most 8 minutes, no network

1. probe: NVML and torch see the same GPU (name, UUID, total and free memory);
2. calibrate: `plan dqn --calibrate` and `plan tft --calibrate` (a GPU-sized tft), declared
   against measured memory models;
3. study: a real study of tft on part of the GPU (24,576 MB per trial process; `--gpus 0:24576`
   too where `run` offers it) with a memory model fifty times too low
   (benchmarks/gpu_check_adapter.py), so that real CUDA out-of-memory errors happen and the pool
   must catch them, halve and re-run;
4. vram: each trial's `vram_peak_mb` against what NVML saw for that trial's process (within 5%,
   after the CUDA context), no trial lost, the budget exact, and optuna-dashboard's trial
   attributes holding the stored numbers;
5. tests: `python -m pytest -m gpu` on the test files that have gpu-marked tests;
6. writes benchmarks/results/gpu.json and the tables of docs/gpu.md (and copies both, with the
   logs, to --copy-to, by default $OUT where that is set).

Without a GPU it says so in one line, runs what a CPU can (the probes, the plan path, the
collection of the gpu-marked tests, the result and table writing) and exits 0 when those pass.
`--simulate MB` runs step 3 on a simulated GPU of MB instead, to try the study part anywhere.
The check installs nothing: it uses the Python it runs under, with PYTHONPATH=. (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script: find the project
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_check_report as report
from benchmarks.gpu_check_compare import (
    Check,
    GpuReading,
    calibration_checks,
    compare_probes,
    count_collected,
    gpu_test_checks,
    parse_calibrated,
    parse_pytest_summary,
    verdict,
)
from benchmarks.gpu_check_run import (
    ADAPTER_PATH,
    DQN_OPTIONS,
    NEEDED,
    ROOT,
    STUDY_MIN_S,
    TESTS_MAX_S,
    TFT_OPTIONS,
    BadInput,
    CheckRun,
    child,
    declared_model,
    options_args,
    orchestrator,
    plan_json,
    run_logged,
    say,
)
from benchmarks.gpu_check_study import UNDERSIZE, stage_study


def child_main(kind: str, payload: str) -> int:
    from benchmarks import gpu_check_nvml as nvml

    data = json.loads(payload)
    if kind == "probe":
        print(json.dumps(nvml.probe_reading()))
    else:
        print(json.dumps(nvml.context_reading(data["adapter"], data["options"], data["batches"])))
    return 0


# --- 1. probe ----------------------------------------------------------------------------


def stage_probe(run: CheckRun) -> GpuReading | None:
    try:
        reading = child(run, "probe", {}, timeout=min(120, run.remaining()))
    except RuntimeError as error:
        run.add([Check("probe", "NVML and torch agree", False, str(error))])
        return None
    nvml, torch = (
        GpuReading(**reading[key]) if reading.get(key) else None for key in ("nvml", "torch")
    )
    run.results["environment"] = {
        key: reading[key]
        for key in ("torch_version", "torch_cuda", "torch_file", "cuda_available", "driver")
    } | {"python": sys.version.split()[0]}
    run.results["probe"] = {"nvml": reading.get("nvml"), "torch": reading.get("torch")}
    run.add(compare_probes(nvml, torch))
    gpu = nvml or torch
    if gpu is not None:
        run.results["gpu"] = {"name": gpu.name, "total_mb": gpu.total_mb, "uuid": gpu.uuid}
        run.add(
            [
                Check(
                    "probe",
                    "torch is a CUDA build",
                    bool(reading["cuda_available"] and reading["torch_cuda"]),
                    f"torch {reading['torch_version']} (CUDA {reading['torch_cuda']}) "
                    f"from {reading['torch_file']}",
                )
            ]
        )
    return gpu


# --- 2. plan and calibrate ---------------------------------------------------------------


def stage_plan_on_cpu(run: CheckRun) -> None:
    """The plan path where there is no GPU: one trial at a time on the CPU, the undersized
    model as declared, and --calibrate refused in one line."""
    stage = "plan"
    plan = plan_json(run, "plan-tft", "tft", "--gpus", "none", *options_args(TFT_OPTIONS))
    first = plan["gpus"][0] if plan else {}
    cpu_only = bool(plan) and first["device"] is None and plan["total_slots"] == 1
    detail = (
        f"{plan['total_slots']} slot, batch sizes {first['batch_bounds']}" if plan else "no plan"
    )
    run.add([Check(stage, "tft plans 1 trial on the CPU", cpu_only, detail)])

    options = (*TFT_OPTIONS, f"undersize={UNDERSIZE}")
    plan = plan_json(run, "plan-undersized", ADAPTER_PATH, "--gpus", "none", *options_args(options))
    declared = declared_model("tft", TFT_OPTIONS)
    wanted = {key: value * UNDERSIZE for key, value in declared.items()}
    got = plan["gpus"][0]["memory_model"] if plan else {}
    same = bool(got) and all(abs(got[key] - wanted[key]) < 1e-6 for key in wanted)
    detail = f"{describe(got)}, tft declares {describe(declared)}" if got else "no plan"
    run.add([Check(stage, f"the check's model is tft's times {UNDERSIZE}", same, detail)])

    done = orchestrator(
        run, "plan-calibrate-cpu", "plan", "tft", "--gpus", "none", "--calibrate", timeout=120
    )
    lines = done.stderr.strip().splitlines()
    refused = (
        done.returncode == 2
        and len(lines) == 1
        and lines[0].startswith("error: --calibrate needs a real CUDA GPU")
    )
    detail = f"exit {done.returncode}: {done.stderr.strip()[:200]}"
    run.add([Check(stage, "--calibrate without a GPU: one line, exit 2", refused, detail)])


def describe(model: dict[str, float]) -> str:
    return f"{model['model_overhead_mb']:,.1f} MB + {model['per_sample_mb']:.4g} MB/sample"


def stage_calibrate(run: CheckRun) -> None:
    storage = f"sqlite:///{run.work / 'calibrate.db'}"
    run.results["calibration"] = {}
    for adapter, options in (("dqn", DQN_OPTIONS), ("tft", TFT_OPTIONS)):
        if run.remaining() < 60:
            run.add([Check("calibrate", f"{adapter}: calibrated", False, "time budget spent")])
            continue
        common = ["--gpus", "0", "--storage", storage, *options_args(options)]
        say(f"calibrate: plan {adapter} --calibrate {' '.join(options)}")
        done = orchestrator(
            run, f"calibrate-{adapter}", "plan", adapter, "--calibrate", *common, timeout=240
        )
        peaks = parse_calibrated(done.stdout).get(adapter, [])
        plan = plan_json(run, f"plan-{adapter}", adapter, *common)
        measured = plan["gpus"][0]["memory_model"] if plan else None
        run.results["calibration"][adapter] = {
            "options": list(options),
            "declared": declared_model(adapter, options),
            "measured": measured,
            "peaks": peaks,
            "output": done.stdout.strip().splitlines()[-1:] + done.stderr.strip().splitlines()[-3:],
        }
        run.add(calibration_checks(adapter, peaks=peaks, measured=measured))


# --- 5. the gpu-marked tests -------------------------------------------------------------


def gpu_test_files() -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("test_*.py")
        if "mark.gpu" in path.read_text()
    )


def stage_tests(run: CheckRun, on_gpu: bool) -> None:
    files = gpu_test_files()
    pytest = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files]
    if not on_gpu:
        done = run_logged(run, "tests-collect", [*pytest, "--collect-only"], timeout=300)
        found = count_collected(done.stdout)
        detail = f"{found} in {', '.join(files)}; they run where there is a GPU"
        run.add([Check("tests", "gpu-marked tests are collected", found > 0, detail)])
        return
    budget = min(TESTS_MAX_S, run.remaining() - STUDY_MIN_S)
    if budget < 30:
        run.add([Check("tests", "gpu-marked tests pass", False, "time budget spent")])
        return
    say(f"tests: python -m pytest -m gpu {' '.join(files)}")
    started = time.monotonic()
    done = run_logged(run, "tests", pytest, timeout=budget)
    counts = parse_pytest_summary(done.stdout)
    run.results["tests"] = {
        "files": files,
        "counts": counts,
        "seconds": round(time.monotonic() - started, 1),
    }
    run.add(gpu_test_checks(counts, done.returncode))


# --- 6. results --------------------------------------------------------------------------


def write_results(run: CheckRun) -> Path:
    """gpu.json as it stands: written after every step, so a run stopped early keeps its part."""
    args, results = run.args, run.results
    results["seconds"] = round(time.monotonic() - run.started, 1)
    results["checks"] = [check.as_dict() for check in run.checks]
    results["passed"] = verdict(run.checks)
    results["results_path"] = _shown(args.results)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2, default=str) + "\n")
    if args.copy_to:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.results, args.copy_to / args.results.name)
    return args.results


def write_docs(run: CheckRun) -> Path:
    """The tables of docs/gpu.md (the rest of the page is kept), and the logs beside the copies."""
    args = run.args
    page = args.docs.read_text() if args.docs.exists() else "# The GPU check\n"
    args.docs.parent.mkdir(parents=True, exist_ok=True)
    args.docs.write_text(report.replace_section(page, report.docs_section(run.results)))
    if args.copy_to:
        # Eight files at most: the results, the page, five logs and the console output beside them.
        for path in [args.docs, *sorted(run.work.glob("*.log"), key=_log_rank)[:5]]:
            shutil.copy(path, args.copy_to / path.name)
    return args.docs


def _log_rank(path: Path) -> tuple[int, str]:
    first = ("crash", "study", "tests", "calibrate-tft", "calibrate-dqn", "child-context")
    return (first.index(path.stem) if path.stem in first else len(first), path.name)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- the command -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from orchestrator.flags.common import Parser  # one line and exit status 2 on a usage error

    parser = Parser(
        prog="benchmarks/gpu_check.py",
        description="Prove the GPU side on a real GPU in one command (docs/gpu.md).",
    )
    parser.add_argument("--budget-seconds", type=float, default=480, metavar="S")
    parser.add_argument(
        "--part-mb",
        type=float,
        default=24576,
        metavar="MB",
        help="the part of the GPU the study may use (default 24576)",
    )
    parser.add_argument("--trials", type=int, default=20, help="the study's budget (default 20)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per trial (default 3)")
    parser.add_argument(
        "--swarm-size", type=int, default=8, help="the most trials at once (default 8)"
    )
    parser.add_argument(
        "--simulate",
        type=float,
        metavar="MB",
        help="run the study on a simulated GPU of MB (no GPU needed)",
    )
    parser.add_argument("--sim-memory-scale", type=float, default=60.0, metavar="F")
    parser.add_argument("--skip-tests", action="store_true", help="leave out step 5")
    parser.add_argument(
        "--results",
        type=Path,
        metavar="PATH",
        help="default benchmarks/results/gpu.json on a GPU, WORK/gpu.json without",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        metavar="PATH",
        help="default docs/gpu.md on a GPU, WORK/gpu.md without",
    )
    parser.add_argument(
        "--copy-to",
        type=Path,
        metavar="DIR",
        help="copy the results and logs there (default $OUT where it is set)",
    )
    parser.add_argument("--work-dir", type=Path, metavar="DIR", help="databases and logs")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return check_args(parser.parse_args(argv))


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    for flag in ("budget_seconds", "part_mb", "trials", "epochs", "sim_memory_scale"):
        if getattr(args, flag) <= 0:
            raise BadInput(f"--{flag.replace('_', '-')} must be more than 0")
    if args.swarm_size < 2:
        raise BadInput("--swarm-size must be at least 2 (a swarm needs two particles)")
    if args.simulate is not None and args.simulate <= 0:
        raise BadInput("--simulate takes the simulated GPU's size in MB, e.g. --simulate 24576")
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing and not args.child:
        raise BadInput(
            f"{', '.join(missing)} not installed for {sys.executable}: install the project's "
            "dependencies (on a GPU machine, carry them as wheels: docs/gpu.md)"
        )
    if args.copy_to is None and os.environ.get("OUT"):
        args.copy_to = Path(os.environ["OUT"])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.child:
        return child_main(*args.child)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    run = CheckRun(args, work, time.monotonic())
    run.results["command"] = "PYTHONPATH=. python " + " ".join(
        ["benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
    )
    run.results["started_at"] = f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    found: list[GpuReading | None] = []
    guarded(run, lambda r: found.append(stage_probe(r)))
    gpu = found[0] if found else None
    on_gpu = gpu is not None
    if on_gpu:
        say(f"{gpu.name}, {gpu.total_mb:,.0f} MB: probing, calibrating, testing, then the study")
    else:
        say("no GPU here (NVML and torch see none): running the CPU-side checks only")
    args.results = args.results or (
        ROOT / "benchmarks/results/gpu.json" if on_gpu else work / "gpu.json"
    )
    args.docs = args.docs or (ROOT / "docs/gpu.md" if on_gpu else work / "gpu.md")
    run.results["mode"] = "CPU-side checks only"
    # On a GPU the tests come before the study: their cost is fixed, the study takes what is left.
    steps = [stage_calibrate] if on_gpu else [stage_plan_on_cpu]
    if not args.skip_tests:
        steps.append(lambda r: stage_tests(r, on_gpu))
    if on_gpu or args.simulate:
        steps.append(lambda r: stage_study(r, gpu))
    for step in steps:
        guarded(run, step)
        write_results(run)
    return finish(run)


def guarded(run: CheckRun, step: Any) -> None:
    """Run one step; one that breaks fails a check, with its traceback in WORK/crash.log, and the
    other steps still run: on a machine lent for minutes, a partial answer beats none."""
    try:
        step(run)
    except Exception as error:
        with open(run.work / "crash.log", "a") as log:
            log.write(traceback.format_exc() + "\n")
        run.add(
            [Check("check", "a step ran to its end", False, f"{type(error).__name__}: {error}")]
        )


def finish(run: CheckRun) -> int:
    written = [write_results(run), write_docs(run)]
    print()
    print("\n".join(report.check_lines(run.results["checks"])))
    print()
    print("\n".join(report.summary_table(run.results)))
    print()
    passed = run.results["passed"]
    say(
        f"{'passed' if passed else 'FAILED'} in {run.results['seconds']:.0f} s; wrote "
        + ", ".join(_shown(path) for path in written)
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
