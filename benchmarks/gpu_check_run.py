"""The GPU check's edges: its state, the clock of its time budget, and the processes it starts
(each from the repository root, with PYTHONPATH=. and its output kept in a log of the work folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_compare import Check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
ADAPTER_PATH = "benchmarks.gpu_check_adapter:adapter"
STUDY = "gpu-check"
# A GPU-sized forecaster: its largest trials need tens of GB, more than the part of the GPU.
TFT_OPTIONS = ("max_width=512", "max_window=256", "max_depth=4", "steps=6000")
# A tiny one for --simulate, where trials train on the CPU.
TINY_OPTIONS = ("max_width=16", "max_window=16", "max_depth=1", "steps=300")
DQN_OPTIONS = ("steps_per_epoch=4000",)
# What the check imports beside the standard library (pynvml and optuna-dashboard are optional).
NEEDED = ("torch", "numpy", "optuna", "sqlalchemy", "alembic")
TESTS_MAX_S = 240  # the gpu-marked tests take about a minute on an H200 (estimated)
STUDY_MIN_S = 180  # what the study needs after them


class BadInput(Exception):
    """Something the user typed cannot work: one line, exit status 2."""


@dataclass
class CheckRun:
    """One run of the GPU check: its arguments, work folder, clock, results and checks."""

    args: argparse.Namespace
    work: Path
    started: float
    results: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def remaining(self) -> float:
        return self.args.budget_seconds - (time.monotonic() - self.started)

    def add(self, checks: Sequence[Check]) -> None:
        self.checks.extend(checks)
        for check in checks:
            if check.ok is False:
                say(f"FAIL {check.stage}: {check.name}: {check.detail}")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("ORCHESTRATOR_STORAGE", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env


def say(line: str) -> None:
    print(f"{dt.datetime.now():%H:%M:%S} {line}", flush=True)


# --- processes ---------------------------------------------------------------------------


def run_logged(
    run: CheckRun, name: str, command: Sequence[str], timeout: float
) -> subprocess.CompletedProcess:
    """Run `command` from the repository root, its output kept in WORK/NAME.log. One that outlives
    `timeout` (or the check's time budget) gets SIGTERM (`run` then stops its trials within its grace period and re-queues
    them), and SIGKILL 45 s later. It stays in this process group, so whatever stops the check
    stops it and its trial processes too."""
    log = run.work / f"{name}.log"
    process = subprocess.Popen(
        list(command),
        cwd=ROOT,
        env=run.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=max(1.0, min(timeout, run.remaining())))
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            out, err = process.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        err += "\n[gpu_check] stopped: it ran out of time\n"
    log.write_text(f"$ {' '.join(command)}\n--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(list(command), process.returncode, out, err)


def orchestrator(run: CheckRun, name: str, *args: str, timeout: float = 300) -> Any:
    return run_logged(run, name, [sys.executable, "-m", "orchestrator", *args], timeout)


def child(run: CheckRun, kind: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A reading that needs torch's CUDA, taken in a child process (see gpu_check_nvml)."""
    command = [sys.executable, str(SCRIPT), "--child", kind, json.dumps(payload)]
    done = run_logged(run, f"child-{kind}", command, timeout)
    lines = done.stdout.strip().splitlines()
    try:
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])
    except ValueError:
        pass
    raise RuntimeError(f"the {kind} reading failed: {done.stderr.strip()[-300:]}")


def options_args(options: Sequence[str]) -> list[str]:
    return [part for option in options for part in ("--option", option)]


def declared_model(adapter_ref: str, options: Sequence[str]) -> dict[str, float]:
    import adapters

    adapter = adapters.load_path(adapter_ref) if ":" in adapter_ref else adapters.get(adapter_ref)
    model = adapters.memory_model_of(adapter, adapters.parse_options(adapter, list(options)))
    return {"model_overhead_mb": model.model_overhead_mb, "per_sample_mb": model.per_sample_mb}


def adapter_args(adapter: str) -> list[str]:
    return ["--adapter-path", adapter] if ":" in adapter else [adapter]


def plan_json(run: CheckRun, name: str, adapter: str, *args: str) -> dict[str, Any] | None:
    done = orchestrator(run, name, "plan", *adapter_args(adapter), "--json", *args, timeout=120)
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)
    except ValueError:
        return None
