"""Admission by bytes with real trial processes on simulated GPUs: trials of different sizes
share a GPU, an estimate 3x too low is learnt within two OOMs, a second node starts from what the
first learnt, and the study's budget caps the trials at once."""

from __future__ import annotations

import datetime
import itertools

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.record.store import records
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import count_trials
from tests.cli_helpers import run_cli

SIM_2GB = "Simulated GPU 1.95 GB"


def _study(url, name):
    return optuna.load_study(study_name=name, storage=StorageLocation.parse(url).url)


def _engine(url):
    return sa.create_engine(StorageLocation.parse(url).url)


def _admitted(trial) -> datetime.datetime:
    return datetime.datetime.fromisoformat(trial.user_attrs["admitted_at"])


def _overlap(a, b) -> bool:
    """Both held their GPU at once: from admission (a trial asks, then waits for room) to the end."""
    end_a, end_b = (t.datetime_complete.astimezone(datetime.UTC) for t in (a, b))
    return _admitted(a) < end_b and _admitted(b) < end_a


def test_trials_of_different_sizes_share_a_gpu_without_an_oom(sqlite_url):
    # 100 MB + 1 MB a sample on 6000 MB (4800 usable): a trial at 4096 fits alone, and small ones
    # fit several at once, so the batch range stays whole and no size is given up for company.
    done = run_cli(
        "run", "synthetic", "--trials", "10", "--seed", "3", "--storage", sqlite_url,
        "--gpus", "sim:6000", "--option", "overhead_mb=100", "--option", "per_sample_mb=1.0",
        "--option", "trial_seconds=3", "--epochs", "3", "--pruner", "none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = _study(sqlite_url, "synthetic").trials
    assert all(t.state == TrialState.COMPLETE and not t.user_attrs["oom"] for t in trials)
    assert all(t.user_attrs["batch_bounds"] == [64, 4096] for t in trials)
    pairs = [
        (a, b)
        for a, b in itertools.combinations(trials, 2)
        if _overlap(a, b) and a.params["batch_size"] != b.params["batch_size"]
    ]
    assert pairs, "no two trials of different batch sizes ran at once"
    for trial in trials:  # what ran together, at each admission, was planned to fit together
        held = [
            t
            for t in trials
            if t is trial or _overlap(t, trial) and _admitted(t) <= _admitted(trial)
        ]
        assert sum(t.user_attrs["vram_planned_mb"] for t in held) <= 4800, [
            (t.number, t.user_attrs["vram_planned_mb"]) for t in held
        ]


def test_an_estimate_3x_too_low_is_learnt_within_two_ooms_and_a_second_node_starts_from_it(
    sqlite_url,
):
    common = (
        "--storage", sqlite_url, "--gpus", "sim:2000", "--sim-memory-scale", "3",
        "--option", "trial_seconds=1", "--option", "overhead_mb=500",
        "--option", "per_sample_mb=0.02", "--pruner", "none",
    )  # fmt: skip
    first = run_cli("run", "synthetic", "--trials", "8", *common)
    assert first.returncode == 0, first.stderr
    study = _study(sqlite_url, "synthetic")
    assert sum(1 for t in study.trials if t.user_attrs.get("oom")) <= 2
    assert count_trials(study.trials).counted == 8
    learnt = records.load_memory_model(_engine(sqlite_url), adapter="synthetic", gpu_name=SIM_2GB)
    assert learnt is not None and learnt.source == "trials"
    assert learnt.model_overhead_mb >= 2.5 * 500  # what the trials really held, about 3x

    # Another node joins with nothing learnt of its own: it plans with what the first stored.
    second = run_cli("run", "synthetic", "--trials", "10", *common)
    assert second.returncode == 0, second.stderr
    assert "memory model measured (trials" in second.stderr
    later = [t for t in _study(sqlite_url, "synthetic").trials if t.number >= 8]
    assert later and all(t.user_attrs["vram_planned_mb"] >= 2.5 * 500 for t in later)
    assert not any(t.user_attrs.get("oom") for t in later)


def test_the_study_s_budget_caps_the_trials_at_once(sqlite_url):
    done = run_cli(
        "run", "synthetic", "--trials", "2", "--storage", sqlite_url, "--gpus", "sim:81920",
        "--option", "trial_seconds=0.5", "--epochs", "1", "--pruner", "none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (start, *_) = records.list_concurrency_events(_engine(sqlite_url), "synthetic")
    assert start.reason == "start" and "at most 2 at once (limited by budget)" in start.detail
