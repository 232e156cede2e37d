"""Results to trust, through the command line: `run --repeats N --confirm K`, then `best`,
`status` and the dashboard note reading back validation, test, baselines and spread.

Real processes (the CLI, its trial processes) on simulated GPUs, real DQN training on the
synthetic market, with budgets small enough to stay quick; the module's study on PostgreSQL,
the others on SQLite.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import uuid

import optuna
import pytest
from optuna.trial import TrialState

import orchestrator
from orchestrator.record.store.location import StorageLocation
from tests.cli_helpers import cli_env, run_cli

TINY = (
    "--trials", "2", "--epochs", "2", "--option", "steps_per_epoch=200",
    "--gpus", "sim:24576", "--pruner", "none", "--sampler", "random", "--seed", "3",
)  # fmt: skip
# The end of a study (confirmation, test, baselines) trains in the command's own process, with a
# torch thread per core. Beside the suite's other files (two cores, three files at once) two
# threads spinning for each other took up to twice the time and three times the CPU of one.
ONE_THREAD = cli_env(OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def url():
    """One PostgreSQL database for the module's study. The scores are study and trial attributes,
    stored by Optuna alike on every storage; the SQLite path runs in the tests below that make
    studies of their own (a Gymnasium study's scores, a Pareto front's end)."""
    import sqlalchemy as sa

    server = os.environ.get("ORCHESTRATOR_TEST_POSTGRES")
    if not server:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but ORCHESTRATOR_TEST_POSTGRES is unset")
        pytest.skip("ORCHESTRATOR_TEST_POSTGRES is unset")
    name = f"orch_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def ran(url):
    """One study of two trials, each trained on 2 seeds; the top 2 confirmed on 3 seeds."""
    done = run_cli(
        "run", "dqn", "--storage", url, *TINY, "--repeats", "2", "--confirm", "2",
        "--confirm-seeds", "3", "--quiet", timeout=1200, env=ONE_THREAD,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="dqn", storage=StorageLocation.parse(url).url)
    return {"out": done.stdout, "study": study, "url": url}


def test_each_trial_trains_on_every_seed_and_its_value_is_their_mean(ran):
    study = ran["study"]
    assert study.user_attrs["orchestrator"]["repeats"] == 2  # stored with the study
    trials = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(trials) == 2
    for trial in trials:
        values = trial.user_attrs["repeat_values"]
        assert len(values) == 2 and values[0] != values[1]  # two seeds, two different runs
        assert trial.value == pytest.approx(statistics.fmean(values))
        assert trial.user_attrs["repeat_std"] == pytest.approx(statistics.pstdev(values))
        # The pruner saw the mean at each step: the last report is the trial's value.
        assert trial.intermediate_values[max(trial.intermediate_values)] == pytest.approx(
            trial.value
        )


def test_the_study_s_end_confirms_tests_and_scores_the_baselines(ran):
    study = ran["study"]
    scores = study.user_attrs["final_scores"]
    confirmed = scores["confirmed"]
    assert [len(c["values"]) for c in confirmed] == [3, 3]
    by_number = {t.number: t for t in study.trials}
    for entry in confirmed:
        # The two seeds the trial ran on are its own scores; only the third is trained again.
        assert entry["values"][:2] == pytest.approx(
            by_number[entry["trial"]].user_attrs["repeat_values"]
        )
        assert entry["mean"] == pytest.approx(statistics.fmean(entry["values"]))
    assert confirmed[0]["mean"] >= confirmed[1]["mean"]  # ranked again on the mean
    assert scores["selected_trial"] == confirmed[0]["trial"]
    assert len(scores["test_values"]) == 3 and scores["test"] == pytest.approx(
        statistics.fmean(scores["test_values"])
    )
    assert set(scores["baselines"]) == {"buy_and_hold", "flat", "random"}
    assert set(scores["baselines"]["buy_and_hold"]) == {"validation", "test"}
    # The last line puts validation, test and buy-and-hold side by side.
    last = ran["out"].strip().splitlines()[-1]
    hold = scores["baselines"]["buy_and_hold"]
    assert last.startswith("sharpe: validation") and " test " in last
    assert f"buy-and-hold: validation {hold['validation']:.4g}, test {hold['test']:.4g}" in last


def test_best_carries_validation_test_baselines_and_spread(ran):
    done = run_cli("best", "--storage", ran["url"])
    assert done.returncode == 0, done.stderr
    best = json.loads(done.stdout)
    scores = best["final_scores"]
    assert scores == ran["study"].user_attrs["final_scores"]
    assert best["trial"] == scores["selected_trial"]
    assert best["params"] == ran["study"].trials[best["trial"]].params
    assert scores["validation_std"] is not None and scores["test_std"] is not None
    text = run_cli("best", "--storage", ran["url"], "--format", "text").stdout
    assert "test (a part no trial saw, 3 seeds)" in text and "buy-and-hold" in text
    assert " +- " in text  # the spread over seeds
    yaml_out = run_cli("best", "--storage", ran["url"], "--format", "yaml").stdout
    import yaml

    assert yaml.safe_load(yaml_out) == best["params"]  # yaml stays ready for a training run


def test_status_and_the_dashboard_note_show_the_scores(ran):
    from orchestrator.record.study.note import read_study_note

    done = run_cli("status", "--study", "dqn", "--storage", ran["url"])
    assert done.returncode == 0, done.stderr
    assert "test (a part no trial saw, 3 seeds)" in done.stdout
    assert "buy-and-hold" in done.stdout and "+-" in done.stdout
    detail = json.loads(
        run_cli("status", "--study", "dqn", "--storage", ran["url"], "--json").stdout
    )
    assert detail["final_scores"] == ran["study"].user_attrs["final_scores"]
    note = read_study_note(ran["study"])
    assert "| buy-and-hold |" in note and "Confirmed on 3 seeds" in note


def test_a_resume_keeps_the_repeats_and_refuses_other_ones(ran):
    url = ran["url"]
    refused = run_cli("run", "dqn", "--storage", url, *TINY, "--repeats", "3", "--quiet")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--repeats 3 (stored: 2)" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_run_that_finds_the_budget_used_keeps_the_stored_scores(ran):
    before = ran["study"].user_attrs["final_scores"]
    # Python's import log on stderr, from the command and any process it starts: a run with no
    # trial to start and nothing to score starts no trial processes' server and imports no
    # torch for a test run.
    imports = cli_env(PYTHONPROFILEIMPORTTIME="1")
    done = run_cli("run", "dqn", "--storage", ran["url"], "--quiet", timeout=900, env=imports)
    assert done.returncode == 0, done.stderr
    assert _python_processes(done.stderr) == 1, "it started another Python process"
    assert not re.search(r"\| +torch$", done.stderr, re.MULTILINE), "torch was imported"
    fresh = optuna.load_study(study_name="dqn", storage=StorageLocation.parse(ran["url"]).url)
    assert fresh.user_attrs["final_scores"] == before  # not scored again, confirmation kept
    assert fresh.user_attrs["orchestrator"]["repeats"] == 2
    assert done.stdout.strip().splitlines()[-1].startswith("sharpe: validation")


def test_a_worker_that_joins_a_finished_study_starts_no_trial_processes(ran):
    before = len(ran["study"].trials)  # read from the storage each time
    imports = cli_env(PYTHONPROFILEIMPORTTIME="1")
    done = run_cli(
        "worker", "--study", "dqn", "--storage", ran["url"], "--gpus", "sim:24576", "--quiet",
        env=imports,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _python_processes(done.stderr) == 1, "it started another Python process"
    assert len(ran["study"].trials) == before  # it ran nothing


def _python_processes(import_log: str) -> int:
    """How many Python processes wrote `import_log` (PYTHONPROFILEIMPORTTIME): each one that
    starts imports `site` first. A trial processes' server is one, killed at the command's exit
    perhaps before its torch import ends and is logged."""
    return len(re.findall(r"\| +site$", import_log, re.MULTILINE))


def test_best_confirm_scores_the_selection_again_and_stores_it(ran):
    study = ran["study"]
    study.set_user_attr("final_scores", None)
    done = run_cli(
        "best", "--storage", ran["url"], "--confirm", "0", "--format", "text", env=ONE_THREAD
    )
    assert done.returncode == 0, done.stderr
    fresh = optuna.load_study(study_name="dqn", storage=StorageLocation.parse(ran["url"]).url)
    scores = fresh.user_attrs["final_scores"]
    # With --confirm 0 the recommended trial is tested (here the best observed: too few
    # configurations for a model).
    recommended = orchestrator.recommend(fresh).number
    assert scores["confirmed"] == [] and scores["selected_trial"] == recommended
    assert len(scores["test_values"]) == 2  # tested on the study's 2 seeds, as it was run
    assert "baselines:" in done.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--repeats", "0"], "--repeats 0 must be at least 1"),
        (["--repeats", "101"], "--repeats 101 is more than 100"),
        (["--repeats", "x"], "--repeats 'x' is not a whole number"),
        (["--confirm-seeds", "2"], "--confirm-seeds 2 needs --confirm K"),
    ],
)
def test_bad_trust_flags_are_one_line(sqlite_url, args, expected):
    done = run_cli("run", "dqn", "--storage", sqlite_url, *TINY, *args)
    assert done.returncode == 2 and expected in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_repeats_need_an_adapter_with_a_seed(sqlite_url):
    done = run_cli("run", "synthetic", "--storage", sqlite_url, "--repeats", "2")
    assert done.returncode == 2 and "needs an adapter with a `seed` option" in done.stderr
    assert done.stderr.count("\n") == 1


def test_the_report_shows_the_scores(ran, tmp_path):
    done = run_cli("report", "--storage", ran["url"], "--study", "dqn", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "index.html").read_text()
    section = page[page.index('<section id="final-scores">') :]
    hold = ran["study"].user_attrs["final_scores"]["baselines"]["buy_and_hold"]
    assert "<td>buy-and-hold</td>" in section and f"{hold['test']:.4g}" in section


def test_a_study_of_several_objectives_ends_with_its_front(sqlite_url):
    done = run_cli(
        "run", "synthetic", "--objectives", "loss,seconds", "--trials", "3", "--epochs", "1",
        "--storage", sqlite_url, "--gpus", "sim:24576", "--option", "trial_seconds=0.1",
        "--pruner", "none", "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=sqlite_url)
    size = len(study.best_trials)
    last = done.stdout.strip().splitlines()[-1]
    assert "no trial has completed yet" not in done.stdout
    assert last.startswith(f"Pareto front: {size} trial") and "orchestrator best" in last
    assert "final_scores" not in study.user_attrs  # a front has no one trial to test


def test_a_gymnasium_study_ends_with_the_random_policy_beside_it(sqlite_url):
    done = run_cli(
        "run", "ppo", "--env", "CartPole-v1", "--storage", sqlite_url, "--gpus", "sim:24576",
        "--trials", "1", "--epochs", "1", "--option", "steps_per_epoch=512", "--quiet",
        timeout=900, env=ONE_THREAD,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    scores = optuna.load_study(study_name="ppo", storage=sqlite_url).user_attrs["final_scores"]
    assert set(scores["baselines"]) == {"random"} and scores["test"] is not None
    random = scores["baselines"]["random"]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("return: validation") and " test " in last
    assert last.endswith(
        f"; random: validation {random['validation']:.4g}, test {random['test']:.4g}"
    )
