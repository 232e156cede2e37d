"""The test run at a study's end, from the selected trial's final weights where they are the run
it would train again: on a Gymnasium environment the run before the test part is the trial's own
(same environment, same seed), so its kept weights are scored on the test episodes instead of
trained again, and the score is the one training again gives. On a trading market the test run
trains on more prices than the trial saw, so it trains."""

from __future__ import annotations

import optuna
import pytest
import torch

from adapters import dqn, ppo
from orchestrator.record.study.final_scores import final_scores_of
from orchestrator.record.study.spec import load_spec
from tests.cli_helpers import run_cli

CPU = torch.device("cpu")


@pytest.fixture
def one_torch_thread():
    """As a trial process and the run's end train: sums in one order, the same weights."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_gymnasium_study_scores_its_trials_final_weights_as_training_again_would(
    tmp_path, one_torch_thread
):
    url = f"sqlite:///{tmp_path}/s.db"
    done = run_cli(
        "run", "dqn", "--env", "CartPole-v1", "--trials", "2", "--epochs", "2",
        "--option", "steps_per_epoch=800", "--gpus", "none", "--storage", url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="dqn", storage=url)
    scores = final_scores_of(study.user_attrs)
    assert scores is not None and scores.test is not None
    selected = next(t for t in study.trials if t.number == scores.selected_trial)
    assert f"test run of trial #{selected.number}: its final weights" in done.stderr
    assert f"test run of trial #{selected.number}: epoch" not in done.stderr  # nothing trained

    spec = load_spec(study)
    again = dqn.adapter.final_scores(
        selected.params, epochs=spec.epochs, device=CPU, options=spec.options
    )
    assert scores.test == pytest.approx(again["test"], rel=1e-6), (scores.test, again)


class _Kept:
    """A trial's checkpoint handle that keeps every state in memory."""

    def __init__(self) -> None:
        self.saved: dict[int, dict] = {}

    def load(self) -> None:
        return None

    def due(self, epoch: int) -> bool:
        return True

    def save(self, epoch: int, state: dict) -> None:
        self.saved[epoch] = state


def test_ppos_final_weights_score_on_the_test_episodes_as_training_again_would(
    one_torch_thread, monkeypatch
):
    options = {**ppo.adapter.options, "env": "CartPole-v1", "steps_per_epoch": 1024}
    params = dict(ppo.adapter.default_params)
    kept = _Kept()
    ppo.adapter.train(
        params, epochs=2, device=CPU, options=options, report=lambda e, v: None, checkpoint=kept
    )
    updates = []
    update = ppo.update
    monkeypatch.setattr(ppo, "update", lambda *a, **k: updates.append(1) or update(*a, **k))
    scored = ppo.adapter.final_scores(
        params, epochs=2, device=CPU, options=options, final_state=kept.saved[1]
    )
    assert not updates  # scored, not trained
    again = ppo.adapter.final_scores(params, epochs=2, device=CPU, options=options)
    assert updates  # training again updates the network
    assert scored == pytest.approx(again, rel=1e-6)


def test_a_trading_test_run_trains_on_the_validation_part_too_whatever_was_kept():
    options = {**dqn.adapter.options, "steps_per_epoch": 300, "seed": 3}
    params = dict(dqn.adapter.default_params, batch_size=64)
    unusable = {"q_net": "not weights: a test run that read them would fail"}
    kept = dqn.adapter.final_scores(
        params, epochs=1, device=CPU, options=options, final_state=unusable
    )
    trained = dqn.adapter.final_scores(params, epochs=1, device=CPU, options=options)
    assert kept == trained
    assert not dqn.adapter.scores_kept_weights(options)  # so the end reads no weights for it
    assert dqn.adapter.scores_kept_weights({**options, "env": "CartPole-v1"})
