"""`--intensify N`: N of the budget's trials re-run the recommended trial, on the next seeds.

The schedule is pure arithmetic; the re-runs are queued by real hosts: two `run` processes on
one PostgreSQL study, each with its own trial processes on a simulated GPU, so the count under
the budget lock is what keeps the re-runs at N across both.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.intensify import owed_now, schedule
from orchestrator.record.study.spec import BudgetCount, count_trials
from tests.cli_helpers import run_cli, start_cli

ADAPTER = "tests.intensify_adapter:adapter"


def test_the_re_runs_are_spread_over_the_second_half():
    assert schedule(24, 4) == [12, 14, 16, 19]
    assert schedule(10, 1) == [5]
    assert all(point >= 1 for point in schedule(4, 3))  # more than half: from the first trial on


def test_what_is_owed_follows_the_claims_and_never_passes_n_or_the_budget():
    at = lambda claimed, running=0: BudgetCount(complete=claimed - running, running=running)  # noqa: E731
    assert owed_now(24, 4, 0, at(11)) == 0  # the first half is the search's
    assert owed_now(24, 4, 0, at(12)) == 1
    assert owed_now(24, 4, 1, at(15, running=2)) == 1  # the one at 14
    assert owed_now(24, 4, 4, at(20)) == 0  # all four queued
    assert owed_now(24, 4, 2, at(22)) == 2  # room for no more than the re-runs owed: all now
    assert owed_now(24, 4, 2, at(23)) == 1  # room for one: one
    assert owed_now(24, 4, 2, at(24)) == 0  # the budget is claimed


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--intensify", "-1"], "--intensify -1 must be at least 0"),
        (["--intensify", "10"], "--intensify 10 must be less than the budget of 10 trials"),
        (["--intensify", "2", "--objectives", "loss,seconds"], "needs a study of one"),
    ],
)
def test_bad_values_are_one_line_and_store_nothing(sqlite_url, tmp_path, args, expected):
    done = run_cli(
        "run", "synthetic", "--storage", sqlite_url, "--trials", "10", "--gpus", "sim:24576",
        *args,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "study.db").exists() or not optuna.get_all_study_names(sqlite_url)


def test_the_python_api_refuses_more_re_runs_than_the_budget():
    import orchestrator
    from tests.api_objective import objective

    with pytest.raises(ValueError, match="intensify=5 must be less than the budget of 3"):
        orchestrator.optimize(objective, n_trials=3, intensify=5, storage="sqlite://")


def test_two_hosts_queue_exactly_n_re_runs_of_the_recommended_trial(postgres_url):
    common = (
        "--adapter-path", ADAPTER, "--study", "intense", "--storage", postgres_url,
        "--trials", "24", "--intensify", "4", "--epochs", "1", "--gpus", "sim:24576",
        "--concurrency", "2", "--pruner", "none", "--seed", "5", "--quiet",
    )  # fmt: skip
    first = start_cli("run", *common)
    second = run_cli("run", *common, timeout=900)
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    study = optuna.load_study(study_name="intense", storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 24  # the budget, re-runs inside it
    reruns = [t for t in trials if "intensify_of" in t.user_attrs]
    assert len(reruns) == 4, [(t.number, t.user_attrs.get("intensify_of")) for t in trials]
    by_number = {t.number: t for t in trials}
    for rerun in reruns:
        assert rerun.state == TrialState.COMPLETE
        original = by_number[rerun.user_attrs["intensify_of"]]
        assert rerun.params == original.params and rerun.number > original.number
        assert rerun.number >= 10  # in the second half (a claim or two ahead at most)
        offset = rerun.user_attrs["seed_offset"]
        assert offset >= 1
        same = [t for t in trials if t.params == rerun.params and t.number != rerun.number]
        assert all(t.value != rerun.value for t in same)  # another seed: another draw
    offsets = {}
    for rerun in reruns:
        key = tuple(sorted(rerun.params.items()))
        assert rerun.user_attrs["seed_offset"] not in offsets.setdefault(key, set())
        offsets[key].add(rerun.user_attrs["seed_offset"])


def test_a_re_run_that_runs_out_of_memory_is_retried_on_its_own_seeds(sqlite_url, tmp_path):
    from tests.intensify_adapter import seeded_value

    done = run_cli(
        "run", "--adapter-path", ADAPTER, "--study", "oom", "--storage", sqlite_url,
        "--trials", "8", "--intensify", "1", "--epochs", "1", "--gpus", "sim:24576",
        "--concurrency", "1", "--pruner", "none", "--seed", "5", "--quiet",
        "--option", f"oom_marker={tmp_path / 'oom'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = optuna.load_study(study_name="oom", storage=sqlite_url).get_trials(deepcopy=False)
    count = count_trials(trials)
    assert (count.complete, count.retried, len(trials)) == (8, 1, 9)  # the retry is in the budget
    (rerun,) = [t for t in trials if "intensify_of" in t.user_attrs]
    assert rerun.state == TrialState.FAIL and rerun.user_attrs.get("oom")
    (retry,) = [t for t in trials if t.user_attrs.get("retry_of") == rerun.number]
    assert retry.state == TrialState.COMPLETE
    offset = retry.user_attrs.get("seed_offset")
    assert offset == rerun.user_attrs["seed_offset"] >= 1
    options = {"noise": 1.0, "seed": offset}
    assert retry.value == seeded_value(retry.params, options)  # trained on the re-run's seeds
    assert retry.value != seeded_value(retry.params, {**options, "seed": 0})
