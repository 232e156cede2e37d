"""A spool that cannot be tricked: a kept trial outcome that was edited, holds an unknown state,
or is not JSON at all is set aside in `spool/rejected/` with one line naming the file, never
stored, and never stops a later start; a result kept for a trial another host finished meanwhile
is dropped in one line, even when the other host finishes it between the look and the write; a
spool folder that cannot be written is said at start. Real `run` processes on PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import optuna
from optuna.trial import TrialState

from orchestrator.record.spool import spool
from orchestrator.record.spool.entry import checksum
from orchestrator.record.store.optuna_private import storage_of, trial_id_of
from tests.cli_helpers import cli_env, run_cli
from tests.waiting import patient

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _run(url: str, logs: Path, study: str, trials: int):
    return run_cli(
        "run", "--adapter-path", "tests.misbehaving_adapter:adapter", "--study", study,
        "--trials", str(trials), "--epochs", "2", "--pruner", "none", "--concurrency", "1",
        "--gpus", "none", "--storage", url, "--log-dir", str(logs),
        env=_env(),
    )  # fmt: skip


def test_edited_bogus_and_unreadable_entries_are_set_aside_and_the_run_goes_on(
    postgres_url, tmp_path
):
    logs = tmp_path / "logs"
    first = _run(postgres_url, logs, "tricked", 1)
    assert first.returncode == 0, first.stderr
    study = optuna.load_study(study_name="tricked", storage=postgres_url)
    (finished,) = study.trials
    waiting = study.ask()  # a trial whose process died after keeping its outcome
    waiting.suggest_float("x", 0.0, 1.0)
    folder = spool.spool_dir(logs, "tricked")

    edited = spool.keep(folder, spool.Kept(trial_id_of(waiting), 1, "COMPLETE", [0.5], {}))
    assert stat.S_IMODE(edited.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    edited.write_text(edited.read_text().replace("0.5", "-1000.0"))  # a better value, by hand
    content = {"trial_id": 99999991, "number": 7, "state": "BOGUS", "values": [1.0]}
    content |= {"user_attrs": {}, "reports": []}
    bogus = folder / "trial-id-99999991.json"
    bogus.write_text(json.dumps({**content, "sha256": checksum(content)}))
    unreadable = folder / "trial-id-99999992.json"
    unreadable.write_text("{not json")
    other_host = spool.keep(  # a result for a trial that another host finished meanwhile
        folder, spool.Kept(trial_id_of(finished), finished.number, "FAIL", None)
    )

    again = _run(postgres_url, logs, "tricked", 3)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    lines = again.stderr.splitlines()
    for path, why in [
        (edited, "does not match its checksum"),
        (bogus, "holds an unknown state 'BOGUS'"),
        (unreadable, "is not readable JSON"),
    ]:
        said = [line for line in lines if str(path) in line]
        assert len(said) == 1 and why in said[0] and "set aside" in said[0], lines
        assert (folder / "rejected" / path.name).exists()
    dropped = [line for line in lines if f"trial {finished.number} was finished meanwhile" in line]
    assert len(dropped) == 1 and "dropped" in dropped[0], lines
    assert not other_host.exists() and spool.kept_in(folder) == []

    trials = optuna.load_study(study_name="tricked", storage=postgres_url).trials
    assert all(t.value != -1000.0 for t in trials), [t.value for t in trials]
    assert trials[0].state == TrialState.COMPLETE  # its own end, not the FAIL kept here
    assert trials[1].state == TrialState.FAIL  # never started: failed as lost, run again
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 3, trials

    third = _run(postgres_url, logs, "tricked", 3)  # what was set aside is not read again
    assert third.returncode == 0 and "kept trial outcome" not in third.stderr, third.stderr


def test_a_trial_finished_by_another_host_between_the_look_and_the_write(
    sqlite_url, tmp_path, caplog
):
    """Optuna refuses to change a finished trial (UpdateFinishedTrialError): one line, the
    entry dropped, the other host's end kept, and the start goes on."""
    study = optuna.create_study(study_name="race", storage=sqlite_url)
    trial = study.ask()
    storage = storage_of(study)
    looked = storage.get_trial(trial_id_of(trial))  # RUNNING when this host looked
    study.tell(trial, state=TrialState.FAIL)  # ... then the other host failed it as lost
    folder = spool.spool_dir(tmp_path, "race")
    spool.keep(folder, spool.Kept(trial_id_of(trial), 0, "COMPLETE", [0.5], {}, [(0, 0.5)]))

    real_tell = spool._tell

    def seen_running(study, kept, frozen):  # every look inside the write still sees RUNNING
        storage.get_trial = lambda trial_id: looked
        try:
            real_tell(study, kept, frozen)
        finally:
            del storage.get_trial

    spool._stored, stored = (lambda study, kept: looked), spool._stored
    spool._tell = seen_running
    try:
        with caplog.at_level(logging.WARNING, logger=spool.__name__):
            assert spool.deliver(study, folder) == 0
    finally:
        spool._stored, spool._tell = stored, real_tell
    (told,) = optuna.load_study(study_name="race", storage=sqlite_url).trials
    assert told.state == TrialState.FAIL and told.intermediate_values == {}
    said = [r.getMessage() for r in caplog.records if r.name == spool.__name__]
    assert said == [
        "trial 0 was finished meanwhile (FAIL, by another host or as lost); "
        "the result kept while the database was away is dropped"
    ]
    assert spool.kept_in(folder) == [] and not (folder / "rejected").exists()


def test_an_entry_a_live_trial_process_holds_is_left_to_it(sqlite_url, tmp_path):
    """Every start on a host shares its spool: an entry whose writer is alive (its lock held) is
    not delivered by another start, which would race the writer's own tell."""
    import subprocess
    import sys

    study = optuna.create_study(study_name="live", storage=sqlite_url)
    trial = study.ask()
    folder = spool.spool_dir(tmp_path, "live")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder), str(trial_id_of(trial))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert holder.stdout.readline().strip() == "kept"
    assert spool.deliver(study, folder) == 0  # held: left to its writer
    assert study.trials[0].state == TrialState.RUNNING and len(spool.kept_in(folder)) == 1
    holder.communicate("\n", timeout=patient(60))  # the writer ends without telling: the lock goes
    assert spool.deliver(study, folder) == 1
    assert study.trials[0].state == TrialState.COMPLETE and study.trials[0].value == 0.25


_HOLDER = """
import sys
from pathlib import Path
from orchestrator.record.spool import spool
spool.keep(Path(sys.argv[1]), spool.Kept(int(sys.argv[2]), 0, "COMPLETE", [0.25]), hold=True)
print("kept", flush=True)
sys.stdin.readline()
"""


def test_a_spool_folder_that_cannot_be_written_is_said_at_start(sqlite_url, tmp_path):
    logs = tmp_path / "logs"
    folder = spool.spool_dir(logs, "blocked")
    folder.parent.mkdir(parents=True)
    folder.write_text("")  # a file where the folder goes: no entry can be written there
    ran = _run(sqlite_url, logs, "blocked", 1)
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "is not writable" in line]
    assert len(said) == 1 and str(folder) in said[0] and "--log-dir" in said[0], ran.stderr
    assert "(a file is in its place)" in said[0], said
