"""`logs --trial N` takes the storage's only study, as `best` does; several need --study."""

from __future__ import annotations

from pathlib import Path

import optuna

from orchestrator.cli import main
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage


def _study_with_a_logged_trial(storage, name: str, text: str) -> None:
    Path(f"{name}-0.log").write_text(text)
    study = optuna.create_study(study_name=name, storage=storage)
    trial = study.ask()
    trial.set_user_attr("log_file", f"{name}-0.log")
    study.tell(trial, 1.0)


def test_logs_takes_the_only_study_and_asks_which_of_several(
    sqlite_url, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    storage = open_storage(StorageLocation.parse(sqlite_url))
    _study_with_a_logged_trial(storage, "alone", "epoch 0: loss 0.5\n")
    assert main(["logs", "--trial", "0", "--storage", sqlite_url]) == 0
    assert capsys.readouterr().out == "epoch 0: loss 0.5\n"

    _study_with_a_logged_trial(storage, "other", "epoch 0: loss 0.7\n")
    assert main(["logs", "--trial", "0", "--storage", sqlite_url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 2 studies (alone, other)" in err, err
    assert "`python -m orchestrator logs --study NAME`" in err
    assert main(["logs", "--trial", "0", "--study", "other", "--storage", sqlite_url]) == 0
    assert capsys.readouterr().out == "epoch 0: loss 0.7\n"
    storage.engine.dispose()
