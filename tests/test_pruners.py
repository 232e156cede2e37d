"""Every `--pruner` stops the trials it should, through `run`, on curves chosen per trial."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.record.study.spec import PRUNERS, StudySpec, patience_for, pruner_for
from tests.cli_helpers import cli_env, run_cli

TESTS = Path(__file__).resolve().parent


def run_curves(
    url: str, pruner: str, curves: str, *, epochs: int
) -> list[optuna.trial.FrozenTrial]:
    """`run` on the curves adapter, one trial at a time (so trial numbers follow the plan)."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    done = run_cli(
        "run",
        "--adapter-path",
        "pruning_curves:adapter",
        "--study",
        pruner,
        "--trials",
        str(len(curves)),
        "--epochs",
        str(epochs),
        "--option",
        f"curves={curves}",
        "--pruner",
        pruner,
        "--sampler",
        "random",
        "--seed",
        "0",
        "--concurrency",
        "1",
        "--gpus",
        "sim:24576",
        "--storage",
        url,
        "--quiet",
        env=cli_env(PYTHONPATH=path),
    )
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name=pruner, storage=url)
    assert study.user_attrs["orchestrator"]["pruner"] == pruner
    return sorted(study.trials, key=lambda t: t.number)


def states(trials) -> str:
    return "".join("P" if t.state == TrialState.PRUNED else "C" for t in trials)


def test_median_stops_the_trials_behind_the_median_after_the_warm_up(sqlite_url):
    trials = run_curves(sqlite_url, "median", "gggggwww", epochs=4)
    assert states(trials) == "CCCCCPPP"
    # warm-up is a quarter of the epochs (1): judged at epoch 1, so two values were reported
    assert [len(t.intermediate_values) for t in trials[5:]] == [2, 2, 2]


def test_halving_keeps_the_best_third_at_each_rung(sqlite_url):
    trials = run_curves(sqlite_url, "halving", "gggwww", epochs=4)
    assert states(trials) == "CCCPPP"
    assert all(len(t.intermediate_values) == 2 for t in trials[3:])  # the first rung: epoch 1


def test_hyperband_prunes_bad_trials_and_keeps_good_ones(sqlite_url):
    trials = run_curves(sqlite_url, "hyperband", "ggggggwwwwww", epochs=9)
    assert states(trials[:6]) == "CCCCCC"
    pruned = [t for t in trials[6:] if t.state == TrialState.PRUNED]
    assert pruned, states(trials)
    assert all(len(t.intermediate_values) < 9 for t in pruned)


def test_patient_waits_while_a_bad_trial_still_improves(sqlite_url):
    # w trials sit behind the median but improve every epoch: the median rule would stop them,
    # the patient one does not; r trials get worse, and are stopped.
    trials = run_curves(sqlite_url, "patient", "gggggwwrr", epochs=6)
    assert states(trials) == "CCCCCCCPP"
    assert patience_for(6) == 1


def test_wilcoxon_stops_a_trial_consistently_worse_than_the_best(sqlite_url):
    trials = run_curves(sqlite_url, "wilcoxon", "ggww", epochs=6)
    assert states(trials) == "CCPP"
    # four worse epochs in a row make the one-sided signed-rank p 1/16, under 0.1
    assert [len(t.intermediate_values) for t in trials[2:]] == [4, 4]


def test_none_runs_every_trial_to_the_end(sqlite_url):
    trials = run_curves(sqlite_url, "none", "gww", epochs=3)
    assert states(trials) == "CCC"
    assert all(len(t.intermediate_values) == 3 for t in trials)


@pytest.mark.parametrize("pruner", PRUNERS)
def test_every_pruner_is_built_from_the_stored_settings(pruner):
    built = pruner_for(
        StudySpec(adapter="synthetic", trials=1, epochs=27, direction="minimize", pruner=pruner)
    )
    expected = {
        "median": optuna.pruners.MedianPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "halving": optuna.pruners.SuccessiveHalvingPruner,
        "patient": optuna.pruners.PatientPruner,
        "wilcoxon": optuna.pruners.WilcoxonPruner,
        "none": optuna.pruners.NopPruner,
    }[pruner]
    assert type(built) is expected
    if pruner == "hyperband":  # the resource is the epochs: 1 up to the study's 27
        assert (built._min_resource, built._max_resource) == (1, 27)
        assert built._reduction_factor == 3


def test_an_unknown_stored_pruner_is_one_clear_error():
    from orchestrator.errors import UserError

    spec = StudySpec(adapter="synthetic", trials=1, epochs=3, direction="minimize", pruner="asha")
    with pytest.raises(UserError, match="--pruner median"):
        pruner_for(spec)
