"""Warm trial processes: trial after trial in one process, and a fresh one after an OOM, a CUDA
error, memory growth or N trials (or for every trial, when asked). Real processes throughout."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.run.messages import Recycling, TrialOutcome
from orchestrator.run.trial.worker import recycle_reason
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = "tests.lifecycle_adapter:adapter"


def _run(storage: str, *flags: str, trials: int = 4) -> list[optuna.trial.FrozenTrial]:
    env = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = run_cli(
        "run",
        "--adapter-path",
        ADAPTER,
        "--study",
        "life",
        "--trials",
        str(trials),
        "--epochs",
        "1",
        "--pruner",
        "none",
        "--concurrency",
        "1",
        "--storage",
        storage,
        *flags,
        env=env,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="life", storage=storage)
    return sorted(study.trials, key=lambda t: t.number)


def _pids(trials) -> list[int]:
    return [t.user_attrs["pid"] for t in trials]


def test_one_warm_process_runs_trial_after_trial(sqlite_url):
    trials = _run(sqlite_url, "--gpus", "none")
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert len(set(_pids(trials))) == 1


def test_fresh_process_runs_every_trial_in_a_process_of_its_own(sqlite_url):
    trials = _run(sqlite_url, "--gpus", "none", "--fresh-process", trials=3)
    assert len(set(_pids(trials))) == 3


def test_a_process_is_recycled_after_n_trials(sqlite_url):
    pids = _pids(_run(sqlite_url, "--gpus", "none", "--recycle-after", "2", trials=5))
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_a_process_is_recycled_after_an_out_of_memory_error(sqlite_url, tmp_path):
    trials = _run(
        sqlite_url,
        "--gpus",
        "sim:24576",
        "--option",
        "fail_once=oom",
        "--option",
        f"marker={tmp_path / 'oom'}",
        trials=3,
    )
    (oomed,) = [t for t in trials if t.user_attrs.get("oom")]
    after = [t for t in trials if t.number > oomed.number]
    assert after and all(t.user_attrs["pid"] != oomed.user_attrs["pid"] for t in after)
    assert oomed.state == TrialState.FAIL
    assert any(t.user_attrs.get("retry_of") == oomed.number for t in trials)  # and re-run


def test_a_process_is_recycled_after_a_cuda_error(sqlite_url, tmp_path):
    trials = _run(
        sqlite_url,
        "--gpus",
        "none",
        "--option",
        "fail_once=cuda",
        "--option",
        f"marker={tmp_path / 'cuda'}",
        trials=3,
    )
    (broken,) = [t for t in trials if t.state == TrialState.FAIL]
    assert "CUDA error" in broken.user_attrs["error"]
    later = [t for t in trials if t.number > broken.number]
    assert later and all(t.user_attrs["pid"] != broken.user_attrs["pid"] for t in later)


def test_a_process_whose_memory_grows_is_recycled(sqlite_url):
    # 200 MB kept per trial, a 300 MB bound: the third trial pushes it past, the fourth is fresh.
    pids = _pids(
        _run(
            sqlite_url,
            "--gpus",
            "none",
            "--option",
            "leak_mb=200",
            "--recycle-memory-mb",
            "300",
            trials=5,
        )
    )
    assert pids[0] == pids[1] == pids[2] != pids[3]


def test_each_trial_s_simulated_vram_peak_is_its_own(sqlite_url):
    trials = _run(sqlite_url, "--gpus", "sim:24576", "--sim-memory-scale", "2", trials=4)
    assert len(set(_pids(trials))) == 1
    for trial in trials:
        planned = 100.0 + 0.01 * trial.params["batch_size"]
        assert trial.user_attrs["vram_peak_mb"] == pytest.approx(2 * planned, abs=0.1)


@pytest.mark.gpu
def test_each_trial_s_cuda_peak_is_its_own_in_a_shared_process(sqlite_url):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    big = _run(sqlite_url, "--gpus", "0", "--option", "cuda_mb=2048", trials=1)
    small = _run(sqlite_url, "--gpus", "0", "--option", "cuda_mb=64", trials=3)
    assert big[0].user_attrs["vram_peak_mb"] >= 2048
    assert len(set(_pids(small[1:]))) == 1
    for trial in small[1:]:
        assert trial.user_attrs["vram_peak_mb"] < 512


@pytest.mark.parametrize(
    ("outcome", "done", "resident", "expected"),
    [
        (TrialOutcome(1, "COMPLETE"), 1, 500.0, None),
        (TrialOutcome(1, "FAIL", oom=True), 1, 500.0, "out of memory"),
        (TrialOutcome(1, "FAIL", cuda_error=True), 1, 500.0, "CUDA error"),
        (TrialOutcome(1, "FAIL", interrupted=True), 1, 500.0, "stopped"),
        (TrialOutcome(1, "COMPLETE"), 5, 500.0, "ran 5 trials"),
        (TrialOutcome(1, "COMPLETE"), 2, 900.0, "resident memory grew by 500 MB (limit 300)"),
        (TrialOutcome(1, "COMPLETE"), 2, 700.0, None),
    ],
)
def test_recycle_reason(outcome, done, resident, expected):
    recycling = Recycling(after_trials=5, memory_growth_mb=300.0)
    reason = recycle_reason(
        recycling, outcome, trials_done=done, resident_mb=resident, baseline_mb=400.0
    )
    assert reason == expected


def test_recycle_reason_without_limits_keeps_the_process():
    reason = recycle_reason(
        Recycling(after_trials=None, memory_growth_mb=None),
        TrialOutcome(1, "COMPLETE"),
        trials_done=10_000,
        resident_mb=1e6,
        baseline_mb=1.0,
    )
    assert reason is None


@pytest.mark.parametrize(
    ("error", "oom", "cuda"),
    [
        (RuntimeError("CUDA error: out of memory"), True, True),
        (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), True, True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False, True),
        (RuntimeError("shapes cannot be multiplied"), False, False),
        (ValueError("CUDA error: out of memory"), False, False),
    ],
)
def test_cuda_failures_are_told_apart(error, oom, cuda):
    from orchestrator.run.trial.errors import is_cuda_error, is_cuda_out_of_memory

    assert is_cuda_out_of_memory(error) is oom
    assert is_cuda_error(error) is cuda
