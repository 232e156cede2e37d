"""`run` end to end on both databases, resuming, and every kind of bad input."""

from __future__ import annotations

import hashlib
import pathlib

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from orchestrator.cli import main
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.records import TABLE_NAMES, VERSION_TABLE
from tests.cli_helpers import run_cli

FAST = (
    "--option",
    "trial_seconds=0.1",
    "--epochs",
    "2",
    "--concurrency",
    "2",
    "--gpus",
    "sim:24576",
    "--pruner",
    "none",
)


def _states(url: str, name: str) -> list[TrialState]:
    return [
        t.state
        for t in optuna.load_study(study_name=name, storage=StorageLocation.parse(url).url).trials
    ]


def test_run_then_resume_to_a_larger_budget(storage_url):
    first = run_cli("run", "synthetic", "--trials", "6", "--storage", storage_url, *FAST)
    assert first.returncode == 0, first.stderr
    assert "best trial #" in first.stdout
    assert _states(storage_url, "synthetic").count(TrialState.COMPLETE) == 6

    engine = sa.create_engine(StorageLocation.parse(storage_url).url)
    tables = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    assert TABLE_NAMES | {VERSION_TABLE, "alembic_version", "trials", "studies"} <= tables

    again = run_cli("run", "synthetic", "--trials", "8", "--storage", storage_url, *FAST)
    assert again.returncode == 0, again.stderr
    states = _states(storage_url, "synthetic")
    assert states.count(TrialState.COMPLETE) == 8
    assert len(states) == 8  # the same study, resumed: no second study, no extra trials


@pytest.fixture(scope="module")
def stored_template(tmp_path_factory):
    folder = tmp_path_factory.mktemp("template")
    url = f"sqlite:///{folder / 'kept.db'}"
    done = run_cli("run", "synthetic", "--trials", "2", "--storage", url, *FAST)
    assert done.returncode == 0, done.stderr
    return folder / "kept.db"


@pytest.fixture
def stored_study(stored_template, tmp_path):
    """A study with two finished trials, in a database file of this test's own."""
    import shutil

    path = tmp_path / "kept.db"
    shutil.copy(stored_template, path)
    return f"sqlite:///{path}", path


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "nosuchadapter"], "unknown adapter 'nosuchadapter'"),
        (["run", "synthetic", "--trials", "-3"], "--trials -3 must be at least 1"),
        (["run", "synthetic", "--trials", "0"], "--trials 0 must be at least 1"),
        (["run", "synthetic", "--option", "bogus=1"], "has no option 'bogus'"),
        (["run", "synthetic", "--option", "trial_seconds=slow"], "must be a number"),
        (["run", "synthetic", "--option", "noequals"], "is not KEY=VALUE"),
        (["run", "synthetic", "--gpus", "sim:-5"], "more than 0 MB"),
        (["run", "synthetic", "--gpus", "7"], "no GPU 7"),
        (["run", "synthetic", "--trials", "many"], "--trials 'many' is not a whole number"),
        (["worker", "--study", "nosuchstudy"], "no study 'nosuchstudy'"),
        (["run", "synthetic", "--env", "CartPole-v1"], "takes no --env"),
        (["run", "synthetic", "--trials", "1"], "already counts 2 trials"),
        (["run", "synthetic", "--swarm-size", "1"], "at least 2 particles"),
        (["run", "synthetic", "--study", "tiny", "--gpus", "sim:100"], "only 80 MB are usable"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_nothing_changes(stored_study, capsys, args, expected):
    url, path = stored_study
    before = _digest(path)
    assert main([*args, "--storage", url]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert _digest(path) == before


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("sqlite://", "in-memory SQLite"),
        ("nonsense", "is malformed"),
        ("mysql://u@h/d", "names 'mysql'"),
        ("postgresql://alice:s3cret@127.0.0.1:1/studies", "PostgreSQL at 127.0.0.1:1"),
    ],
)
def test_bad_storage_is_one_line_without_the_password(capsys, storage, expected):
    assert main(["run", "synthetic", "--trials", "1", "--storage", storage]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err
    assert "s3cret" not in err
    assert len(err.splitlines()) == 1


def test_a_study_of_another_adapter_is_refused(stored_study, capsys):
    url, path = stored_study
    before = _digest(path)
    assert (
        main(
            [
                "run",
                "synthetic",
                "--adapter-path",
                "adapters.synthetic:SyntheticAdapter",
                "--study",
                "synthetic",
                "--storage",
                url,
            ]
        )
        == 2
    )
    assert "choose another --study name" in capsys.readouterr().err
    assert _digest(path) == before


@pytest.mark.parametrize("sampler", ["tpe", "cmaes"])
def test_optuna_s_own_samplers_can_drive_a_run(sqlite_url, sampler):
    done = run_cli(
        "run",
        "synthetic",
        "--trials",
        "3",
        "--sampler",
        sampler,
        "--seed",
        "1",
        "--storage",
        sqlite_url,
        *FAST,
    )
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(study_name="synthetic", storage=sqlite_url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert study.user_attrs["orchestrator"]["sampler"] == sampler
    for trial in study.trials:  # the plan's bounds hold for Optuna's samplers too
        low, high = trial.user_attrs["batch_bounds"]
        assert low <= trial.params["batch_size"] <= high


def test_a_worker_never_creates_a_database_to_look_for_a_study(tmp_path, capsys):
    path = tmp_path / "nowhere" / "x.db"
    assert main(["worker", "--study", "s", "--storage", f"sqlite:///{path}"]) == 2
    assert "no study database" in capsys.readouterr().err
    assert not path.parent.exists()


def test_optuna_s_samplers_do_not_repeat_themselves_when_a_study_resumes(sqlite_url):
    args = ("--sampler", "random", "--seed", "1", "--storage", sqlite_url, *FAST)
    assert run_cli("run", "synthetic", "--trials", "2", *args).returncode == 0
    assert run_cli("run", "synthetic", "--trials", "4", *args).returncode == 0
    params = [
        tuple(t.params.items())
        for t in optuna.load_study(study_name="synthetic", storage=sqlite_url).trials
    ]
    assert len(params) == 4 and len(set(params)) == 4
