"""`best`: the best trial's parameters as JSON or YAML, to standard output or a file."""

from __future__ import annotations

import json

import pytest
import yaml
from test_status import build_study, run_cli


def test_best_json_and_yaml_give_the_best_parameters(storage_url, capsys):
    built = build_study(storage_url)

    code, out, err = run_cli(capsys, "best", "--study", "demo", "--storage", storage_url)
    assert code == 0
    assert json.loads(out) == built["best_params"]
    assert f"trial #{built['best']}" in err

    code, out, _ = run_cli(
        capsys, "best", "--study", "demo", "--storage", storage_url, "--format", "yaml"
    )
    assert code == 0
    assert yaml.safe_load(out) == built["best_params"]
    assert list(yaml.safe_load(out)) == list(built["best_params"])  # declared order kept


def test_best_writes_a_file(sqlite_url, tmp_path, capsys):
    built = build_study(sqlite_url)
    target = tmp_path / "best.yaml"
    code, out, err = run_cli(
        capsys,
        "best",
        "--study",
        "demo",
        "--storage",
        sqlite_url,
        "--format",
        "yaml",
        "--out",
        str(target),
    )
    assert code == 0 and out == ""
    assert yaml.safe_load(target.read_text()) == built["best_params"]
    assert str(target) in err


@pytest.mark.parametrize("where", ["missing-dir/best.json", "."])
def test_best_to_an_unwritable_place_is_one_line(sqlite_url, tmp_path, capsys, where):
    build_study(sqlite_url, completed=2)
    code, _, err = run_cli(
        capsys, "best", "--study", "demo", "--storage", sqlite_url, "--out", str(tmp_path / where)
    )
    assert code == 2 and err.startswith("error: cannot write") and err.count("\n") == 1


def test_best_without_a_completed_trial_says_so(sqlite_url, capsys):
    build_study(sqlite_url, completed=0)
    code, _, err = run_cli(capsys, "best", "--study", "demo", "--storage", sqlite_url)
    assert code == 2 and "no completed trial" in err
