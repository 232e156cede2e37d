"""The checkpoint contract other parts build on (docs/checkpoints.md), with real trial processes:

- a trial that saves records `checkpoint` = {"artifact_id", "epoch"}, naming its latest;
- `checkpoint_from` = N: training starts from trial N's latest checkpoint, the curve carried over,
  `resumed_from_epoch` recorded; a corrupt one is a fresh start with one line;
- `train_until_epoch` = E: the trial ends COMPLETE after epoch E with the value reported there,
  its checkpoint at E kept;
- `orchestrator.checkpoints.latest(study, n)` finds a trial's latest.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from orchestrator import checkpoints
from orchestrator.record.checkpoints import files as stored
from tests.cli_helpers import run_cli

EPOCHS = 4


def _run(tmp_path: Path, trials: int, *extra: str) -> None:
    done = run_cli(
        "run", "synthetic", "--storage", f"sqlite:///{tmp_path}/s.db", "--trials", str(trials),
        "--epochs", str(EPOCHS), "--option", "trial_seconds=0.1", "--option", "noise=0.5",
        "--gpus", "sim:24576", "--sampler", "random", "-q", *extra, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="synthetic", storage=f"sqlite:///{tmp_path}/s.db")


def _log(trial: optuna.trial.FrozenTrial) -> str:
    return Path(trial.user_attrs["log_file"]).read_text()


def test_a_segment_ends_at_its_epoch_a_copy_goes_on_and_a_corrupt_one_starts_afresh(tmp_path):
    _run(tmp_path, 1)
    study = _study(tmp_path)
    first = study.trials[0]
    params = first.params
    kept = checkpoints.latest(study, 0)  # the best so far keeps its final weights
    assert kept is not None and kept.epoch == EPOCHS - 1
    Path(checkpoints.location(study, kept)).write_bytes(b"PK\x03\x04 cut short")
    study.enqueue_trial(params, user_attrs={"train_until_epoch": 1})
    study.enqueue_trial({**params, "x": 4.0}, user_attrs={"checkpoint_from": 0})
    _run(tmp_path, 3)
    segment, fresh = _study(tmp_path).trials[1:3]
    assert segment.state == optuna.trial.TrialState.COMPLETE
    assert sorted(segment.intermediate_values) == [0, 1]  # epochs 2 and 3 never trained
    assert segment.value == segment.intermediate_values[1]
    assert segment.user_attrs["checkpoint"]["epoch"] == 1
    found = checkpoints.latest(_study(tmp_path), 1)
    assert found is not None and found.epoch == 1 and found.trial == 1
    assert Path(checkpoints.location(_study(tmp_path), found)).is_file()  # kept for its copies

    assert fresh.state == optuna.trial.TrialState.COMPLETE  # the corrupt one: from epoch 0
    assert "resumed_from_epoch" not in fresh.user_attrs
    assert sorted(fresh.intermediate_values) == list(range(EPOCHS))
    log = _log(fresh)
    assert log.count("could not be read") == 1 and "training starts at epoch 0" in log
    assert "Traceback" not in log

    _study(tmp_path).enqueue_trial(params, user_attrs={"checkpoint_from": 1})
    _run(tmp_path, 4)
    copy = _study(tmp_path).trials[3]
    assert copy.user_attrs["resumed_from_epoch"] == 1
    assert sorted(copy.intermediate_values) == [0, 1, 2, 3]  # one continuous curve
    assert copy.intermediate_values[1] == segment.intermediate_values[1]  # carried over
    # The seeded noise goes on from the saved generator: the same curve as an unbroken run.
    assert copy.intermediate_values == pytest.approx(first.intermediate_values)
    assert "resumed from the checkpoint of trial 1 at epoch 1" in _log(copy)


def test_when_a_handle_saves():
    from orchestrator.record.checkpoints.handle import CheckpointHandle

    study = optuna.create_study()
    trial = study.ask()
    every_two = CheckpointHandle(study, trial, store=object(), every=2, until=4)
    assert [e for e in range(6) if every_two.due(e)] == [1, 3, 4, 5]
    never = CheckpointHandle(study, trial, store=object(), every=0)
    assert not any(never.due(e) for e in range(6))
    nowhere = CheckpointHandle(study, trial, store=None, every=1, until=2)
    assert not any(nowhere.due(e) for e in range(6))


def test_latest_follows_a_rerun_that_saved_nothing_back_to_its_source():
    study = optuna.create_study()
    saver = optuna.trial.create_trial(
        value=1.0, user_attrs={"checkpoint": {"artifact_id": "a", "epoch": 4}}
    )
    study.add_trial(saver)
    study.add_trial(optuna.trial.create_trial(value=2.0, user_attrs={"checkpoint_from": 0}))
    assert checkpoints.latest(study, 1) == stored.Checkpoint(0, "a", 4)
    assert checkpoints.latest(study, 1, follow=False) is None


@pytest.mark.parametrize("with_torch", [False, True])
def test_a_checkpoint_file_is_read_back_and_a_foreign_one_refused(with_torch, monkeypatch):
    import sys

    if with_torch:
        import torch

        state = {"weights": torch.arange(4.0), "step": 3}
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        state = {"rng": [3, [1, 2], None], "step": 3}
    epoch, back = stored.decode(stored.encode(2, state))
    assert epoch == 2 and back.keys() == state.keys()
    with pytest.raises(stored.CheckpointUnreadable):
        stored.decode(b"not a checkpoint")
    if with_torch:
        import io
        import pickle

        import torch

        evil = io.BytesIO()  # a file that would run code if unpickled freely
        torch.save({"epoch": 1, "state": {"x": pickle.loads}}, evil)
        with pytest.raises(stored.CheckpointUnreadable):
            stored.decode(evil.getvalue())


def test_an_artifacts_url_with_credentials_is_refused():
    assert "credentials" in stored.location_problem("s3://key:secret@bucket")
    assert stored.location_problem("ftp://host/x") is not None
    assert stored.location_problem("/shared/ckpt") is None
    assert stored.location_problem("s3://bucket") is None


@pytest.mark.parametrize("saving_first", [False, True])
def test_an_optimize_objective_gets_the_handle_and_a_segment_of_it_ends_at_its_epoch(
    sqlite_url, saving_first
):
    import orchestrator
    from tests import checkpoint_objective

    # Saved before its report, the last epoch ends the segment at the next epoch's save.
    objective = (
        checkpoint_objective.objective_saving_first
        if saving_first
        else checkpoint_objective.objective
    )

    def optimize(trials: int) -> optuna.Study:
        return orchestrator.optimize(
            objective, n_trials=trials, storage=sqlite_url, gpus="sim:24576", epochs=3,
            pruner="none", sampler="random", concurrency=1,
        )  # fmt: skip

    study = optimize(1)
    first = study.trials[0]
    assert first.user_attrs["checkpoint"]["epoch"] == 2
    study.enqueue_trial(first.params, user_attrs={"train_until_epoch": 1})
    study = optimize(2)
    segment = study.trials[1]
    assert segment.state == optuna.trial.TrialState.COMPLETE
    assert sorted(segment.intermediate_values) == [0, 1]
    assert segment.value == pytest.approx(first.intermediate_values[1])


def test_a_re_run_drops_what_the_failed_trials_it_replaces_saved(tmp_path):
    from orchestrator.run.trial.checkpoints import _drop_failed_source

    store = stored.open_store(str(tmp_path / "ckpt"))
    study = optuna.create_study()
    (tmp_path / "ckpt" / "a").write_bytes(b"saved by trial 0")
    (tmp_path / "ckpt" / "b").write_bytes(b"saved by trial 2, which completed")
    failed = optuna.trial.TrialState.FAIL
    study.add_trial(optuna.trial.create_trial(state=failed, system_attrs={"artifacts:a": "{}"}))
    study.add_trial(optuna.trial.create_trial(state=failed, user_attrs={"checkpoint_from": 0}))
    study.add_trial(optuna.trial.create_trial(value=1.0, system_attrs={"artifacts:b": "{}"}))
    _drop_failed_source(study, store, 1)  # trial 1 was stopped before its first save
    assert not (tmp_path / "ckpt" / "a").exists()
    _drop_failed_source(study, store, 2)  # a complete trial keeps what it kept
    assert (tmp_path / "ckpt" / "b").exists()
