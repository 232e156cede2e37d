"""Each trial's optuna-dashboard note: built from its records, stored as optuna-dashboard stores
notes (from any process, on SQLite and PostgreSQL), and seen at the top of the trial's page in
headless Chromium after a real `run`."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from cdp import Browser
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial
from optuna_dashboard._note import get_note_from_system_attrs
from test_dashboard_browser import (
    ARTIFACTS,
    REPO,
    free_port,
    require_chromium,
    wait_for_port,
)

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.trials.notes import save_trial_note, trial_note, write_trial_note
from tests.cli_helpers import run_cli
from tests.waiting import patient

ATTRS = {
    "gpu": "NVIDIA L40S",
    "gpu_index": 1,
    "host": "node-3",
    "concurrency": 6,
    "batch_bounds": [64, 1391],
    "vram_planned_mb": 1638.0,
    "vram_peak_mb": 2948.4,
    "oom": False,
}


def read_trial_note(study: optuna.Study, trial_id: int) -> str:
    """The trial's note as optuna-dashboard reads it ("" when it has none)."""
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return get_note_from_system_attrs(attrs, trial_id)["body"]


def frozen(state=TrialState.COMPLETE, value=1.25, attrs=None, steps=None, number=7):
    trial = create_trial(
        state=state,
        value=value,
        params={"batch_size": 761},
        distributions={"batch_size": IntDistribution(64, 4096, log=True)},
        user_attrs=ATTRS if attrs is None else attrs,
        intermediate_values=steps or {},
    )
    trial.number = number
    return trial


def test_a_note_says_gpu_vram_batch_slots_and_oom_first():
    note = trial_note(frozen(), metric="val_loss")
    assert note.splitlines()[0] == "### Trial 7: COMPLETE, val_loss 1.25"
    assert "- **GPU**: NVIDIA L40S (#1 on node-3)" in note
    assert "- **VRAM**: 2,948 MB peak of 1,638 MB planned (1.80x the plan)" in note
    assert "- **batch size**: 761 (this GPU's bounds 64..1391)" in note
    assert "- **slots**: 6 trials at once on this GPU" in note
    assert "- **out of memory**: no" in note
    assert "log" not in note  # no log file recorded, no line for one


def test_an_oom_note_says_why_in_one_line_and_names_the_log_file():
    error = "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB\n" + "x" * 2000
    attrs = {**ATTRS, "oom": True, "error": error, "log_file": "/logs/demo/trial-7.log"}
    note = trial_note(frozen(TrialState.FAIL, None, attrs), metric="loss")
    assert note.startswith("### Trial 7: FAIL\n")
    oom_line = next(line for line in note.splitlines() if "out of memory**" in line)
    assert oom_line.startswith("- **out of memory**: **yes**: out of memory: CUDA out of memory.")
    assert len(oom_line) < 400 and oom_line.endswith("...")
    assert "- **error**" not in note  # the OOM line already says it
    assert "- **log**: `/logs/demo/trial-7.log`" in note


def test_a_pruned_or_failed_trial_and_missing_records():
    pruned = trial_note(frozen(TrialState.PRUNED, None, steps={0: 9.0, 1: 8.5}), metric="loss")
    assert "PRUNED at epoch 1 (loss 8.5)" in pruned
    # Optuna gives a pruned trial its last epoch's value: still said as where it was stopped
    pruned = trial_note(frozen(TrialState.PRUNED, 8.5, steps={0: 9.0, 1: 8.5}), metric="loss")
    assert pruned.startswith("### Trial 7: PRUNED at epoch 1 (loss 8.5)")
    failed = trial_note(frozen(TrialState.FAIL, None, {"error": "ValueError: bad"}))
    assert "- **error**: ValueError: bad" in failed
    assert "- **GPU**: not recorded" in failed and "- **VRAM**: not measured" in failed
    fitted = trial_note(frozen(attrs={**ATTRS, "batch_size_fitted_from": 2048}))
    assert "brought in from 2048" in fitted


WRITER = """
import sys, optuna
from orchestrator.record.trials.notes import write_trial_note
study = optuna.load_study(study_name="notes", storage=sys.argv[1])
for trial in study.get_trials():
    write_trial_note(study, trial, metric="loss")
"""


def test_notes_written_by_another_process_are_the_dashboards_notes(storage_url):
    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name="notes", storage=open_storage(StorageLocation.parse(storage_url))
    )
    for i in range(3):
        study.add_trial(frozen(value=float(i), number=i))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    subprocess.run([sys.executable, "-c", WRITER, storage_url], check=True, env=env, timeout=120)

    attrs = study._storage.get_study_system_attrs(study._study_id)
    for trial in study.get_trials():
        expected = trial_note(trial, metric="loss")
        assert get_note_from_system_attrs(attrs, trial._trial_id) == {
            "version": 1,
            "body": expected,
        }

    # A second, shorter note replaces the first whole: a new version, no tail of the old one.
    first = study.get_trials()[0]
    long_body = "long " * 1000  # three chunks
    save_trial_note(study, first._trial_id, long_body)
    save_trial_note(study, first._trial_id, "short")
    assert read_trial_note(study, first._trial_id) == "short"
    attrs = study._storage.get_study_system_attrs(study._study_id)
    assert get_note_from_system_attrs(attrs, first._trial_id)["version"] == 3


@pytest.mark.browser
def test_the_note_is_on_the_first_screen_of_a_trial_page_after_a_real_run(sqlite_url, tmp_path):
    chromium = require_chromium()
    done = run_cli(
        "run", "synthetic", "--study", "noted", "--trials", "3", "--epochs", "2",
        "--gpus", "sim:12288,sim:24576", "--option", "trial_seconds=0.05", "--storage", sqlite_url,
        "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="noted", storage=sqlite_url)
    for trial in study.get_trials():  # each trial process wrote its trial's note after tell
        assert read_trial_note(study, trial._trial_id) == trial_note(trial, metric="loss")
    trial = study.get_trials()[1]
    peak, planned = trial.user_attrs["vram_peak_mb"], trial.user_attrs["vram_planned_mb"]
    needles = [
        f"Trial {trial.number}: COMPLETE, loss {trial.value:.6g}",
        f"GPU: {trial.user_attrs['gpu']}",
        f"VRAM: {peak:,.0f} MB peak of {planned:,.0f} MB planned",
        f"batch size: {trial.params['batch_size']} (this GPU's bounds",
        "out of memory: no",
    ]

    port = free_port()
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "dashboard", "--storage", sqlite_url, "--port", str(port)],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for_port(port, dashboard)
        url = f"http://127.0.0.1:{port}/dashboard/studies/{study._study_id}/trials?numbers={trial.number}"
        with Browser(chromium, tmp_path / "profile") as browser:
            browser.open(url)
            browser.wait_for_text(needles[-1])
            seen = {needle: browser.on_first_screen(needle) for needle in needles}
            browser.screenshot(ARTIFACTS / "dashboard-note.png")
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=patient(10))
    assert seen == dict.fromkeys(needles, True)


def test_a_note_that_cannot_be_stored_costs_a_warning_not_the_trial(
    sqlite_url, caplog, monkeypatch
):
    import sqlalchemy as sa

    from orchestrator.record.store.migrate import open_storage

    study = optuna.create_study(
        study_name="notes", storage=open_storage(StorageLocation.parse(sqlite_url))
    )
    study.add_trial(frozen(number=0))
    trial = study.get_trials()[0]

    def lost(*args, **kwargs):
        raise sa.exc.OperationalError("UPDATE", {}, Exception("database is locked"))

    monkeypatch.setattr(study._storage, "set_study_system_attr", lost)
    assert write_trial_note(study, trial) is None
    assert "no dashboard note for trial 0" in caplog.text and "database is locked" in caplog.text
