"""`--config` files for run and worker, `--version`, and `best`/`report` without `--study`."""

from __future__ import annotations

import json
from importlib.metadata import version

import optuna
import pytest
from test_status import build_study
from test_status import run_cli as run_in_process

from tests.cli_helpers import run_cli

FAST_TOML = """
adapter = "synthetic"
trials = 4
epochs = 2
gpus = "sim:24576"
concurrency = 2
pruner = "none"
sampler = "random"
seed = 3

[options]
trial_seconds = 0.05
overhead_mb = 700
"""


def test_a_toml_file_holds_runs_options_and_flags_override_it(tmp_path):
    config = tmp_path / "study.toml"
    config.write_text(FAST_TOML)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    done = run_cli(
        "run", "--config", str(config), "--trials", "3", "--option", "overhead_mb=800",
        "--storage", url, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trials"] == 3  # the flag, not the file's 4
    study = optuna.load_study(study_name="synthetic", storage=url)
    spec = study.user_attrs["orchestrator"]
    assert (spec["trials"], spec["epochs"], spec["pruner"], spec["sampler"], spec["seed"]) == (
        3, 2, "none", "random", 3,
    )  # fmt: skip
    # the file's options, with the option typed on the command line replacing its own
    assert spec["options"]["trial_seconds"] == 0.05 and spec["options"]["overhead_mb"] == 800.0
    assert {t.user_attrs["vram_planned_mb"] for t in study.trials} <= {
        round(800 + 0.02 * t.params["batch_size"], 1) for t in study.trials
    }


def test_a_yaml_file_names_the_study_a_worker_joins(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    config = tmp_path / "study.toml"
    config.write_text(FAST_TOML.replace("trials = 4", "trials = 2"))
    assert run_cli("run", "--config", str(config), "--storage", url, "-q").returncode == 0
    worker = tmp_path / "worker.yaml"
    worker.write_text(f"study: synthetic\nstorage: {url}\ngpus: sim:12288\njson: true\n")
    joined = run_cli("worker", "--config", str(worker))
    assert joined.returncode == 0, joined.stderr
    assert json.loads(joined.stdout)["counted"] == 2  # the study was already done: it says so


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("s.toml", "trails = 4\n", "unknown key 'trails'; valid keys: adapter, adapter_path,"),
        ("s.yaml", "gpu: sim:100\n", "unknown key 'gpu'; valid keys:"),
        ("s.toml", 'trials = "many"\n', "trials = 'many': --trials 'many' is not a whole number"),
        ("s.toml", 'pruner = "asha"\n', "pruner = 'asha' is not one of: median, hyperband"),
        ("s.toml", "json = 1\n", "json = 1 must be true or false"),
        ("s.toml", "fuse = true\n", "s.toml: fuse = true: --fuse 'true' is not a whole"),
        ("s.yaml", "concurrency: false\n", "concurrency = false: --concurrency 'false' is not"),
        ("s.toml", "trials = [1, 2]\n", "trials must be a single value"),
        ("s.toml", "options = 3\n", "options must be a table of KEY = VALUE"),
        ("s.toml", "trials = \n", "is not valid TOML"),
        ("s.yaml", "trials: [\n", "is not valid YAML"),
        ("s.yaml", "- trials\n", "must hold a mapping of option names to values"),
        ("s.ini", "trials=1\n", "name a .toml, .yaml or .yml file"),
    ],
)
def test_a_bad_config_file_is_one_line_and_stores_nothing(tmp_path, capsys, name, text, expected):
    from orchestrator.cli import main

    config = tmp_path / name
    config.write_text(text)
    db = tmp_path / "never.db"
    code = main(["run", "synthetic", "--config", str(config), "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err and err.count("\n") == 1, err
    assert not db.exists()


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["worker", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "cannot read --config" in err and "nope.toml" in err and err.count("\n") == 1


def test_a_worker_without_a_study_says_how_to_name_one(capsys):
    from orchestrator.cli import main

    assert main(["worker"]) == 2
    assert "--study NAME" in capsys.readouterr().err


def test_version_comes_from_the_package_metadata():
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"gpu-study-orchestrator {version('gpu-study-orchestrator')}"


def test_best_and_report_take_the_only_study_without_study(sqlite_url, tmp_path, capsys):
    built = build_study(sqlite_url, "only", completed=3)
    code, out, _ = run_in_process(capsys, "best", "--storage", sqlite_url)
    assert code == 0 and json.loads(out)["params"] == built["best_params"]
    code, out, _ = run_in_process(
        capsys, "report", "--storage", sqlite_url, "--out", str(tmp_path / "r")
    )
    assert code == 0 and "report of 'only'" in out

    build_study(sqlite_url, "second", completed=1)
    for command in (["best"], ["report", "--out", str(tmp_path / "r2")]):
        code, _, err = run_in_process(capsys, *command, "--storage", sqlite_url)
        assert code == 2 and err.count("\n") == 1
        assert "holds 2 studies (only, second): choose one with" in err
        assert f"`python -m orchestrator {command[0]} --study NAME`" in err
