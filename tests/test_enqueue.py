"""`--enqueue-defaults` and `--enqueue params.yaml`: known-good parameters run first, once per study."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import pytest
import yaml

import adapters
from adapters.synthetic import SyntheticAdapter
from orchestrator.enqueue import DEFAULTS_ORIGIN, ENQUEUED_ATTR, planned_queue
from tests.cli_helpers import run_cli

FAST = (
    "--option", "trial_seconds=0.05", "--epochs", "2", "--concurrency", "1",
    "--gpus", "sim:24576", "--pruner", "none",
)  # fmt: skip


def trials_of(url: str, name: str = "synthetic") -> list:
    return optuna.load_study(study_name=name, storage=url).trials


def test_defaults_run_first_and_only_once_per_study(sqlite_url):
    first = run_cli(
        "run", "synthetic", "--trials", "2", "--enqueue-defaults", "--storage", sqlite_url, *FAST
    )
    assert first.returncode == 0, first.stderr
    trials = trials_of(sqlite_url)
    assert trials[0].params == dict(adapters.get("synthetic").default_params)
    assert trials[0].user_attrs[ENQUEUED_ATTR] == DEFAULTS_ORIGIN
    assert ENQUEUED_ATTR not in trials[1].user_attrs  # the sampler's

    again = run_cli(
        "run", "synthetic", "--trials", "4", "--enqueue-defaults", "--storage", sqlite_url, *FAST
    )
    assert again.returncode == 0, again.stderr
    trials = trials_of(sqlite_url)
    assert len(trials) == 4
    assert [ENQUEUED_ATTR in t.user_attrs for t in trials] == [True, False, False, False]


def test_a_params_file_of_several_sets_runs_them_in_order(sqlite_url, tmp_path):
    sets = [
        {"x": 1.0, "y": -2.0, "learning_rate": 0.001, "batch_size": 512, "activation": "gelu"},
        {"x": 0.5, "activation": "tanh"},  # the rest is drawn by the sampler
    ]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(sets))
    done = run_cli(
        "run", "synthetic", "--trials", "3", "--enqueue", str(path), "--storage", sqlite_url, *FAST
    )
    assert done.returncode == 0, done.stderr
    trials = trials_of(sqlite_url)
    assert trials[0].params == sets[0] and trials[0].value == pytest.approx(0.0)
    assert trials[1].params["x"] == 0.5 and trials[1].params["activation"] == "tanh"
    assert trials[1].user_attrs[ENQUEUED_ATTR] == str(path)
    assert len(trials) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x: [1\n", "is not valid YAML"),
        ("3\n", "must hold a mapping of parameter names to values, or a list of them"),
        ("- x: 1\n- 7\n", "entry 2 is not a mapping"),
        ("xx: 1\n", "no parameter 'xx'; the adapter's parameters: x, y, learning_rate"),
        ("x: 50\n", "x = 50 must be within -5..5"),
        ("activation: swish\n", "activation = 'swish' must be one of 'gelu', 'relu', 'tanh'"),
        ("batch_size: fast\n", "batch_size = 'fast' must be within 64..4096"),
        ("- x: 1\n- x: 2\n- x: 3\n", "3 parameter sets to enqueue but the budget has room for 2"),
    ],
)
def test_a_bad_params_file_is_one_line_and_stores_nothing(tmp_path, capsys, text, expected):
    from orchestrator.cli import main

    path = tmp_path / "params.yaml"
    path.write_text(text)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    code = main(
        ["run", "synthetic", "--trials", "2", "--enqueue", str(path), "--storage", url, *FAST]
    )
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1, err
    if db.exists():  # the storage may be opened, but no study is made
        assert optuna.get_all_study_names(url) == []


def test_a_resumed_study_with_no_room_left_refuses_new_sets(sqlite_url, tmp_path):
    assert (
        run_cli("run", "synthetic", "--trials", "1", "--storage", sqlite_url, *FAST).returncode == 0
    )
    path = tmp_path / "params.yaml"
    path.write_text("x: 1.0\n")
    db = sqlite_url.removeprefix("sqlite:///")
    before = hashlib.sha256(Path(db).read_bytes()).hexdigest()
    done = run_cli("run", "synthetic", "--enqueue", str(path), "--storage", sqlite_url, *FAST)
    assert done.returncode == 2
    assert "raise --trials to 2 or more" in done.stderr and done.stderr.count("\n") == 1
    assert hashlib.sha256(Path(db).read_bytes()).hexdigest() == before


class NoDefaults(SyntheticAdapter):
    default_params = {}


def test_an_adapter_without_defaults_says_what_to_do(tmp_path, capsys):
    from orchestrator.cli import main

    db = tmp_path / "s.db"
    code = main(
        ["run", "--adapter-path", f"{__name__}:NoDefaults", "--enqueue-defaults",
         "--storage", f"sqlite:///{db}", *FAST]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "has no default_params to enqueue: give your own with --enqueue params.yaml" in err
    assert not db.exists()


@pytest.mark.parametrize("name", sorted(adapters.BUILTIN))
def test_every_built_in_adapter_has_defaults_inside_its_search_space(name):
    adapter = adapters.get(name)
    queue = planned_queue(adapter, dict(adapter.options), defaults=True, path=None)
    assert len(queue) == 1
    # every searched parameter has a known-good value, batch size included
    assert set(queue[0].params) == set(adapter.default_params) >= {"batch_size", "learning_rate"}
