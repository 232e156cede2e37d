"""Which final weights a study keeps: those of its leaders (the best configurations by its model,
and the best observed trial), so the trial `best` recommends has its weights whichever it is,
and the disk holds a few files however many trials ran (run/trial/checkpoints.py)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

import orchestrator
from orchestrator.record.checkpoints import files as stored
from orchestrator.run.trial import checkpoints
from orchestrator.run.trial.checkpoints import BEST_WEIGHTS_ATTR, KEPT_WEIGHTS_PREFIX, leaders
from samplers import ranked, recommend
from tests.cli_helpers import run_cli

optuna.logging.set_verbosity(optuna.logging.ERROR)

SPACE = {"x": FloatDistribution(-1, 1), "y": FloatDistribution(-1, 1)}


def _noisy_trials(seed: int, n: int = 40, noise: float = 0.5) -> list:
    """Completed trials of a noisy bowl: the luckiest draw is rarely the model's best."""
    rng = np.random.default_rng(seed)
    trials = []
    for number in range(n):
        x, y = rng.uniform(-1, 1, 2)
        value = (x - 0.3) ** 2 + (y + 0.2) ** 2 + noise * rng.standard_normal()
        trial = create_trial(params={"x": x, "y": y}, distributions=SPACE, value=float(value))
        trial.number = number
        trials.append(trial)
    return trials


def test_the_leaders_are_the_models_best_three_and_the_luckiest_draw():
    for seed in range(4):
        trials = _noisy_trials(seed)
        kept = leaders(trials, ["minimize"])
        by_model = [t.number for t, _ in ranked(trials, ["minimize"])[:3]]
        luckiest = min(trials, key=lambda t: t.value).number
        assert kept == {*by_model, luckiest}
    # Seed 1's luckiest draw is not the model's best: both keep their weights.
    trials = _noisy_trials(1)
    luckiest = min(trials, key=lambda t: t.value).number
    assert ranked(trials, ["minimize"])[0][0].number != luckiest
    assert luckiest in leaders(trials, ["minimize"])


def test_too_few_for_a_model_several_objectives_and_nothing_complete():
    few = _noisy_trials(0, n=6)
    by_value = sorted(few, key=lambda t: t.value)
    assert leaders(few, ["minimize"]) == {t.number for t in by_value[:3]}
    assert leaders(few, ["maximize"]) == {t.number for t in by_value[-3:]}
    assert leaders(few, ["minimize", "minimize"]) == set()
    assert leaders([], ["minimize"]) == set()


@dataclass
class _Handle:
    """What `tidy` reads of a trial's checkpoint handle."""

    _store: object
    saved: list = field(default_factory=list)
    until: int | None = None
    unnamed: list = field(default_factory=list)
    source: int | None = None


def _saved(store: FileSystemArtifactStore, folder: Path, name: str) -> str:
    store.write(name, io.BytesIO(b"weights"))
    assert (folder / name).is_file()
    return name


def test_a_trial_that_leaves_the_leaders_loses_its_weights_and_a_leader_keeps_its_own(tmp_path):
    folder = tmp_path / "artifacts"
    folder.mkdir()
    store = FileSystemArtifactStore(str(folder))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
    storage, study_id = study._storage, study._study_id
    trials = _noisy_trials(1)
    # Earlier trials kept their weights: the old rule's best (under its one key) and two more.
    old = {n: _saved(store, folder, f"w{n}") for n in (3, 5, 7)}
    storage.set_study_system_attr(study_id, BEST_WEIGHTS_ATTR, {"trial": 3, "artifact_id": "w3"})
    for n in (5, 7):
        storage.set_study_system_attr(study_id, f"{KEPT_WEIGHTS_PREFIX}{n}", old[n])
    top = ranked(trials, ["minimize"])[0][0].number
    for t in trials[:-1]:
        study.add_trial(t)
    # A trial told elsewhere a moment ago, not in this process's view yet: never judged.
    storage.set_study_system_attr(
        study_id, f"{KEPT_WEIGHTS_PREFIX}99", _saved(store, folder, "w99")
    )

    # The last trial ends: it is kept only if it is a leader; non-leaders lose theirs.
    last = trials[-1]
    study.add_trial(last)
    mine = _saved(store, folder, "mine")
    handle = _Handle(store, saved=[stored.Checkpoint(last.number, mine, 3)])
    checkpoints.tidy(study, study.trials[-1], handle, "COMPLETE", requeued=False)

    kept = leaders(study.trials, ["minimize"])
    assert top in kept
    on_disk = {p.name for p in folder.iterdir()}
    for n in (3, 5, 7):
        assert (f"w{n}" in on_disk) == (n in kept)
    assert ("mine" in on_disk) == (last.number in kept)
    assert "w99" in on_disk
    attrs = study._storage.get_study_system_attrs(study_id)
    assert attrs.get(f"{KEPT_WEIGHTS_PREFIX}{last.number}") == (
        "mine" if last.number in kept else None
    )
    for n in (5, 7):
        assert attrs[f"{KEPT_WEIGHTS_PREFIX}{n}"] == (old[n] if n in kept else None)
    assert (attrs[BEST_WEIGHTS_ATTR] is None) == (3 not in kept)


def test_a_study_keeps_its_leaders_final_weights_and_best_names_the_recommended_ones(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    done = run_cli(
        "run", "synthetic", "--storage", url, "--trials", "14", "--epochs", "2",
        "--option", "trial_seconds=0", "--option", "noise=0.6", "--gpus", "sim:24576",
        "--sampler", "random", "--seed", "3", "--concurrency", "1", "-q", cwd=tmp_path,
    )  # fmt: skip
    # One trial at a time: two ending at once may each judge the leaders on a view without the
    # other, and the disk then holds one file more than the rule until the next trial's end.
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=url)
    kept = leaders(study.trials, ["minimize"])
    assert 3 <= len(kept) <= 4
    by_trial = {t.number: t.user_attrs["checkpoint"]["artifact_id"] for t in study.trials}
    files = {p.name for p in (tmp_path / "s-artifacts").iterdir()}
    assert files == {by_trial[n] for n in kept}, (files, kept)

    shown = json.loads(run_cli("best", "--storage", url, cwd=tmp_path).stdout)
    chosen = recommend(study)
    assert shown["trial"] == chosen.number
    assert Path(shown["weights"]).name == by_trial[chosen.number]
    saved = orchestrator.load_checkpoint(shown["weights"])
    assert saved["epoch"] == 1  # the last of 2 epochs: its final weights
